//! The admin API's own answers, as problem documents on the same mapping as the request
//! path's ([`crate::problem::Problem`]): one variant per kind, each with its detail.

use http::{Response, StatusCode};

use crate::body::ProxyBody;
use crate::problem::Problem;

/// What the admin API refuses or cannot do, with the detail an operator reads.
#[derive(Debug)]
pub(super) enum AdminError {
    ShuttingDown(String),
    StoreNotMigrated(String),
    StoreUnavailable(String),
    StoreFailed(String),
    /// The store answers, but cannot take new keys (disk full, out of memory).
    StoreCannotWrite(String),
    Unauthorized(String),
    NotFound(String),
    BadPath(String),
    BadQuery(String),
    NoSuchKey(String),
    MethodNotAllowed(String),
    EncryptionOff(String),
    BadResolution(String),
    NotUnresolved(String),
}

impl AdminError {
    /// The one table: each kind's status, problem type and title.
    fn entry(self) -> (StatusCode, &'static str, &'static str, String) {
        match self {
            AdminError::ShuttingDown(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Shutting down",
                d,
            ),
            AdminError::StoreNotMigrated(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-not-migrated",
                "Store schema not migrated",
                d,
            ),
            AdminError::StoreUnavailable(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                d,
            ),
            AdminError::StoreFailed(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-failed",
                "Store failed",
                d,
            ),
            AdminError::StoreCannotWrite(d) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-cannot-write",
                "Store cannot take new keys",
                d,
            ),
            AdminError::Unauthorized(d) => (
                StatusCode::UNAUTHORIZED,
                "admin-unauthorized",
                "Admin token required",
                d,
            ),
            AdminError::NotFound(d) => (StatusCode::NOT_FOUND, "not-found", "Not found", d),
            AdminError::BadPath(d) => (StatusCode::BAD_REQUEST, "bad-path", "Invalid path", d),
            AdminError::BadQuery(d) => (StatusCode::BAD_REQUEST, "bad-query", "Invalid query", d),
            AdminError::NoSuchKey(d) => (StatusCode::NOT_FOUND, "no-such-key", "No such key", d),
            AdminError::MethodNotAllowed(d) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                d,
            ),
            AdminError::EncryptionOff(d) => (
                StatusCode::CONFLICT,
                "encryption-off",
                "Encryption is not configured",
                d,
            ),
            AdminError::BadResolution(d) => (
                StatusCode::BAD_REQUEST,
                "bad-resolution",
                "Invalid resolution",
                d,
            ),
            AdminError::NotUnresolved(d) => (
                StatusCode::CONFLICT,
                "not-unresolved",
                "Key not unresolved",
                d,
            ),
        }
    }

    /// The detail alone, for the console's pages.
    pub(super) fn detail(self) -> String {
        self.entry().3
    }

    /// The problem document, as `application/problem+json`.
    pub(super) fn into_response(self) -> Response<ProxyBody> {
        let (status, slug, title, detail) = self.entry();
        let body = Problem::new(status, slug, title, detail);
        super::text(
            status,
            "application/problem+json",
            serde_json::to_vec(&body).unwrap_or_default(),
        )
    }
}
