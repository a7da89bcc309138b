//! A demo payment provider: "charges" in 300 ms like the seed's `charge`, deduplicates by
//! the idempotency key it receives (as providers that accept keys do), counts charges, and
//! can be told to fail or hang.
//!
//! - `POST /payments` — charge (`201 {"charge_id":N,"amount":…}`), or the earlier charge
//!   for a key it has seen.
//! - `GET /payments/by-key/{key}` — the recovery probe: `200` and the charge, or `404`.
//! - `GET /charges` — `{"charges":N}`.
//! - `POST /control` with `{"mode":"normal"|"fail"|"hang"}` — `fail` answers `503`
//!   without charging, `hang` never answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::body::{ProxyBody, full};

/// How long a charge takes, as in the seed.
pub const CHARGE_TIME: Duration = Duration::from_millis(300);

#[derive(Default)]
struct State {
    /// How long a charge takes.
    charge_time: Duration,
    charges: AtomicU64,
    /// Charge answers by idempotency key.
    by_key: Mutex<HashMap<String, String>>,
    /// `normal`, `fail` or `hang`.
    mode: Mutex<String>,
}

/// Serves the provider on `listener` forever; each charge takes `charge_time` (the seed's
/// is [`CHARGE_TIME`]; the benchmark uses zero to measure the proxy, not the provider).
pub async fn run(listener: TcpListener, charge_time: Duration) {
    let state = Arc::new(State {
        charge_time,
        ..State::default()
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn json(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<ProxyBody> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path();
    match (&parts.method, path) {
        (&Method::GET, "/charges") => json(
            StatusCode::OK,
            format!(r#"{{"charges":{}}}"#, state.charges.load(Ordering::SeqCst)),
        ),
        (&Method::POST, "/control") => {
            let mode = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["mode"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "normal".into());
            *state.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode.clone();
            json(StatusCode::OK, format!(r#"{{"mode":"{mode}"}}"#))
        }
        (&Method::GET, p) if p.starts_with("/payments/by-key/") => {
            let key = percent_encoding::percent_decode_str(&p["/payments/by-key/".len()..])
                .decode_utf8_lossy()
                .into_owned();
            let found = state
                .by_key
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&key)
                .cloned();
            match found {
                Some(charge) => json(StatusCode::OK, charge),
                None => json(
                    StatusCode::NOT_FOUND,
                    r#"{"error":"no payment with this key"}"#.into(),
                ),
            }
        }
        (&Method::POST, "/payments") => {
            let mode = state
                .mode
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            match mode.as_str() {
                "fail" => {
                    return json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        r#"{"error":"provider unavailable"}"#.into(),
                    );
                }
                "hang" => std::future::pending::<()>().await,
                _ => {}
            }
            let amount = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .map(|v| v["amount"].clone());
            let key = parts
                .headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // Check and charge under one lock: two arrivals with one key charge once.
            let charge = {
                let mut by_key = state.by_key.lock().unwrap_or_else(PoisonError::into_inner);
                match key.as_ref().and_then(|k| by_key.get(k)) {
                    Some(earlier) => earlier.clone(),
                    None => {
                        let id = state.charges.fetch_add(1, Ordering::SeqCst) + 1;
                        let amount = amount.unwrap_or(serde_json::Value::Null);
                        let charge = format!(r#"{{"charge_id":{id},"amount":{amount}}}"#);
                        if let Some(k) = key {
                            by_key.insert(k, charge.clone());
                        }
                        charge
                    }
                }
            };
            sleep(state.charge_time).await;
            json(StatusCode::CREATED, charge)
        }
        _ => json(StatusCode::NOT_FOUND, r#"{"error":"not found"}"#.into()),
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
