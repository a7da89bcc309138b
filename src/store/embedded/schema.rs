//! The embedded store's schema: its versions, each the SQLite counterpart of one or more of
//! PostgreSQL's migrations (`migrations/`), and how a file is brought up to date when it is
//! opened. The version is the file's `user_version`; each step and its version go in one
//! transaction, so a crash leaves one or the other.

use std::path::Path;

use rusqlite::Connection;

use crate::store::types::StoreError;

/// The version this binary writes and understands.
const SCHEMA_VERSION: i32 = 6;

/// Version 1: the key table, its index for the sweep, and the lease-token counter.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_keys (
    client_id        TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    route            TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('in_progress', 'done')),
    lease_token      INTEGER NOT NULL,
    locked_until_ms  INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 1,
    response_status  INTEGER,
    response_headers BLOB,
    response_body    BLOB,
    replayable       INTEGER,
    created_ms       INTEGER NOT NULL,
    completed_ms     INTEGER,
    expires_ms       INTEGER NOT NULL,
    PRIMARY KEY (client_id, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires ON idempotency_keys (expires_ms);
-- Lease tokens are never reused, even after a key is released and reserved again.
CREATE TABLE IF NOT EXISTS idempotency_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO idempotency_counters (name, value) VALUES ('lease_token', 0);
";

/// Version 2: the reconciler's bookkeeping (inconclusive probes, backoff) and the keys in
/// progress by lease end, so that unresolved keys are found without a table scan.
const SCHEMA_2: &str = "
ALTER TABLE idempotency_keys ADD COLUMN probes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idempotency_keys ADD COLUMN probe_after_ms INTEGER;
CREATE INDEX idempotency_keys_unresolved ON idempotency_keys (locked_until_ms)
    WHERE status = 'in_progress';
";

/// Version 3: the derived key a reservation sent, when it is not the plain one.
const SCHEMA_3: &str = "ALTER TABLE idempotency_keys ADD COLUMN derived_key TEXT;";

/// Version 4: the ring key a stored answer is sealed with (NULL: in clear).
const SCHEMA_4: &str = "ALTER TABLE idempotency_keys ADD COLUMN sealed_with TEXT;";

/// Version 5: settings kept with the keys — the form keys are stored in (see
/// [`crate::store::SettleKeyForm`]).
const SCHEMA_5: &str =
    "CREATE TABLE idemproxy_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);";

/// Version 6: what the recovery probe last answered for an unresolved key (0012).
const SCHEMA_6: &str = "ALTER TABLE idempotency_keys ADD COLUMN probe_answer TEXT;";

/// Applies every version `conn`'s file does not have yet; refuses a file from a newer
/// idemproxy.
pub(super) fn bring_up_to_date(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let version: i32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Corrupt(format!(
            "{} has schema version {version}, newer than this idemproxy understands ({SCHEMA_VERSION})",
            path.display()
        )));
    }
    // Each step and its version in one transaction: a crash leaves one or the other.
    let steps = [SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6];
    for (step, sql) in (1..).zip(steps) {
        if version < step {
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {sql} PRAGMA user_version = {step}; COMMIT;"
            ))?;
        }
    }
    Ok(())
}
