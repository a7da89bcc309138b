//! A payment provider speaking one real API's create-payment endpoint — Adyen's
//! `/v72/payments`, PayPal's `/v2/checkout/orders` (and its OAuth token endpoint),
//! Checkout.com's `/payments`, Square's `/v2/payments` — in that API's JSON, so that the
//! API's official SDK parses what it gets. It takes the idempotency key where the API does
//! and refuses one longer than the API accepts (Square 45, Adyen 64, PayPal 108), counts
//! every execution, and reads its behaviour from the request: a body mentioning `slow`
//! answers after 1.5 s, one mentioning `fail` gets the API's own `500`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// The payment API the provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Adyen,
    PayPal,
    Checkout,
    Square,
}

impl Api {
    /// The create-payment endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Api::Adyen => "/v72/payments",
            Api::PayPal => "/v2/checkout/orders",
            Api::Checkout => "/payments",
            Api::Square => "/v2/payments",
        }
    }

    /// The longest key the API accepts, where its documentation states one.
    pub fn max_key_len(self) -> Option<usize> {
        match self {
            Api::Adyen => Some(64),
            Api::PayPal => Some(108),
            Api::Checkout => None,
            Api::Square => Some(45),
        }
    }

    /// Where the key travels: a header's name, or `None` for Square's body member.
    fn key_header(self) -> Option<&'static str> {
        match self {
            Api::Adyen => Some("idempotency-key"),
            Api::PayPal => Some("paypal-request-id"),
            Api::Checkout => Some("cko-idempotency-key"),
            Api::Square => None,
        }
    }
}

/// One request that reached the create-payment endpoint.
#[derive(Clone, Debug)]
pub struct Execution {
    /// The key as the provider received it (the proxy's derived key).
    pub key: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    executions: Mutex<Vec<Execution>>,
    payments: AtomicUsize,
    tokens: AtomicUsize,
}

/// The provider on a loopback port.
#[derive(Clone)]
pub struct Provider {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Provider {
    pub async fn spawn(api: Api) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(api, Arc::clone(&st), req));
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Provider { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request that reached the create-payment endpoint.
    pub fn executions(&self) -> Vec<Execution> {
        self.state.executions.lock().unwrap().clone()
    }

    /// OAuth tokens issued (PayPal).
    pub fn tokens(&self) -> usize {
        self.state.tokens.load(Ordering::SeqCst)
    }
}

async fn answer(
    api: Api,
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).into_owned();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if api == Api::PayPal && parts.uri.path() == "/v1/oauth2/token" {
        // Each SDK instance fetches its own token (and again at every renewal).
        let n = st.tokens.fetch_add(1, Ordering::SeqCst) + 1;
        let token = serde_json::json!({
            "scope": "https://uri.paypal.com/services/payments/payment",
            "access_token": format!("A21AA-token-{n}"),
            "token_type": "Bearer",
            "app_id": "APP-80W284485P519543T",
            "expires_in": 32400,
            "nonce": format!("nonce-{n}"),
        });
        return Ok(json(200, &token));
    }
    if parts.uri.path() != api.path() || parts.method != http::Method::POST {
        return Ok(json(404, &serde_json::json!({"error": "no such endpoint"})));
    }
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = match api.key_header() {
        Some(name) => header(name),
        None => parsed["idempotency_key"].as_str().map(str::to_owned),
    };
    st.executions.lock().unwrap().push(Execution {
        key: key.clone(),
        authorization: header("authorization").or_else(|| header("x-api-key")),
    });
    if let (Some(key), Some(max)) = (&key, api.max_key_len())
        && key.len() > max
    {
        return Ok(too_long(api, key.len(), max));
    }
    if text.contains("slow") {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    if text.contains("fail") {
        return Ok(failure(api));
    }
    let n = st.payments.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(success(api, n, &parsed))
}

fn json(status: u16, body: &serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The API's answer for a created payment, numbered `n`.
fn success(api: Api, n: usize, request: &serde_json::Value) -> Response<Full<Bytes>> {
    use serde_json::json;
    match api {
        Api::Adyen => json(
            200,
            &json!({
                "pspReference": format!("PSP{n:013}"),
                "resultCode": "Authorised",
                "merchantReference": request["reference"],
                "amount": request["amount"],
            }),
        ),
        Api::PayPal => json(
            201,
            &json!({
                "id": format!("ORDER{n:013}"),
                "status": "CREATED",
                "intent": "CAPTURE",
                "links": [],
            }),
        ),
        Api::Checkout => json(
            201,
            &json!({
                "id": format!("pay_{n:026}"),
                "action_id": format!("act_{n:026}"),
                "amount": request["amount"],
                "currency": request["currency"],
                "approved": true,
                "status": "Authorized",
                "reference": request["reference"],
            }),
        ),
        Api::Square => json(
            200,
            &json!({
                "payment": {
                    "id": format!("PAY{n:013}"),
                    "status": "COMPLETED",
                    "amount_money": request["amount_money"],
                    "source_type": "CARD",
                }
            }),
        ),
    }
}

/// The API's own `500`.
fn failure(api: Api) -> Response<Full<Bytes>> {
    use serde_json::json;
    let body = match api {
        Api::Adyen => json!({
            "status": 500, "errorCode": "000", "message": "An unknown error occurred",
            "errorType": "internal",
        }),
        Api::PayPal => json!({
            "name": "INTERNAL_SERVER_ERROR", "message": "An internal server error occurred.",
            "debug_id": "90957fca61718",
            "details": [{"issue": "INTERNAL_SERVICE_ERROR", "description": "An internal service error occurred."}],
        }),
        Api::Checkout => json!({
            "request_id": "req-500", "error_type": "internal_error", "error_codes": ["internal_error"],
        }),
        Api::Square => json!({"errors": [{
            "category": "API_ERROR", "code": "INTERNAL_SERVER_ERROR",
            "detail": "An internal error occurred.",
        }]}),
    };
    json(500, &body)
}

/// The API's refusal of a key longer than it takes.
fn too_long(api: Api, len: usize, max: usize) -> Response<Full<Bytes>> {
    use serde_json::json;
    let detail = format!("the idempotency key is {len} characters; at most {max} are accepted");
    let (status, body) = match api {
        Api::Square => (
            400,
            json!({"errors": [{
                "category": "INVALID_REQUEST_ERROR", "code": "VALUE_TOO_LONG",
                "detail": detail, "field": "idempotency_key",
            }]}),
        ),
        Api::Adyen => (
            422,
            json!({"status": 422, "errorCode": "702", "message": detail, "errorType": "validation"}),
        ),
        _ => (
            400,
            json!({"name": "INVALID_REQUEST", "message": detail,
                   "details": [{"issue": "INVALID_PARAMETER_SYNTAX", "field": "PayPal-Request-Id"}]}),
        ),
    };
    json(status, &body)
}
