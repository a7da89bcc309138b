//! What can go wrong in a store call, said once.
//!
//! tokio-postgres and deadpool each repeat their cause in their own message ("error
//! connecting to server: X: X"), so their errors are described here as one deduplicated
//! chain and carry no `source`: a log line or a start-up error reads each cause once.

use std::error::Error;

pub use super::describe::describe;
use std::sync::Arc;
use std::time::Duration;

/// The store could not be reached or failed; the caller decides what that means.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A statement failed (or its connection did).
    #[error("PostgreSQL: {}", describe(.0))]
    Postgres(tokio_postgres::Error),
    /// No connection could be had from the pool: `target` is where it would have gone.
    #[error("cannot connect to PostgreSQL at {target}: {}", describe(.cause))]
    Connect {
        target: Arc<str>,
        cause: deadpool::managed::PoolError<super::connect_error::ConnectError>,
    },
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("unexpected row from the store: {0}")]
    Corrupt(String),
    #[error("store configuration: {0}")]
    Config(String),
    /// SQLite's own words once (its error repeats its message in its source).
    #[error("embedded store: {}", sqlite_reason(.0))]
    Sqlite(rusqlite::Error),
    /// The embedded store's file cannot be used, and why, in words an operator acts on.
    #[error("cannot use the embedded store at {}: {reason}", .path.display())]
    Open {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("embedded store task failed: {0}")]
    Blocking(String),
    #[error(
        "the database schema is at version {found}, this idemproxy needs version {needed}: run `idemproxy migrate` (or start with --migrate)"
    )]
    SchemaBehind { found: i32, needed: i32 },
    /// One error answered to every write of a batch (the store could not take any).
    #[error(transparent)]
    Shared(Arc<StoreError>),
}

impl StoreError {
    /// Whether a TLS handshake with the server failed (see
    /// `connect_error::HandshakeFailed`): a certificate to fix, not an outage to wait out.
    pub fn is_tls(&self) -> bool {
        match self {
            StoreError::Shared(e) => e.is_tls(),
            StoreError::Postgres(e) => chain_has_handshake(e),
            StoreError::Connect {
                cause: deadpool::managed::PoolError::Backend(e),
                ..
            } => e.errors().any(|e| chain_has_handshake(e)),
            _ => false,
        }
    }

    /// Whether the error says the connection it came on (and so every connection to that
    /// server) cannot serve the store any more: closed, shut down, or read-only.
    pub fn breaks_connections(&self) -> bool {
        if let StoreError::Shared(e) = self {
            return e.breaks_connections();
        }
        let StoreError::Postgres(pg) = self else {
            return false;
        };
        match pg.code() {
            None => pg.is_closed(),
            // A connection exception the server reports as an ordinary error, on a
            // connection that stays open, is about one of its own connections: a Citus
            // coordinator that cannot reach the worker holding a key. This connection
            // (and the pool) is fine; only the calls needing that worker fail.
            Some(code) if code.code().starts_with("08") => pg.is_closed() || is_fatal(pg),
            Some(code) => server_cannot_serve(code.code()),
        }
    }

    /// Whether the store could not be reached (or could not take the call now: shutting
    /// down, out of connections, read-only during a failover), as opposed to a store that
    /// answered with an error. Clients are told which: "cannot be reached" for a store
    /// that answers would send an operator looking in the wrong place.
    pub fn is_unreachable(&self) -> bool {
        if self.is_tls() {
            return false;
        }
        match self {
            StoreError::Shared(e) => e.is_unreachable(),
            StoreError::Timeout(_) => true,
            StoreError::Postgres(e) => pg_unreachable(e),
            // No host took the connection: unreachable unless a host answered with an
            // error of its own (wrong password, no such database).
            StoreError::Connect {
                cause: deadpool::managed::PoolError::Backend(e),
                ..
            } => e.errors().all(pg_unreachable),
            StoreError::Connect { .. } => true,
            StoreError::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            StoreError::Corrupt(_)
            | StoreError::Open { .. }
            | StoreError::Config(_)
            | StoreError::Blocking(_)
            | StoreError::SchemaBehind { .. } => false,
        }
    }
}

/// Whether the server ended the session with this error (`FATAL`, `PANIC`).
fn is_fatal(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        matches!(
            db.parsed_severity(),
            Some(tokio_postgres::error::Severity::Fatal | tokio_postgres::error::Severity::Panic)
        )
    })
}

/// Whether a PostgreSQL error means the server could not take the call (rather than that
/// it answered with an error of its own).
fn pg_unreachable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        // No SQLSTATE: the connection itself failed (refused, reset, closed), or the host
        // was not writable for `target_session_attrs`.
        None => true,
        // Or the server cannot take calls now, or has no room for this connection.
        Some(code) => server_cannot_serve(code.code()) || code.code() == "53300",
    }
}

/// SQLSTATEs that say the server behind a connection cannot serve the store: connection
/// exceptions (`08…`), shutting down or starting up (`57P…`), a read-only transaction
/// (`25006`: a standby, or a primary being demoted).
fn server_cannot_serve(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P") || code == "25006"
}

/// Whether a TLS handshake failure is among `e`'s causes.
pub(super) fn chain_has_handshake(e: &(dyn Error + 'static)) -> bool {
    let mut next: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(e) = next {
        if e.is::<super::connect_error::HandshakeFailed>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<super::connect_error::HandshakeFailed>())
        {
            return true;
        }
        next = e.source();
    }
    false
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e)
    }
}

/// SQLite's message for `e`, once: its failures carry the message and, as their source,
/// the same code's generic description.
pub(crate) fn sqlite_reason(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(code, Some(message)) => {
            if message.eq_ignore_ascii_case(&code.to_string()) {
                message.clone()
            } else {
                format!("{message} (SQLite error {})", code.extended_code)
            }
        }
        rusqlite::Error::SqliteFailure(code, None) => code.to_string(),
        other => other.to_string(),
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Postgres(e)
    }
}
