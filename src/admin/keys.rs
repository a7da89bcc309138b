//! The key admin API: where a key stands (`GET /admin/keys/{client_id}/{key}`), evicting
//! it (`DELETE`), and the unresolved keys a page at a time (`GET /admin/stuck`). Evicting
//! is also the console's, through [`evict`], which writes the audit line.

use http::{Method, Response, StatusCode};

use super::error::AdminError;
use super::view::KeyView;
use super::{json, not_allowed, store_failed};
use crate::body::ProxyBody;
use crate::proxy::Proxy;
use crate::store::{Inspect, KeyStore, PageMark, Reseal};

/// Most rows `/admin/stuck` returns.
const MAX_STUCK: i64 = 1000;

/// Answers `/admin/stuck` and `/admin/keys/…` (resolve and rekey are answered before).
pub(super) async fn api<S: KeyStore + Inspect + Reseal>(
    proxy: &Proxy<S>,
    method: &Method,
    path: &str,
    query: Option<&str>,
    who: &str,
) -> Response<ProxyBody> {
    let store = proxy.store();
    if path == "/admin/stuck" && method != Method::GET {
        return not_allowed("GET");
    }
    if path == "/admin/stuck" {
        let param = |name: &str| {
            query.and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            })
        };
        let limit = param("limit")
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(100)
            .clamp(1, MAX_STUCK);
        let after = match param("after") {
            None => None,
            Some(token) => match PageMark::decode(&token) {
                Some(mark) => Some(mark),
                None => {
                    return AdminError::BadQuery(
                        "`after` must be the `next` of an earlier /admin/stuck answer.".into(),
                    )
                    .into_response();
                }
            },
        };
        return match store.stuck(after.as_ref(), limit).await {
            Ok(rows) => {
                // A full page may have more after it; `next` continues from its last key.
                let next = (rows.len() as i64 == limit)
                    .then(|| rows.last().map(|r| r.mark.encode()))
                    .flatten();
                json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "keys": rows.iter().map(|r| KeyView::new(&r.record, reconciled(proxy, &r.record))).collect::<Vec<_>>(),
                        "next": next,
                    }),
                )
            }
            Err(e) => store_failed(&e),
        };
    }
    let Some(rest) = path.strip_prefix("/admin/keys/") else {
        return AdminError::NotFound(
            "Admin endpoints: /admin/keys/{client_id}/{key}, /admin/stuck, /admin/rekey.".into(),
        )
        .into_response();
    };
    let mut parts = rest.splitn(2, '/');
    let (Some(client), Some(key)) = (parts.next(), parts.next()) else {
        return AdminError::NotFound(
            "Use /admin/keys/{client_id}/{key}, each percent-encoded.".into(),
        )
        .into_response();
    };
    let (Ok(client), Ok(key)) = (super::resolve::decode(client), super::resolve::decode(key))
    else {
        return AdminError::BadPath("The client id and key must be percent-encoded UTF-8.".into())
            .into_response();
    };
    // Log lines name the clear key's hash, as the request path's do.
    let logged = crate::key::key_hash(&client, &key);
    let key = super::resolve::stored_key(proxy, &client, key).await;
    match *method {
        Method::GET => match store.lookup(&client, &key).await {
            Ok(Some(record)) => json(
                StatusCode::OK,
                &KeyView::new(&record, reconciled(proxy, &record)),
            ),
            Ok(None) => AdminError::NoSuchKey(
                "No row for this client id and key (never seen, released, evicted or swept)."
                    .into(),
            )
            .into_response(),
            Err(e) => store_failed(&e),
        },
        Method::DELETE => match evict(proxy, &client, &key, &logged, who).await {
            Ok(true) => json(StatusCode::OK, &serde_json::json!({ "evicted": true })),
            Ok(false) => AdminError::NoSuchKey("Nothing to evict.".into()).into_response(),
            Err(e) => e.into_response(),
        },
        _ => not_allowed("GET, DELETE"),
    }
}

/// Deletes `(client, key)` (the stored key; `logged`, its hash) whatever its state, and
/// logs the audit line naming `who`; whether it existed. The API and the console evict
/// through here.
pub(super) async fn evict<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    client: &str,
    key: &str,
    logged: &str,
    who: &str,
) -> Result<bool, AdminError> {
    match proxy.store().evict(client, key).await {
        Ok(existed) => {
            if existed {
                tracing::warn!(operator = %who, key = %logged, "key evicted by an operator");
            }
            Ok(existed)
        }
        Err(e) => {
            tracing::warn!(cause = %e, "admin request: store unavailable");
            Err(AdminError::StoreUnavailable(
                "The idempotency store cannot be reached.".into(),
            ))
        }
    }
}

/// Whether the reconciler is on and the key's route has a recovery probe to ask.
pub(super) fn reconciled<S: KeyStore>(proxy: &Proxy<S>, record: &crate::store::KeyRecord) -> bool {
    let config = proxy.config();
    config.reconcile.is_some()
        && proxy
            .routes()
            .named(&record.route)
            .is_some_and(|r| r.policy.recovery_probe.is_some())
}
