//! Opening the store file, and saying why it cannot be opened in words an operator acts
//! on: which file, and what to do — not SQLite's code.
//!
//! The file is marked as idemproxy's (SQLite's `application_id`), and a database that is
//! not ours is refused rather than having our tables added to it: a path pointed by
//! mistake at another application's database must not change that database.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};

use super::schema;
use crate::store::error::sqlite_reason;
use crate::store::types::StoreError;

/// SQLite's page cache (see [`connect`]).
const CACHE_KIB: i64 = 1024;

/// "IDPX": what `PRAGMA application_id` says in idemproxy's store files.
pub(super) const APPLICATION_ID: i32 = 0x4944_5058;

/// The tables an idemproxy store file holds (any version).
const OUR_TABLES: [&str; 3] = [
    "idempotency_keys",
    "idempotency_counters",
    "idemproxy_settings",
];

/// Opens `path` (creating it if needed) and brings its schema up to date; an error names
/// the file and the cause.
pub(super) fn connect(path: &Path, timeout: Duration) -> Result<Connection, StoreError> {
    let open = || -> Result<Connection, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(timeout)?;
        ensure_ours(&conn)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        // A deleted or rewritten answer is overwritten in the file, not left in free
        // space: a swept answer is gone, and one resealed by `rekey` leaves no clear copy.
        conn.pragma_update(None, "secure_delete", "ON")?;
        // SQLite's page cache, in KiB (negative: a size, not a page count): the upper
        // levels of the key index stay in it, and the rest of the file is in the OS's
        // page cache anyway. Half SQLite's default of 2 MiB: measured, no slower.
        conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
        schema::bring_up_to_date(&conn, path)?;
        Ok(conn)
    };
    open().map_err(|e| explain(path, e))
}

/// Refuses a database another application made; marks a new (or an older idemproxy's)
/// file as ours.
fn ensure_ours(conn: &Connection) -> Result<(), StoreError> {
    let id: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    if id == APPLICATION_ID {
        return Ok(());
    }
    let mut tables = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )?;
    for name in stmt.query_map([], |r| r.get::<_, String>(0))? {
        tables.push(name?);
    }
    let foreign: Vec<&str> = tables
        .iter()
        .map(String::as_str)
        .filter(|t| !OUR_TABLES.contains(t))
        .collect();
    let ours = tables.is_empty() || tables.iter().any(|t| t == "idempotency_keys");
    if id != 0 || !foreign.is_empty() || !ours {
        let mut shown: Vec<&str> = foreign.iter().copied().take(5).collect();
        if shown.is_empty() {
            shown = tables.iter().map(String::as_str).take(5).collect();
        }
        return Err(StoreError::Config(format!(
            "it is another application's SQLite database (application_id {id:#x}, tables: {}); idemproxy does not add its tables to a database it did not create: set store.embedded.path to a file of its own",
            if shown.is_empty() {
                "none".to_owned()
            } else {
                shown.join(", ")
            }
        )));
    }
    conn.pragma_update(None, "application_id", APPLICATION_ID)?;
    Ok(())
}

/// `e`, which opening `path` failed with, as the operator reads it.
fn explain(path: &Path, e: StoreError) -> StoreError {
    let reason = match &e {
        StoreError::Config(why) => why.clone(),
        StoreError::Sqlite(sqlite) => match sqlite.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) => {
                "it is not an SQLite database (another program's file?): set store.embedded.path to a new file or to idemproxy's own store".to_owned()
            }
            Some(ErrorCode::DiskFull) => {
                "the volume it is on is full: free space there, or move the store".to_owned()
            }
            Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen) => unwritable(path, sqlite),
            _ => sqlite_reason(sqlite),
        },
        _ => return e,
    };
    StoreError::Open {
        path: path.to_owned(),
        reason,
    }
}

/// Why a store file cannot be written: SQLite also creates `-wal` and `-shm` files beside
/// it, so a writable file in a directory the proxy cannot write fails as "read-only".
fn unwritable(path: &Path, e: &rusqlite::Error) -> String {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".idemproxy-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            format!(
                "{} (the file or its -wal/-shm companions are not writable: check their owner and mode)",
                sqlite_reason(e)
            )
        }
        Err(io) => format!(
            "the directory {} cannot be written ({io}): SQLite must create the store's -wal and -shm files beside it; make the directory writable for the proxy's user, or move the store",
            dir.display()
        ),
    }
}
