//! The PostgreSQL store's statements, and how a row becomes a [`KeyRecord`]. Each is one
//! round trip; the reservation is the `idempotency_reserve()` function of `migrations/`.

use std::sync::LazyLock;

use crate::store::types::*;

pub(super) const RESERVE: &str = "SELECT o_outcome, o_lease_token, o_attempts, o_lease_remaining_ms, \
     o_response_status, o_response_headers, o_response_body, o_replayable, o_expires_in_ms, \
     o_derived_key, o_sealed_with \
     FROM idempotency_reserve($1, $2, $3, $4, $5, $6, $7, $8, p_reads_sealed => true)";

pub(super) const RENEW: &str = "UPDATE idempotency_keys \
     SET locked_until = now() + $4::int8 * interval '1 millisecond' \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress'";

/// Completion and release wake waiting duplicates in the same statement (and so the same
/// round trip) when `$5`/`$9` says someone may wait; `NOTIFY` is delivered at commit.
pub(super) const COMPLETE: &str = "WITH done AS ( \
       UPDATE idempotency_keys \
       SET status = 'done', locked_until = NULL, completed_at = now(), \
           expires_at = now() + $10::int8 * interval '1 millisecond', \
           response_status = $6, response_headers = $7, response_body = $8, replayable = $9, \
           sealed_with = $11 \
       WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress' \
       RETURNING 1) \
     SELECT (SELECT count(*) FROM done), \
            (SELECT pg_notify('idemproxy_done', $4) FROM done WHERE $5 LIMIT 1)::text";

pub(super) const RELEASE: &str = "WITH gone AS ( \
       DELETE FROM idempotency_keys \
       WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress' \
       RETURNING 1) \
     SELECT (SELECT count(*) FROM gone), \
            (SELECT pg_notify('idemproxy_done', $4) FROM gone WHERE $5 LIMIT 1)::text";

/// [`COMPLETE`], [`RELEASE`] and [`EVICT`] on a distributed table (`distributed`): the same
/// parameters and answer, with the notification's payload returned instead of raised on
/// the worker, for the store to raise on the coordinator.
pub(super) static COMPLETE_DISTRIBUTED: LazyLock<String> =
    LazyLock::new(|| COMPLETE.replace("pg_notify('idemproxy_done', $4)", "$4"));
pub(super) static RELEASE_DISTRIBUTED: LazyLock<String> =
    LazyLock::new(|| RELEASE.replace("pg_notify('idemproxy_done', $4)", "$4"));
pub(super) static EVICT_DISTRIBUTED: LazyLock<String> =
    LazyLock::new(|| EVICT.replace("pg_notify('idemproxy_evicted', $3)", "$3"));

/// How many columns [`RECORD_COLUMNS`] has: what a statement returns after them starts here.
pub(super) const RECORD_LEN: usize = 19;

/// The body's length is the answer's: a sealed body is longer by `vault::OVERHEAD` (33,
/// checked by a test).
pub(super) const RECORD_COLUMNS: &str = "client_id, key, route, status, fingerprint, lease_token, \
     (extract(epoch FROM locked_until - now()) * 1000)::int8, attempts, response_status, \
     (length(response_body) - CASE WHEN sealed_with IS NULL THEN 0 ELSE 33 END)::int8, replayable, (extract(epoch FROM created_at) * 1000)::int8, \
     (extract(epoch FROM completed_at) * 1000)::int8, (extract(epoch FROM expires_at) * 1000)::int8, \
     probes, (extract(epoch FROM probe_after) * 1000)::int8, derived_key, sealed_with, probe_answer";

/// An eviction tells every replica's replay cache (`$3`: the key's id) in the same round
/// trip.
pub(super) const EVICT: &str = "WITH gone AS ( \
       DELETE FROM idempotency_keys WHERE client_id = $1 AND key = $2 RETURNING 1) \
     SELECT (SELECT count(*) FROM gone), \
            (SELECT pg_notify('idemproxy_evicted', $3) FROM gone LIMIT 1)::text";

/// Rows are picked with `SKIP LOCKED`, so concurrent sweepers (replicas) split the work
/// instead of waiting on each other, and each row is deleted once. Completed rows only:
/// `expires_at` of a completed row counts from its completion.
pub(super) const SWEEP: &str = "DELETE FROM idempotency_keys WHERE ctid IN ( \
       SELECT ctid FROM idempotency_keys \
       WHERE expires_at < now() AND status = 'done' \
       LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Unresolved keys whose lease ran out more than `$1` ms ago (`sweep.unresolved_retention`).
pub(super) fn sweep_unresolved_sql() -> String {
    format!(
        "DELETE FROM idempotency_keys WHERE ctid IN ( \
           SELECT ctid FROM idempotency_keys \
           WHERE status = 'in_progress' AND locked_until < now() - $1::int8 * interval '1 millisecond' \
           LIMIT $2 FOR UPDATE SKIP LOCKED) \
         RETURNING {RECORD_COLUMNS}"
    )
}

/// A reservation's answer, in `idempotency_reserve()`'s eleven columns from column `at`, and
/// for a completed key how much longer its row is kept.
pub(super) fn reservation(
    row: &tokio_postgres::Row,
    at: usize,
) -> Result<(Reservation, Option<std::time::Duration>), StoreError> {
    let outcome: &str = row.try_get(at)?;
    let expires_in = row
        .try_get::<_, Option<i64>>(at + 8)?
        .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64));
    let reservation = match outcome {
        "reserved" | "taken_over" => Reservation::Reserved(Lease {
            token: row.try_get(at + 1)?,
            attempts: row.try_get(at + 2)?,
            takeover: outcome == "taken_over",
            derived_key: row.try_get(at + 9)?,
        }),
        "in_progress" => {
            let ms: i64 = row.try_get(at + 3)?;
            Reservation::InProgress {
                lease_remaining: std::time::Duration::from_millis(ms.max(0) as u64),
            }
        }
        "mismatch" => Reservation::Mismatch,
        "unresolved" => Reservation::Unresolved {
            attempts: row.try_get(at + 2)?,
        },
        "done" => {
            let status: i16 = row.try_get(at + 4)?;
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            if row.try_get::<_, Option<bool>>(at + 7)? == Some(false) {
                Reservation::NotReplayable { status }
            } else {
                let headers: Option<Vec<u8>> = row.try_get(at + 5)?;
                let body: Option<Vec<u8>> = row.try_get(at + 6)?;
                let sealed_with: Option<String> = row.try_get(at + 10)?;
                let sealed = match sealed_with {
                    Some(ring_key) => Some(Seal {
                        ring_key,
                        token: row.try_get(at + 1)?,
                    }),
                    None => None,
                };
                Reservation::Done(StoredResponse {
                    status,
                    headers: headers.unwrap_or_default().into(),
                    body: body.unwrap_or_default().into(),
                    sealed,
                })
            }
        }
        other => return Err(StoreError::Corrupt(format!("reserve outcome `{other}`"))),
    };
    Ok((reservation, expires_in))
}

pub(super) fn record(r: &tokio_postgres::Row) -> Result<KeyRecord, StoreError> {
    let status: Option<i16> = r.try_get(8)?;
    let status = status
        .map(|s| u16::try_from(s).map_err(|_| StoreError::Corrupt(format!("status {s}"))))
        .transpose()?;
    let done = r.try_get::<_, String>(3)? == "done";
    Ok(KeyRecord {
        client_id: r.try_get(0)?,
        key: r.try_get(1)?,
        route: r.try_get(2)?,
        state: KeyState::from_row(done, if done { None } else { r.try_get(6)? }),
        fingerprint: r.try_get(4)?,
        lease_token: r.try_get(5)?,
        attempts: r.try_get(7)?,
        response_status: status,
        response_body_bytes: r.try_get(9)?,
        replayable: r.try_get(10)?,
        created_at_ms: r.try_get(11)?,
        completed_at_ms: r.try_get(12)?,
        expires_at_ms: r.try_get(13)?,
        probes: r.try_get(14)?,
        probe_after_ms: r.try_get(15)?,
        derived_key: r.try_get(16)?,
        sealed_with: r.try_get(17)?,
        probe_answer: r.try_get(18)?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_body_length_leaves_out_what_sealing_adds() {
        let overhead = format!("ELSE {} END", crate::vault::OVERHEAD);
        assert!(super::RECORD_COLUMNS.contains(&overhead));
    }

    #[test]
    fn distributed_writes_return_the_notification_instead_of_raising_it() {
        for sql in [
            &*super::COMPLETE_DISTRIBUTED,
            &*super::RELEASE_DISTRIBUTED,
            &*super::EVICT_DISTRIBUTED,
        ] {
            assert!(!sql.contains("pg_notify"), "{sql}");
        }
    }
}
