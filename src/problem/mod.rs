//! Every error the proxy answers itself: RFC 9457 problem documents by default, or in a
//! route's error dialect (`answer.rs`, [`crate::dialect`]).
//!
//! [`ProxyError`] is the request path's one error type; each variant is a client-visible
//! outcome, mapped to a status and a [`Problem`] by one exhaustive `match`, so that a new
//! variant forces a decision. 5xx details stay generic: causes go to the log, not the client.

use std::time::Duration;

use http::StatusCode;
use serde::Serialize;

use crate::fingerprint::BodyError;
use crate::http1::server::{HeadError, MAX_HEADERS};

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
}

/// The request-path outcomes the proxy answers itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("the route requires an idempotency key")]
    MissingKey {
        header: String,
        /// Where in the body a key is also accepted (`key_from.body`).
        body: Option<String>,
    },
    #[error("invalid idempotency key: {reason}")]
    InvalidKey { header: String, reason: String },
    #[error("the body cannot carry the provider's key at {field}: {reason}")]
    KeyPlacement { field: String, reason: String },
    #[error("invalid idempotency key in the body: {reason}")]
    InvalidBodyKey { field: String, reason: String },
    #[error("no client identity")]
    MissingClientId { what: String, unauthorized: bool },
    #[error("path cannot be normalised safely: {0}")]
    InvalidPath(#[source] crate::path::PathError),
    #[error("invalid client identity: {reason}")]
    InvalidClientId { reason: String },
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("request body not received in time")]
    BodyTimeout,
    #[error("request body could not be read")]
    BodyRead(#[source] crate::body::BoxError),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("key reused with a different request")]
    KeyReused,
    #[error("a request with this key is in progress")]
    InProgress { retry_after: Duration },
    #[error("the stored answer is too large to replay")]
    NotReplayable { status: u16 },
    #[error("the outcome of an earlier attempt is unknown")]
    OutcomeUnknown,
    #[error("{}", if .0.is_unreachable() { "store unavailable" } else { "store failed" })]
    StoreUnavailable(#[source] crate::store::StoreError),
    #[error("upstream refused the connection")]
    UpstreamUnreachable(#[source] crate::body::BoxError),
    #[error("upstream connection failed after the request was sent")]
    UpstreamFailed(#[source] crate::body::BoxError),
    #[error("upstream timed out")]
    UpstreamTimeout,
    #[error("the stored answer cannot be decrypted: {0}")]
    StoredAnswerUnreadable(crate::vault::Unreadable),
    #[error("recovery probe inconclusive")]
    ProbeInconclusive { status: Option<u16> },
    #[error("request head larger than {limit} bytes")]
    HeadTooLarge { limit: usize, fields: usize },
    #[error("malformed request: {0}")]
    MalformedHead(String),
    #[error("malformed HTTP/2 request: {0}")]
    MalformedH2(String),
    #[error("request line longer than {0} bytes")]
    UriTooLong(usize),
    #[error("HTTP version `{0}` not supported")]
    VersionNotSupported(String),
    #[error("unsupported transfer coding `{0}`")]
    UnsupportedCoding(String),
    #[error("not supported: {0}")]
    NotImplemented(String),
    /// Past a bound on detached work (`limits.detached`): nothing reserved or forwarded.
    #[error("too much work in flight ({bound} bound)")]
    Overloaded { bound: &'static str },
    #[error("internal error")]
    Internal,
}

impl Problem {
    /// A problem of type `urn:idemproxy:problem:{slug}`: how the request path's answers
    /// and the admin API's are both made.
    pub fn new(status: StatusCode, slug: &str, title: &'static str, detail: String) -> Self {
        Problem {
            kind: format!("{TYPE_PREFIX}{slug}"),
            title,
            status: status.as_u16(),
            detail,
        }
    }
}

/// Problem types are URNs: stable identifiers, documented in the README, that do not
/// pretend to be a resolvable page.
const TYPE_PREFIX: &str = "urn:idemproxy:problem:";

impl From<&HeadError> for ProxyError {
    fn from(e: &HeadError) -> Self {
        match e {
            HeadError::TooLarge { limit } => ProxyError::HeadTooLarge {
                limit: *limit,
                fields: MAX_HEADERS,
            },
            HeadError::Malformed(reason) => ProxyError::MalformedHead(reason.clone()),
            HeadError::UriTooLong { limit } => ProxyError::UriTooLong(*limit),
            HeadError::Version(version) => ProxyError::VersionNotSupported(version.clone()),
            HeadError::UnsupportedCoding(coding) => ProxyError::UnsupportedCoding(coding.clone()),
            HeadError::Unsupported(what) => ProxyError::NotImplemented(what.clone()),
        }
    }
}

impl ProxyError {
    /// The HTTP status this outcome is answered with.
    pub fn status(&self) -> StatusCode {
        self.entry().0
    }

    /// Seconds after which a retry with the same key can help (`Retry-After`), where one
    /// can.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ProxyError::InProgress { retry_after } => Some(retry_secs(*retry_after)),
            ProxyError::StoreUnavailable(_) | ProxyError::Overloaded { .. } => Some(1),
            _ => None,
        }
    }

    /// Whether the same request with the same key can have another outcome (README's
    /// client contract: "retry with the same key"): Stripe's `Stripe-Should-Retry`.
    pub fn retry_helps(&self) -> bool {
        matches!(self.status().as_u16(), 408 | 409 | 500 | 502 | 503 | 504)
    }

    /// The problem document a client sees.
    pub fn problem(&self) -> Problem {
        self.document().1
    }

    /// The status and the problem document, from one look at the table.
    fn document(&self) -> (StatusCode, Problem) {
        let (status, slug, title, detail) = self.entry();
        (status, Problem::new(status, slug, title, detail))
    }

    /// The one table of outcomes: each variant's status, problem type, title and detail.
    /// 5xx details stay generic: causes go to the log, not the client.
    fn entry(&self) -> (StatusCode, &'static str, &'static str, String) {
        match self {
            ProxyError::MissingKey { header, body } => (
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency key required",
                match body {
                    None => format!("This endpoint requires an `{header}` header; generate a unique value (e.g. a UUID) per operation and send the same value on every retry."),
                    Some(field) => format!("This endpoint requires an idempotency key, in an `{header}` header or in the body at `{field}`; generate a unique value (e.g. a UUID) per operation and send the same value on every retry."),
                },
            ),
            ProxyError::InvalidBodyKey { field, reason } => (
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                format!("The key in the body at `{field}` is invalid: {reason}. Nothing was reserved; send the request again with a valid key."),
            ),
            ProxyError::InvalidKey { header, reason } => (
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                format!("The `{header}` header is invalid: {reason}. Nothing was reserved; send the request again with a valid key."),
            ),
            ProxyError::MissingClientId { what, unauthorized } => (
                if *unauthorized {
                    StatusCode::UNAUTHORIZED
                } else {
                    StatusCode::BAD_REQUEST
                },
                "missing-client-id",
                "Client identity required",
                format!("Idempotency keys are kept per client, and this request carries no client identity ({what}). Nothing was reserved."),
            ),
            ProxyError::InvalidPath(reason) => (
                StatusCode::BAD_REQUEST,
                "invalid-path",
                "Ambiguous request path",
                format!("The request path cannot be read unambiguously: {reason}. It was not forwarded and nothing was reserved; send it again spelled plainly (e.g. `/payments`)."),
            ),
            ProxyError::InvalidClientId { reason } => (
                StatusCode::BAD_REQUEST,
                "invalid-client-id",
                "Invalid client identity",
                format!("The client identity is invalid: {reason}. Nothing was reserved."),
            ),
            ProxyError::BodyTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("The request body exceeds the limit of {limit} bytes for this endpoint. Nothing was reserved."),
            ),
            ProxyError::BodyTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
                "The request body did not arrive in time. Nothing was reserved; send the request again with the same key.".to_owned(),
            ),
            ProxyError::BodyRead(e) => (
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
                format!("The request body ended early or was malformed ({e}). Nothing was reserved or forwarded; send the request again with the same key."),
            ),
            ProxyError::KeyPlacement { field, reason } => (
                StatusCode::BAD_REQUEST,
                "invalid-body",
                "Invalid request body",
                format!("This endpoint passes the idempotency key to the provider in the body at `{field}`, and this body cannot carry it there: {reason}. Nothing was reserved; fix the body and send it again with the same key."),
            ),
            ProxyError::Body(e) => (
                StatusCode::BAD_REQUEST,
                "invalid-body",
                "Invalid request body",
                format!("{e}. Nothing was reserved; fix the body and send it again with the same key."),
            ),
            ProxyError::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency key already used",
                "This idempotency key was already used for a different request (method, path, query or body differ). Use a new key for a new operation.".to_owned(),
            ),
            ProxyError::InProgress { retry_after } => (
                StatusCode::CONFLICT,
                "in-progress",
                "Request in progress",
                format!("A request with this idempotency key is still being processed. Retry after {} s to get its result; do not change the key.", retry_secs(*retry_after)),
            ),
            ProxyError::OutcomeUnknown => (
                StatusCode::FAILED_DEPENDENCY,
                "outcome-unknown",
                "Outcome unknown",
                "An earlier request with this idempotency key reached the upstream service, but its outcome was never learned (it timed out or the connection broke), and this route never executes an operation twice. It may or may not have happened; the operator has been told. Do not retry this key: look the operation up with the upstream service, or ask the operator to resolve the key.".to_owned(),
            ),
            // Final, not 409: clients with automatic retries retry every 409 and would loop
            // on an answer that will never come.
            ProxyError::NotReplayable { status } => (
                StatusCode::GONE,
                "not-replayable",
                "Result cannot be replayed",
                format!("A request with this idempotency key was already executed (upstream status {status}), but its answer was too large to store, so it cannot be replayed. It will not be executed again: do not retry this key; look the operation up with the upstream service instead."),
            ),
            ProxyError::StoreUnavailable(e) if e.is_unreachable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The idempotency store cannot be reached, so the request was not forwarded. It is safe to retry with the same key.".to_owned(),
            ),
            ProxyError::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-failed",
                "Idempotency store failed",
                "The idempotency store answered with an error, so the request was not forwarded. The operator has the cause in the proxy's log; it is safe to retry with the same key.".to_owned(),
            ),
            ProxyError::UpstreamUnreachable(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
                "The upstream service could not be reached, so the request was not sent (and its idempotency key, if any, was released). It is safe to retry with the same key.".to_owned(),
            ),
            ProxyError::UpstreamFailed(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream connection failed",
                "The connection to the upstream service failed after the request was sent, so its outcome is unknown. Retry with the same key: the retry is answered once the outcome is settled.".to_owned(),
            ),
            ProxyError::UpstreamTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
                "The upstream service did not answer in time, so the outcome is unknown. Retry with the same key: the retry is answered once the outcome is settled.".to_owned(),
            ),
            ProxyError::ProbeInconclusive { .. } => (
                StatusCode::BAD_GATEWAY,
                "probe-inconclusive",
                "Outcome of an earlier attempt unknown",
                "An earlier attempt with this key may have been executed, and the upstream could not confirm either way, so the request was not executed again. Retry with the same key later.".to_owned(),
            ),
            ProxyError::StoredAnswerUnreadable(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "stored-answer-unreadable",
                "Stored answer cannot be read",
                "A request with this idempotency key was already executed, but the proxy cannot decrypt its stored answer, so it is neither replayed nor executed again. The operator has been told; retry later with the same key (not a new one: the operation has happened).".to_owned(),
            ),
            ProxyError::HeadTooLarge { limit, fields } => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "head-too-large",
                "Request head too large",
                format!("The request line and header fields exceed {limit} bytes (or {fields} fields). Nothing was forwarded or reserved; send fewer or shorter header fields."),
            ),
            ProxyError::MalformedHead(reason) => (
                StatusCode::BAD_REQUEST,
                "malformed-request",
                "Malformed request",
                format!("The request could not be read as HTTP/1.1: {reason}. Nothing was forwarded or reserved, and the connection is closed; send the request again on a new connection."),
            ),
            ProxyError::MalformedH2(reason) => (
                StatusCode::BAD_REQUEST,
                "malformed-request",
                "Malformed request",
                format!("The HTTP/2 request is malformed (RFC 9113 §8.3.1): {reason}. Nothing was forwarded or reserved; send `Host` equal to `:authority`, or leave `Host` out."),
            ),
            ProxyError::UriTooLong(limit) => (
                StatusCode::URI_TOO_LONG,
                "uri-too-long",
                "Request line too long",
                format!("The request line is longer than the head's limit of {limit} bytes. Nothing was forwarded or reserved, and the connection is closed; send a shorter target (move data into the body)."),
            ),
            ProxyError::VersionNotSupported(version) => (
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "http-version-not-supported",
                "HTTP version not supported",
                format!("The request line names `{version}`; the proxy reads HTTP/1.0 and HTTP/1.1 requests here (and HTTP/2 by ALPN or prior knowledge). Nothing was forwarded or reserved, and the connection is closed."),
            ),
            ProxyError::NotImplemented(what) => (
                StatusCode::NOT_IMPLEMENTED,
                "not-implemented",
                "Not supported by the proxy",
                format!("{what}. Nothing was forwarded or reserved, and the connection is closed; send an ordinary request."),
            ),
            ProxyError::UnsupportedCoding(coding) => (
                StatusCode::NOT_IMPLEMENTED,
                "unsupported-transfer-coding",
                "Transfer coding not supported",
                format!("The request body is sent with the transfer coding `{coding}`, which the proxy does not decode (only `chunked`). Nothing was forwarded or reserved; send the body unencoded, or with `Content-Encoding`."),
            ),
            ProxyError::Overloaded { bound } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Too much work in flight",
                format!("The proxy has as many protected requests in flight as it takes{}, so this one was not reserved or forwarded. It is safe to retry with the same key after Retry-After.", match *bound {
                    "client" => " for this client",
                    "connection" => " on this connection",
                    _ => "",
                }),
            ),
            ProxyError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "The proxy failed while handling this request. Retry with the same key.".to_owned(),
            ),
        }
    }
}

fn retry_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

mod answer;
mod examples;

pub use examples::rendered_templates;

#[cfg(test)]
mod tests;
