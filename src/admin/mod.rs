//! The admin listener: health, readiness, metrics, and the key admin API — so that an
//! operator never has to open `psql` at 3 a.m.
//!
//! - `GET /healthz` — the process is up.
//! - `GET /readyz` — taking requests, and the store answers with a migrated schema (`503`
//!   otherwise, saying which: shutting down, store unreachable, failed or not migrated).
//! - `GET /metrics` — Prometheus / OpenMetrics text.
//! - `GET /admin/keys/{client_id}/{key}` — where a key stands.
//! - `DELETE /admin/keys/{client_id}/{key}` — evict it (the next request executes afresh).
//! - `GET /admin/stuck?limit=N&after=T` — in-progress keys whose lease ran out, each marked
//!   with whether the reconciler settles it by itself; `next` continues the list.
//! - `POST /admin/keys/{client_id}/{key}/resolve` — settle an unresolved key with an
//!   answer or a release (see `resolve`).
//! - `POST /admin/rekey` — seal every stored answer with the active encryption key (see
//!   `crate::background::rekey`, run in this process).
//!
//! - `/` and `/console/*` — the operator's console in the browser (see `console`).
//!
//! `/admin/*` requires `Authorization: Bearer <token>` when a token is configured
//! (`admin_token` or one of `admin_tokens`; one must be when the listener is not loopback).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::body::{ProxyBody, full};
use crate::proxy::Proxy;
use crate::store::{Health, Inspect, KeyStore, Maintenance, Reseal, StoreError};
pub use auth::Tokens;
use console::Console;
use error::AdminError;

mod auth;
mod console;
mod error;
mod keys;
mod resolve;
mod view;

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn run<S: KeyStore + Inspect + Health + Reseal + Maintenance>(
    listener: TcpListener,
    proxy: Proxy<S>,
    tokens: Tokens,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let desk = Arc::new(Desk {
        tokens,
        console: Arc::new(Console::default()),
    });
    let sampler = tokio::spawn(Arc::clone(&desk.console).sample(proxy.clone()));
    let _sampler = AbortOnDrop(sampler);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(cause = %e, "admin listener failed to accept");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let proxy = proxy.clone();
        let desk = Arc::clone(&desk);
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let proxy = proxy.clone();
                let desk = Arc::clone(&desk);
                async move { Ok::<_, Infallible>(handle(&proxy, &desk, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// What every admin request shares: who may use it, and the console's state.
struct Desk {
    tokens: Tokens,
    console: Arc<Console>,
}

/// Stops a task when the listener's loop returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `/readyz`: ready while the proxy takes requests and the store answers with a migrated
/// schema; each "not ready" says why, so that an operator knows where to look.
async fn ready<S: KeyStore + Health>(proxy: &Proxy<S>) -> Response<ProxyBody> {
    if proxy.is_draining() {
        return AdminError::ShuttingDown(
            "The proxy is shutting down: it finishes the requests in flight and takes no new ones."
                .into(),
        )
        .into_response();
    }
    if let Some(fault) = proxy.store_fault() {
        // The store answers reads (so a ping passes), but every new key is refused.
        return AdminError::StoreCannotWrite(format!(
            "The {} store cannot take new keys: {} since {} ({}{}). Stored answers still replay; ready again once a write succeeds or none has failed for a few seconds.",
            fault.store,
            fault.kind.as_str().replace('_', " "),
            httpdate::fmt_http_date(fault.since),
            fault.sqlstate.as_deref().map(|s| format!("SQLSTATE {s}: ")).unwrap_or_default(),
            fault.reason,
        ))
        .into_response();
    }
    match proxy.store().ping().await {
        Ok(()) => match proxy.store().location() {
            Some(at) => text(
                StatusCode::OK,
                "text/plain",
                format!("ready: store at {at}\n"),
            ),
            None => text(StatusCode::OK, "text/plain", "ready\n"),
        },
        Err(e @ StoreError::SchemaBehind { .. }) => {
            tracing::warn!(cause = %e, "not ready: store schema not migrated");
            AdminError::StoreNotMigrated(format!("The idempotency store answers, but {e}."))
                .into_response()
        }
        Err(e) if e.is_unreachable() => {
            tracing::warn!(cause = %e, "not ready: store unreachable");
            AdminError::StoreUnavailable("The idempotency store cannot be reached.".into())
                .into_response()
        }
        Err(e) => {
            tracing::warn!(cause = %e, "not ready: store failed");
            AdminError::StoreFailed(
                "The idempotency store answers with an error; the cause is in the proxy's log."
                    .into(),
            )
            .into_response()
        }
    }
}

/// Answers one admin request.
async fn handle<S: KeyStore + Inspect + Health + Reseal + Maintenance>(
    proxy: &Proxy<S>,
    desk: &Desk,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if console::owns(&path) {
        return console::handle(proxy, &desk.tokens, &desk.console, req).await;
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/readyz") => ready(proxy).await,
        (&Method::GET, "/metrics") => {
            let metrics = proxy.metrics();
            if let Some(pool) = proxy.store().pool_status() {
                metrics.observe_pool(pool);
            }
            if let Some(cache) = proxy.store().replay_cache() {
                metrics.observe_replay_cache(cache);
            }
            // OpenMetrics for a scraper that asks for it (Prometheus does); the classic
            // text format otherwise (curl, promtool check metrics, older scrapers).
            let openmetrics = req.headers().get_all(http::header::ACCEPT).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.contains("application/openmetrics-text"))
            });
            if openmetrics {
                text(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.render(),
                )
            } else {
                text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.render_classic(),
                )
            }
        }
        (_, "/healthz" | "/readyz" | "/metrics") => not_allowed("GET"),
        (_, p) if p.starts_with("/admin/") => {
            let Ok(who) = desk.tokens.bearer_of(req.headers()) else {
                let mut resp =
                    AdminError::Unauthorized("Send `Authorization: Bearer <admin_token>`.".into())
                        .into_response();
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
                return resp;
            };
            // Who, for the audit lines: the token's name, never the token.
            let who = who.unwrap_or("no admin token configured").to_owned();
            if p == "/admin/rekey" {
                if method != Method::POST {
                    return not_allowed("POST");
                }
                return rekey(proxy).await;
            }
            if let Some(rest) = p
                .strip_prefix("/admin/keys/")
                .and_then(|r| r.strip_suffix("/resolve"))
            {
                if method != Method::POST {
                    return not_allowed("POST");
                }
                let rest = rest.to_owned();
                return resolve::request(proxy, &rest, &who, req).await;
            }
            keys::api(proxy, &method, p, req.uri().query(), &who).await
        }
        _ => AdminError::NotFound("The admin endpoints are listed in docs/operations.md.".into())
            .into_response(),
    }
}

/// `405` with the methods the endpoint takes, in `Allow` (RFC 9110 §15.5.6) and in words.
fn not_allowed(allow: &'static str) -> Response<ProxyBody> {
    let mut resp =
        AdminError::MethodNotAllowed(format!("This endpoint takes {allow}.")).into_response();
    resp.headers_mut()
        .insert(header::ALLOW, http::HeaderValue::from_static(allow));
    resp
}

fn store_failed(e: &crate::store::StoreError) -> Response<ProxyBody> {
    tracing::warn!(cause = %e, "admin request: store unavailable");
    AdminError::StoreUnavailable("The idempotency store cannot be reached.".into()).into_response()
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<ProxyBody> {
    text(
        status,
        "application/json",
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

/// `POST /admin/rekey`: the rekey pass run inside the serving proxy — the way to rekey an
/// embedded store, whose file the serving process holds locked (PostgreSQL can also be
/// rekeyed from outside, `idemproxy rekey`). Same pass, same compare-and-set.
async fn rekey<S: KeyStore + Reseal>(proxy: &Proxy<S>) -> Response<ProxyBody> {
    let Some(vault) = proxy.vault() else {
        return AdminError::EncryptionOff("There is no key to seal stored answers with: configure `encryption.keys` and `encryption.active`, then restart.".into()).into_response();
    };
    match crate::background::rekey::once(
        proxy.store(),
        vault,
        crate::background::rekey::DEFAULT_BATCH,
    )
    .await
    {
        Ok(report) => {
            tracing::warn!(summary = %report.summary(), "rekey by an operator");
            json(StatusCode::OK, &report)
        }
        Err(e) => store_failed(&e),
    }
}
