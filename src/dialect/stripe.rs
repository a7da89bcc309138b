//! Stripe's error object, typed the way stripe-node and stripe-python pick their
//! exception classes.

use http::{HeaderValue, StatusCode};
use serde_json::json;

use super::{Answer, Rendered, Said};

/// Stripe's error object (`{"error": {"type", "code", "message"}}`): a reused key is an
/// `idempotency_error` with status `400` (the SDKs' `IdempotencyError`), a key in use is
/// Stripe's `409 idempotency_key_in_use` (retried by the SDKs), the store or the upstream
/// failing is an `api_error`; `Stripe-Should-Retry` says whether the same key can help.
/// A route's `outcomes:` override the status, `code`, `type` (`category`) and `message`.
pub(super) fn render(said: &Said<'_>, answer: &Answer) -> Rendered {
    let (status, kind, code) = match said.code {
        "key-reused" => (StatusCode::BAD_REQUEST, "idempotency_error", None),
        "in-progress" => (
            said.status,
            "invalid_request_error",
            Some("idempotency_key_in_use"),
        ),
        "missing-key" => (
            said.status,
            "invalid_request_error",
            Some("parameter_missing"),
        ),
        _ if said.status == StatusCode::UNAUTHORIZED => (said.status, "authentication_error", None),
        _ if said.status.is_server_error()
            || said.status == StatusCode::GONE
            || said.status == StatusCode::FAILED_DEPENDENCY =>
        {
            (said.status, "api_error", None)
        }
        _ => (said.status, "invalid_request_error", None),
    };
    let code = match (&answer.code, code) {
        (Some(own), _) => own.clone(),
        (None, Some(code)) => code.to_owned(),
        (None, None) => said.code.replace('-', "_"),
    };
    let mut error = json!({
        "type": answer.category.as_deref().unwrap_or(kind),
        "code": code,
        "message": answer.message.as_deref().unwrap_or(said.detail),
        "idemproxy_problem": said.kind,
    });
    if said.code == "missing-key" {
        error["param"] = json!("Idempotency-Key");
    }
    Rendered {
        status: answer.status.unwrap_or(status),
        content_type: HeaderValue::from_static("application/json"),
        body: serde_json::to_vec(&json!({ "error": error })).unwrap_or_default(),
        should_retry: Some(said.retry_helps),
        headers: answer.headers.clone(),
    }
}
