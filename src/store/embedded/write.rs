//! The embedded store's writes, and its side of group commit: a batch is one `IMMEDIATE`
//! transaction and so one fsync, and a write that fails is rolled back alone while its
//! neighbours still commit (see [`write_batch`]).

use std::time::Duration;

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::store::types::*;
use crate::store::writes::{Reserve, Write, Written};

/// Runs `writes` in one transaction: the outer error when the transaction could not be
/// had or committed (nothing was written), otherwise each write's own outcome.
///
/// The writes run side by side first, with no savepoint each: a savepoint makes SQLite
/// copy every page a write touches into a sub-journal, whose first 64 KiB chunk is
/// allocated and freed again per write, and glibc hands such a free back to the kernel
/// at once (`madvise`, with a TLB shootdown on every core). Only when a write fails is
/// the transaction rolled back and run again, each write in a savepoint of its own, so
/// that the failed one is rolled back alone and its neighbours still commit.
pub(super) fn write_batch(
    conn: &mut Connection,
    writes: &[Write],
    now: i64,
) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
    if let Some(results) = write_together(conn, writes, now)? {
        return Ok(results);
    }
    let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut tokens = Tokens::default();
    let mut results = Vec::with_capacity(writes.len());
    for write in writes {
        let savepoint = tx.savepoint()?;
        match apply(&savepoint, write, now, &mut tokens) {
            Ok(written) => {
                savepoint.commit()?;
                results.push(Ok(written));
            }
            // Dropping the savepoint rolls this write back, and only this write.
            Err(e) => results.push(Err(e)),
        }
    }
    tokens.store(&tx)?;
    tx.commit()?;
    Ok(results)
}

/// The writes in one transaction with no savepoints; `None` (nothing written) when one
/// of them fails. A lone write takes this path whatever happens: its transaction is its
/// savepoint.
fn write_together(
    conn: &mut Connection,
    writes: &[Write],
    now: i64,
) -> Result<Option<Vec<Result<Written, StoreError>>>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut tokens = Tokens::default();
    let mut results = Vec::with_capacity(writes.len());
    for write in writes {
        match apply(&tx, write, now, &mut tokens) {
            Ok(written) => results.push(Ok(written)),
            Err(e) if writes.len() == 1 => return Err(e),
            // Dropping the transaction rolls back what the others wrote.
            Err(_) => return Ok(None),
        }
    }
    tokens.store(&tx)?;
    tx.commit()?;
    Ok(Some(results))
}

/// One write, inside the caller's transaction.
fn apply(
    conn: &Connection,
    write: &Write,
    now: i64,
    tokens: &mut Tokens,
) -> Result<Written, StoreError> {
    Ok(match write {
        Write::Reserve(r) => {
            let (reservation, expires_in) = reserve(conn, r, now, tokens)?;
            Written::Reservation(reservation, expires_in)
        }
        Write::Complete(fence, completion) => {
            use rusqlite::types::Value;
            let (status, headers, body, replayable, sealed_with) = match completion {
                Completion::Stored(r) => (
                    r.status,
                    Value::Blob(r.headers.to_vec()),
                    Value::Blob(r.body.to_vec()),
                    true,
                    r.sealed.as_ref().map(|s| s.ring_key.as_str()),
                ),
                Completion::NotReplayable { status } => {
                    (*status, Value::Null, Value::Null, false, None)
                }
            };
            let n = conn
                .prepare_cached(
                    "UPDATE idempotency_keys SET status = 'done', locked_until_ms = NULL, completed_ms = ?8, \
                     expires_ms = ?9, response_status = ?4, response_headers = ?5, response_body = ?6, \
                     replayable = ?7, sealed_with = ?10 \
                     WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'in_progress'",
                )?
                .execute(params![
                    fence.client_id,
                    fence.key,
                    fence.token,
                    i64::from(status),
                    headers,
                    body,
                    replayable,
                    now,
                    now.saturating_add(millis(fence.retention)),
                    sealed_with
                ])?;
            Written::Fenced(Fenced::from_rows(n as u64))
        }
        Write::Release(fence) => {
            let n = conn
                .prepare_cached(
                    "DELETE FROM idempotency_keys \
                     WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'in_progress'",
                )?
                .execute(params![fence.client_id, fence.key, fence.token])?;
            Written::Fenced(Fenced::from_rows(n as u64))
        }
    })
}

/// Lease tokens drawn within one transaction: the counter is read once, handed out from
/// here, and written back once before the commit ([`Tokens::store`]), instead of one
/// `UPDATE … RETURNING` per token (SQLite builds a temporary table for each `RETURNING`,
/// ~90 KB allocated and freed per call). A token drawn by a write that is then rolled back
/// is skipped, never handed out again; if the transaction is rolled back, so is the
/// counter, and so are the rows that carried its tokens.
#[derive(Default)]
pub(super) struct Tokens {
    /// The last token handed out, once the counter has been read.
    last: Option<i64>,
}

impl Tokens {
    /// The next token; reads the stored counter on first use.
    pub(super) fn take(&mut self, conn: &Connection) -> Result<i64, StoreError> {
        let last = match self.last {
            Some(last) => last,
            None => conn
                .prepare_cached(
                    "SELECT value FROM idempotency_counters WHERE name = 'lease_token'",
                )?
                .query_row([], |r| r.get(0))?,
        };
        let token = last
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt("the lease token counter is exhausted".into()))?;
        self.last = Some(token);
        Ok(token)
    }

    /// Writes the last token handed out back to the counter (nothing if none was drawn).
    pub(super) fn store(self, conn: &Connection) -> Result<(), StoreError> {
        if let Some(last) = self.last {
            conn.prepare_cached(
                "UPDATE idempotency_counters SET value = ?1 WHERE name = 'lease_token'",
            )?
            .execute(params![last])?;
        }
        Ok(())
    }
}

struct Existing {
    fingerprint: Vec<u8>,
    status: String,
    locked_until_ms: Option<i64>,
    response_status: Option<i64>,
    response_headers: Option<Vec<u8>>,
    response_body: Option<Vec<u8>>,
    replayable: Option<bool>,
    expires_ms: i64,
    attempts: i32,
    lease_token: i64,
    sealed_with: Option<String>,
}

/// Inserts the key in progress, takes over an expired lease, or says what the row says;
/// for a completed key also how much longer its row is kept.
fn reserve(
    conn: &Connection,
    r: &Reserve,
    now: i64,
    tokens: &mut Tokens,
) -> Result<(Reservation, Option<Duration>), StoreError> {
    let (lease, retention) = (millis(r.lease), millis(r.retention));
    let existing = conn
        .prepare_cached(
            "SELECT fingerprint, status, locked_until_ms, response_status, response_headers, response_body, replayable, \
             expires_ms, attempts, lease_token, sealed_with FROM idempotency_keys WHERE client_id = ?1 AND key = ?2",
        )?
        .query_row(params![r.client_id, r.key], |row| {
            Ok(Existing {
                fingerprint: row.get(0)?,
                status: row.get(1)?,
                locked_until_ms: row.get(2)?,
                response_status: row.get(3)?,
                response_headers: row.get(4)?,
                response_body: row.get(5)?,
                replayable: row.get(6)?,
                expires_ms: row.get(7)?,
                attempts: row.get(8)?,
                lease_token: row.get(9)?,
                sealed_with: row.get(10)?,
            })
        })
        .optional()?;
    let expires_in = existing
        .as_ref()
        .filter(|row| row.status == "done")
        .map(|row| Duration::from_millis(row.expires_ms.saturating_sub(now).max(0) as u64));
    let reservation = match existing {
        None => {
            let token = tokens.take(conn)?;
            conn.prepare_cached(
                "INSERT INTO idempotency_keys (client_id, key, route, fingerprint, status, lease_token, \
                 locked_until_ms, attempts, created_ms, expires_ms, derived_key) \
                 VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, 1, ?7, ?8, ?9)",
            )?
            .execute(params![
                r.client_id,
                r.key,
                r.route,
                r.fingerprint.as_slice(),
                token,
                now.saturating_add(lease),
                now,
                now.saturating_add(retention),
                r.derived_key
            ])?;
            Reservation::Reserved(Lease {
                token,
                attempts: 1,
                takeover: false,
                derived_key: r.derived_key.clone(),
            })
        }
        Some(row) if row.fingerprint != r.fingerprint => Reservation::Mismatch,
        Some(row) if row.status == "done" => {
            let status = row.response_status.unwrap_or_default();
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            if row.replayable == Some(false) {
                Reservation::NotReplayable { status }
            } else {
                Reservation::Done(StoredResponse {
                    status,
                    headers: Bytes::from(row.response_headers.unwrap_or_default()),
                    body: Bytes::from(row.response_body.unwrap_or_default()),
                    sealed: row.sealed_with.map(|ring_key| Seal {
                        ring_key,
                        token: row.lease_token,
                    }),
                })
            }
        }
        Some(row) if row.locked_until_ms.unwrap_or(0) >= now => Reservation::InProgress {
            lease_remaining: Duration::from_millis(
                row.locked_until_ms.unwrap_or(0).saturating_sub(now).max(0) as u64,
            ),
        },
        Some(row) if !r.takeover => Reservation::Unresolved {
            attempts: row.attempts,
        },
        Some(_) => {
            let token = tokens.take(conn)?;
            let (attempts, derived_key): (i32, Option<String>) = conn
                .prepare_cached(
                    "UPDATE idempotency_keys SET lease_token = ?3, locked_until_ms = ?4, attempts = attempts + 1, \
                     expires_ms = ?5 WHERE client_id = ?1 AND key = ?2 RETURNING attempts, derived_key",
                )?
                .query_row(
                    params![
                        r.client_id,
                        r.key,
                        token,
                        now.saturating_add(lease),
                        now.saturating_add(retention)
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )?;
            Reservation::Reserved(Lease {
                token,
                attempts,
                takeover: true,
                derived_key,
            })
        }
    };
    Ok((reservation, expires_in))
}

/// The columns [`record`] reads, in its order. The body's length is the answer's: a sealed
/// body is longer by `vault::OVERHEAD` (33, checked by a test).
/// How many columns [`RECORD_COLUMNS`] has: what a statement returns after them starts here.
pub(super) const RECORD_LEN: usize = 19;

pub(super) const RECORD_COLUMNS: &str = "client_id, key, route, status, fingerprint, lease_token, locked_until_ms, attempts, \
     response_status, length(response_body) - CASE WHEN sealed_with IS NULL THEN 0 ELSE 33 END, replayable, \
     created_ms, completed_ms, expires_ms, probes, probe_after_ms, derived_key, sealed_with, probe_answer";

/// A row as operators see it.
pub(super) fn record(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRecord> {
    let status: String = r.get(3)?;
    let locked_until: Option<i64> = r.get(6)?;
    let response_status: Option<i64> = r.get(8)?;
    Ok(KeyRecord {
        client_id: r.get(0)?,
        key: r.get(1)?,
        route: r.get(2)?,
        state: KeyState::from_row(status == "done", locked_until.map(|t| t - now_ms())),
        fingerprint: r.get(4)?,
        lease_token: r.get(5)?,
        attempts: r.get(7)?,
        response_status: response_status.and_then(|s| u16::try_from(s).ok()),
        response_body_bytes: r.get(9)?,
        replayable: r.get(10)?,
        created_at_ms: r.get(11)?,
        completed_at_ms: r.get(12)?,
        expires_at_ms: r.get(13)?,
        probes: r.get(14)?,
        probe_after_ms: r.get(15)?,
        derived_key: r.get(16)?,
        sealed_with: r.get(17)?,
        probe_answer: r.get(18)?,
    })
}

/// The machine's clock in Unix milliseconds: the embedded store's leases are measured by it.
pub(in crate::store) use crate::clock::now_ms;

#[cfg(test)]
mod tests {
    #[test]
    fn the_body_length_leaves_out_what_sealing_adds() {
        let overhead = format!("ELSE {} END", crate::vault::OVERHEAD);
        assert!(super::RECORD_COLUMNS.contains(&overhead));
    }
}
