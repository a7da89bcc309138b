//! Built-in dialects for the payment APIs people front: each outcome of the proxy's as the
//! API's public error documentation answers it — its status, its error code, its
//! category, its headers — in the API's error object, so that the API's official SDK
//! raises the exception (and retries, or not) that its users' code already handles.
//! Where an API documents no answer for an outcome, the preset keeps the proxy's status
//! and says the outcome's code in the API's spelling (docs/apis/ lists each choice).

use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};

use super::{Answer, Said, Shape, Template};

/// A payment API whose answers a route speaks (`errors: square`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Stripe's error object (the `stripe` dialect).
    Stripe,
    /// Adyen's `ServiceError`: `status`, `errorCode`, `message`, `errorType`.
    Adyen,
    /// PayPal's REST error: `name`, `message`, `details[].issue`.
    PayPal,
    /// Checkout.com's error: `error_type`, `error_codes`.
    Checkout,
    /// Square's `errors[]`: `category`, `code`, `detail`.
    Square,
}

impl Preset {
    /// Every preset, in the order the docs list them.
    pub const ALL: [Preset; 5] = [
        Preset::Stripe,
        Preset::Adyen,
        Preset::PayPal,
        Preset::Checkout,
        Preset::Square,
    ];

    /// The name a configuration gives it.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Stripe => "stripe",
            Preset::Adyen => "adyen",
            Preset::PayPal => "paypal",
            Preset::Checkout => "checkout",
            Preset::Square => "square",
        }
    }

    /// The preset named `name`.
    pub fn named(name: &str) -> Option<Preset> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The API's error object, as a template (Stripe's is written in code).
    fn template(self) -> &'static str {
        match self {
            Preset::Stripe => "",
            Preset::Adyen => {
                r#"{"status": {status}, "errorCode": "{code}", "message": "{detail}", "errorType": "{category}"}"#
            }
            Preset::PayPal => {
                r#"{"name": "{category}", "message": "{detail}", "details": [{"issue": "{code}", "description": "{detail}"}]}"#
            }
            Preset::Checkout => r#"{"error_type": "{category}", "error_codes": ["{code}"]}"#,
            Preset::Square => {
                r#"{"errors": [{"category": "{category}", "code": "{code}", "detail": "{detail}"}]}"#
            }
        }
    }

    pub(super) fn shape(self) -> Shape {
        match self {
            Preset::Stripe => Shape::Stripe,
            // The texts are constants, checked by a test; a failure would leave problem
            // documents rather than a panic.
            _ => Template::parse(self.template(), None)
                .map(|t| Shape::Template(Arc::new(t)))
                .unwrap_or_default(),
        }
    }

    /// How the API answers `said`'s outcome.
    pub(super) fn answer(self, said: &Said<'_>) -> Answer {
        match self {
            // The Stripe shape decides in code ([`super::stripe`]).
            Preset::Stripe => Answer::default(),
            Preset::Adyen => adyen(said),
            Preset::PayPal => paypal(said),
            Preset::Checkout => checkout(said),
            Preset::Square => square(said),
        }
    }
}

fn answer(status: Option<StatusCode>, code: impl Into<String>, category: &str) -> Answer {
    Answer {
        status,
        code: Some(code.into()),
        category: Some(category.to_owned()),
        ..Answer::default()
    }
}

/// `key-reused` → `KEY_REUSED`.
fn upper(code: &str) -> String {
    code.replace('-', "_").to_ascii_uppercase()
}

/// `key-reused` → `key_reused`.
fn snake(code: &str) -> String {
    code.replace('-', "_")
}

/// A status's reason in upper snake case (`SERVICE_UNAVAILABLE`), as PayPal names its
/// errors and Square its codes.
fn reason(status: StatusCode) -> String {
    status
        .canonical_reason()
        .unwrap_or("ERROR")
        .replace([' ', '-'], "_")
        .to_ascii_uppercase()
}

/// Adyen: the in-flight duplicate is `422` with errorCode `704` ("request already
/// processed or in progress") and `transient-error: true`, which tells the caller a retry
/// with the same key can succeed; a reused key is the same `704` without it (final).
/// Validation errors are `errorType: validation`, authentication `security`, server-side
/// failures `internal` — and `transient-error: true` wherever a retry can help.
fn adyen(said: &Said<'_>) -> Answer {
    let mut a = match said.code {
        "key-reused" | "in-progress" => {
            answer(Some(StatusCode::UNPROCESSABLE_ENTITY), "704", "validation")
        }
        _ if said.status == StatusCode::UNAUTHORIZED => answer(None, said.code, "security"),
        _ if said.status.is_server_error() => answer(None, said.code, "internal"),
        _ => answer(None, said.code, "validation"),
    };
    if said.retry_helps {
        a.headers.push((
            HeaderName::from_static("transient-error"),
            HeaderValue::from_static("true"),
        ));
    }
    a
}

/// PayPal: a `PayPal-Request-Id` used for another request is `422 UNPROCESSABLE_ENTITY`
/// with issue `PAYPAL_REQUEST_ID_PREVIOUSLY_USED`; one still being processed is
/// `422` with `PREVIOUS_REQUEST_IN_PROGRESS`; a missing header `400 INVALID_REQUEST` with
/// `MISSING_REQUIRED_PARAMETER`. Other errors are named by their status
/// (`INTERNAL_SERVER_ERROR`, `SERVICE_UNAVAILABLE`, …) with the outcome as the issue.
fn paypal(said: &Said<'_>) -> Answer {
    let unprocessable = Some(StatusCode::UNPROCESSABLE_ENTITY);
    match said.code {
        "key-reused" => answer(
            unprocessable,
            "PAYPAL_REQUEST_ID_PREVIOUSLY_USED",
            "UNPROCESSABLE_ENTITY",
        ),
        "in-progress" => answer(
            unprocessable,
            "PREVIOUS_REQUEST_IN_PROGRESS",
            "UNPROCESSABLE_ENTITY",
        ),
        "missing-key" => answer(None, "MISSING_REQUIRED_PARAMETER", "INVALID_REQUEST"),
        "invalid-key" => answer(None, "INVALID_PARAMETER_VALUE", "INVALID_REQUEST"),
        _ if said.status == StatusCode::UNAUTHORIZED => {
            answer(None, upper(said.code), "AUTHENTICATION_FAILURE")
        }
        _ if said.status == StatusCode::BAD_REQUEST => {
            answer(None, upper(said.code), "INVALID_REQUEST")
        }
        _ => answer(None, upper(said.code), &reason(said.status)),
    }
}

/// Checkout.com: a request still being processed under the same `Cko-Idempotency-Key`
/// is `409` (Conflict with another request being processed); request errors are
/// `request_invalid` with snake-case codes (`422` for a missing or invalid key, as
/// Checkout.com reports a missing or invalid field); server-side failures are named by
/// their status.
fn checkout(said: &Said<'_>) -> Answer {
    let unprocessable = Some(StatusCode::UNPROCESSABLE_ENTITY);
    match said.code {
        "key-reused" => answer(unprocessable, "idempotency_key_reused", "request_invalid"),
        "in-progress" => answer(None, "request_in_progress", "conflict"),
        "missing-key" => answer(unprocessable, "idempotency_key_required", "request_invalid"),
        "invalid-key" => answer(unprocessable, "idempotency_key_invalid", "request_invalid"),
        _ if said.status == StatusCode::UNAUTHORIZED => {
            answer(None, snake(said.code), "unauthorized")
        }
        _ if said.status.is_client_error() => answer(None, snake(said.code), "request_invalid"),
        _ => answer(
            None,
            snake(said.code),
            &reason(said.status).to_ascii_lowercase(),
        ),
    }
}

/// Square: a reused key is `400` `INVALID_REQUEST_ERROR` / `IDEMPOTENCY_KEY_REUSED`; a
/// key in flight `409` / `CONFLICT` (which Square's SDKs retry, honouring `Retry-After`);
/// a missing key `MISSING_REQUIRED_PARAMETER`, an invalid one `INVALID_VALUE`; server-side
/// failures `API_ERROR` with the status's code (`SERVICE_UNAVAILABLE`, …), so that an
/// integration branching on the category sees a failure of the service, not of its
/// request.
fn square(said: &Said<'_>) -> Answer {
    let request = "INVALID_REQUEST_ERROR";
    match said.code {
        "key-reused" => answer(
            Some(StatusCode::BAD_REQUEST),
            "IDEMPOTENCY_KEY_REUSED",
            request,
        ),
        "in-progress" => answer(None, "CONFLICT", request),
        "missing-key" => answer(None, "MISSING_REQUIRED_PARAMETER", request),
        "invalid-key" => answer(None, "INVALID_VALUE", request),
        _ if said.status == StatusCode::UNAUTHORIZED => {
            answer(None, "UNAUTHORIZED", "AUTHENTICATION_ERROR")
        }
        // The outcome is the service's to settle, not the request's to fix.
        "outcome-unknown" | "not-replayable" => answer(None, upper(said.code), "API_ERROR"),
        _ if said.status.is_server_error() => answer(None, reason(said.status), "API_ERROR"),
        _ => answer(None, upper(said.code), request),
    }
}
