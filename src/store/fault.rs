//! Faults of the store itself — its disk full, its memory exhausted, its server starting
//! up or gone — told apart from a statement's own error, because an operator acts on them
//! (free space, restart the server) and readiness must say so while they last.

use super::error::StoreError;

/// A store fault an operator acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No room to write: SQLite's `SQLITE_FULL`, PostgreSQL's `53100`.
    DiskFull,
    /// The store ran out of memory: `SQLITE_NOMEM`, PostgreSQL's `53200`.
    OutOfMemory,
    /// The server is starting up (or recovering after a crash): PostgreSQL's `57P03`.
    StartingUp,
    /// The server is gone: shut down, crashed (`57P01`, `57P02`), or not accepting
    /// connections. PostgreSQL does not restart by itself after a PANIC (a full WAL disk).
    Down,
    /// The embedded store's files cannot be written (read-only, or cannot be opened).
    Unwritable,
}

impl Fault {
    /// Stable label, for metrics and log fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::DiskFull => "disk_full",
            Fault::OutOfMemory => "out_of_memory",
            Fault::StartingUp => "starting_up",
            Fault::Down => "down",
            Fault::Unwritable => "unwritable",
        }
    }

    /// Every fault, for series that exist from the start.
    pub const ALL: [Fault; 5] = [
        Fault::DiskFull,
        Fault::OutOfMemory,
        Fault::StartingUp,
        Fault::Down,
        Fault::Unwritable,
    ];

    /// What to do about it, for the log line an operator reads.
    pub fn advice(self) -> &'static str {
        match self {
            Fault::DiskFull => {
                "new keys are refused with 503 and nothing is forwarded, stored answers keep replaying; free space on the store's volume (PostgreSQL: its data or WAL directory) — service resumes by itself"
            }
            Fault::OutOfMemory => {
                "new keys are refused with 503 and nothing is forwarded; the store's server is out of memory"
            }
            Fault::StartingUp => {
                "new keys are refused with 503 until the server has started (or finished crash recovery)"
            }
            Fault::Down => {
                "new keys are refused with 503 and nothing is forwarded; the store's server is down — after a PANIC (e.g. a full WAL disk) PostgreSQL stays down until it is restarted"
            }
            Fault::Unwritable => {
                "new keys are refused with 503 and nothing is forwarded; the store's files cannot be written (permissions, a read-only volume)"
            }
        }
    }
}

impl StoreError {
    /// The store fault this error shows, if it shows one; `None`: a statement's own error,
    /// or a passing one (a timeout, a pool with no free connection).
    pub fn fault(&self) -> Option<Fault> {
        match self {
            StoreError::Shared(e) => e.fault(),
            StoreError::Postgres(e) => pg_fault(e),
            StoreError::Connect {
                cause: deadpool::managed::PoolError::Backend(e),
                ..
            } => {
                let errors: Vec<_> = e.errors().collect();
                // The most telling of the hosts' answers; a host that timed out says
                // nothing.
                errors
                    .iter()
                    .filter_map(|e| pg_fault(e))
                    .find(|f| *f != Fault::Down)
                    .or_else(|| errors.iter().find_map(|e| pg_fault(e)))
            }
            StoreError::Sqlite(e) => match e.sqlite_error_code()? {
                rusqlite::ErrorCode::DiskFull => Some(Fault::DiskFull),
                rusqlite::ErrorCode::OutOfMemory => Some(Fault::OutOfMemory),
                rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen => {
                    Some(Fault::Unwritable)
                }
                _ => None,
            },
            StoreError::Connect { .. }
            | StoreError::Open { .. }
            | StoreError::Timeout(_)
            | StoreError::Corrupt(_)
            | StoreError::Config(_)
            | StoreError::Blocking(_)
            | StoreError::SchemaBehind { .. } => None,
        }
    }

    /// The server's SQLSTATE, when PostgreSQL gave one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            StoreError::Shared(e) => e.sqlstate(),
            StoreError::Postgres(e) => e.code().map(|c| c.code()),
            StoreError::Connect {
                cause: deadpool::managed::PoolError::Backend(e),
                ..
            } => e.errors().find_map(|e| e.code().map(|c| c.code())),
            _ => None,
        }
    }

    /// Where the failed call went, when the error says (the hosts a connection was tried
    /// on).
    pub fn target(&self) -> Option<String> {
        match self {
            StoreError::Shared(e) => e.target(),
            StoreError::Connect { target, .. } => Some(target.to_string()),
            _ => None,
        }
    }

    /// Which store said it: `postgres` or `embedded` (`None` when the error does not tell).
    pub fn backend(&self) -> Option<&'static str> {
        match self {
            StoreError::Shared(e) => e.backend(),
            StoreError::Postgres(_) | StoreError::Connect { .. } => Some("postgres"),
            StoreError::Sqlite(_) => Some("embedded"),
            _ => None,
        }
    }
}

/// The fault a PostgreSQL error shows.
fn pg_fault(e: &tokio_postgres::Error) -> Option<Fault> {
    match e.code().map(|c| c.code()) {
        Some("53100") => Some(Fault::DiskFull),
        Some("53200") => Some(Fault::OutOfMemory),
        Some("57P03") => Some(Fault::StartingUp),
        Some("57P01" | "57P02") => Some(Fault::Down),
        Some(code) if code.starts_with("08") => Some(Fault::Down),
        Some(_) => None,
        // No SQLSTATE: the connection itself failed (refused, reset, closed) — or the
        // client could not use a row, which is no fault of the server's.
        None => (e.is_closed() || io_cause(e)).then_some(Fault::Down),
    }
}

/// Whether an I/O error (refused, reset) is among `e`'s causes.
fn io_cause(e: &tokio_postgres::Error) -> bool {
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        if cause.is::<std::io::Error>() {
            return true;
        }
        next = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(code: i32) -> StoreError {
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            None,
        ))
    }

    /// SQLite's codes map to the faults an operator acts on; a statement's own error, a
    /// timeout or a busy file is no fault.
    #[test]
    fn sqlite_codes_are_classified() {
        assert_eq!(sqlite(13).fault(), Some(Fault::DiskFull));
        assert_eq!(sqlite(7).fault(), Some(Fault::OutOfMemory));
        assert_eq!(sqlite(8).fault(), Some(Fault::Unwritable));
        assert_eq!(sqlite(19).fault(), None, "a constraint is the statement's");
        assert_eq!(sqlite(5).fault(), None, "busy passes");
        assert_eq!(
            StoreError::Timeout(std::time::Duration::from_secs(1)).fault(),
            None
        );
        let shared = StoreError::Shared(std::sync::Arc::new(sqlite(13)));
        assert_eq!(shared.fault(), Some(Fault::DiskFull));
        assert_eq!(shared.backend(), Some("embedded"));
    }

    /// The message says SQLite's cause once, not the message and its source's repeat.
    #[test]
    fn sqlite_cause_once() {
        let e = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(13),
            Some("database or disk is full".into()),
        ));
        let text = crate::store::describe(&e);
        assert_eq!(text.matches("disk is full").count(), 1, "{text}");
    }
}
