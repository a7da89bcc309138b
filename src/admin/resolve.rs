//! `POST /admin/keys/{client_id}/{key}/resolve` — an operator settles a key whose outcome
//! is unknown, after finding out (from the provider) what happened:
//!
//! - `{"status": 201, "headers": {"content-type": "application/json"}, "body": "…"}` stores
//!   that as the key's answer: retries replay it, for the route's retention;
//! - `{"release": true}` frees the key: the next retry executes.
//!
//! Only an unresolved key can be resolved — in progress with its lease run out; a live
//! lease (someone is working on it) or a completed key gets `409` saying which. The write
//! is fenced by the lease token the operator's lookup saw, so a takeover racing the
//! resolution wins or loses as a whole. Every resolution logs one audit line: who (the
//! token's name), which key (its hash), what.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use super::error::AdminError;
use super::json;
use crate::body::ProxyBody;
use crate::config::DEFAULT_RETENTION;
use crate::proxy::Proxy;
use crate::store::{Completion, Fence, Fenced, Inspect, KeyState, KeyStore, StoredResponse};
use crate::stored::encode_block;

/// Largest resolution body accepted.
const MAX_BODY: usize = 4 << 20;

/// What the operator says happened.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resolution {
    status: Option<u16>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    body: String,
    release: Option<bool>,
}

/// Handles the request for `rest` (`{client_id}/{key}`, percent-encoded): reads its body
/// and resolves the key.
pub(super) async fn request<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    rest: &str,
    who: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let Some((client, key)) = rest.split_once('/') else {
        return AdminError::NotFound(
            "Use POST /admin/keys/{client_id}/{key}/resolve, each percent-encoded.".into(),
        )
        .into_response();
    };
    let (Ok(client), Ok(key)) = (decode(client), decode(key)) else {
        return AdminError::BadPath("The client id and key must be percent-encoded UTF-8.".into())
            .into_response();
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return bad(&format!(
                "The body could not be read, or is larger than {MAX_BODY} bytes."
            ));
        }
    };
    // The audit line names the key by its hash as the client sent it, as every line does.
    let logged = crate::key::key_hash(&client, &key);
    let key = stored_key(proxy, &client, key).await;
    resolve(proxy, &client, &key, &logged, &body, who).await
}

/// The store's key for the one an operator gave: the client's key — hashed, when the
/// store keeps keys hashed (`encryption.hash_keys`) — or, when no row has that and it is
/// shaped like one, the stored form itself, as copied from `/admin/stuck`.
pub(super) async fn stored_key<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    client: &str,
    key: String,
) -> String {
    let form = proxy.key_form();
    if !form.is_hashed() {
        return key;
    }
    let hashed = form.stored(client, key.clone());
    if crate::key::KeyForm::looks_stored(&key)
        && !matches!(proxy.store().lookup(client, &hashed).await, Ok(Some(_)))
    {
        return key;
    }
    hashed
}

/// Resolves `(client, key)` (the stored key; `logged`, its hash in log lines) as `body` says;
/// `who` names the operator in the audit line.
async fn resolve<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    client: &str,
    key: &str,
    logged: &str,
    body: &Bytes,
    who: &str,
) -> Response<ProxyBody> {
    let resolution: Resolution = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return bad(&format!(
                "The body is not a resolution ({e}). Send {{\"status\": 201, \"headers\": {{…}}, \"body\": \"…\"}} or {{\"release\": true}}."
            ));
        }
    };
    let answer = match (&resolution.status, resolution.release) {
        (Some(_), Some(true)) => {
            return bad(
                "Send either an answer (status, headers, body) or {\"release\": true}, not both.",
            );
        }
        (None, Some(true)) => None,
        (Some(status), None | Some(false)) => match answer(*status, &resolution) {
            Ok(a) => Some(a),
            Err(detail) => return bad(&detail),
        },
        (None, _) => {
            return bad(
                "Send an answer ({\"status\": 201, \"headers\": {…}, \"body\": \"…\"}) or {\"release\": true}.",
            );
        }
    };
    match apply(proxy, client, key, logged, answer, who).await {
        Ok(done) => json(
            StatusCode::OK,
            &serde_json::json!({ "resolved": done.what, "replayed_for_seconds": done.kept_seconds }),
        ),
        Err(e) => e.into_response(),
    }
}

/// What a resolution did: `stored status 201` or `released`, and for how long the stored
/// answer is replayed.
pub(super) struct Resolved {
    pub what: String,
    pub kept_seconds: Option<u64>,
}

/// Settles the unresolved key `(client, key)` (the stored key; `logged`, its hash in log
/// lines) with `answer`, or releases it (`None`), fenced by the lease token its row has now;
/// logs the audit line naming `who`. The admin API and the console both resolve through
/// here.
pub(super) async fn apply<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    client: &str,
    key: &str,
    logged: &str,
    answer: Option<StoredResponse>,
    who: &str,
) -> Result<Resolved, AdminError> {
    let store = proxy.store();
    let row = match store.lookup(client, key).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            return Err(AdminError::NoSuchKey("No row for this client id and key: nothing to resolve (a retry would execute it afresh).".into()));
        }
        Err(e) => return Err(store_unavailable(&e)),
    };
    if row.state == KeyState::Done {
        return Err(AdminError::NotUnresolved(
            "The key is completed: its answer is replayed. Nothing to resolve (evict it to let the next request execute).".into(),
        ));
    }
    if let KeyState::InProgress { .. } = row.state {
        return Err(AdminError::NotUnresolved(
            "The key's lease is live: a worker is executing it now. Only a key whose lease ran out can be resolved; look again once it has.".into(),
        ));
    }
    let retention = retention_of(proxy, &row.route);
    let fence = Fence {
        client_id: client.to_owned(),
        key: key.to_owned(),
        token: row.lease_token,
        notify: true,
        retention,
    };
    let what = match &answer {
        Some(a) => format!("stored status {}", a.status),
        None => "released".to_owned(),
    };
    let kept_seconds = answer.as_ref().map(|_| retention.as_secs());
    let written = match answer {
        // Sealed like any other answer when encryption is on.
        Some(a) => {
            let a = match proxy.vault() {
                Some(vault) => vault.seal(&fence.client_id, &fence.key, fence.token, &a),
                None => a,
            };
            store.complete(&fence, &Completion::Stored(a)).await
        }
        None => store.release(&fence).await,
    };
    match written {
        Ok(Fenced::Applied) => {
            tracing::warn!(
                operator = %who,
                key = %logged,
                route = %row.route,
                resolution = %what,
                "unresolved key resolved by an operator"
            );
            Ok(Resolved { what, kept_seconds })
        }
        Ok(Fenced::Refused) => Err(AdminError::NotUnresolved(
            "The key changed while it was being resolved (taken over, completed or evicted); look it up again.".into(),
        )),
        Err(e) => Err(store_unavailable(&e)),
    }
}

/// How long a route keeps its answers (the default for a route no longer configured).
pub(super) fn retention_of<S: KeyStore>(proxy: &Proxy<S>, route: &str) -> std::time::Duration {
    proxy
        .routes()
        .named(route)
        .map_or(DEFAULT_RETENTION, |r| r.policy.retention)
}

fn store_unavailable(e: &crate::store::StoreError) -> AdminError {
    tracing::warn!(cause = %e, "admin request: store unavailable");
    AdminError::StoreUnavailable("The idempotency store cannot be reached.".into())
}

/// The stored answer the resolution describes, or what is wrong with it.
fn answer(status: u16, r: &Resolution) -> Result<StoredResponse, String> {
    stored_answer(status, r.headers.iter(), &r.body)
}

/// An operator's answer as the store keeps it, or what is wrong with it (the API's JSON and
/// the console's form both give one).
pub(super) fn stored_answer<'a>(
    status: u16,
    given: impl Iterator<Item = (&'a String, &'a String)>,
    body: &str,
) -> Result<StoredResponse, String> {
    if !(100..=599).contains(&status) {
        return Err(format!(
            "`status` {status} is not an HTTP status (100–599)."
        ));
    }
    let mut headers = http::HeaderMap::new();
    for (name, value) in given {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not a header name."))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of `{name}` is not a valid header value."))?;
        headers.append(name, value);
    }
    Ok(StoredResponse::clear(
        status,
        encode_block(headers.iter()),
        Bytes::copy_from_slice(body.as_bytes()),
    ))
}

fn bad(detail: &str) -> Response<ProxyBody> {
    AdminError::BadResolution(detail.to_owned()).into_response()
}

/// A path segment, percent-decoded as UTF-8.
pub(super) fn decode(segment: &str) -> Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(|s| s.into_owned())
}
