//! The PostgreSQL store's unresolved keys — in progress, lease run out, nobody knows
//! whether the operation happened: listed for operators, bounded by
//! `sweep.unresolved_retention`, claimed by the reconciler and given back after an
//! inconclusive probe, counted for the gauge. Found through the partial index on keys in
//! progress (`migrations/0005`), so none of this scans the table.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::PgStore;
use super::sql::*;
use crate::store::types::*;

impl PgStore {
    /// Deletes up to `batch` keys unresolved for more than `unresolved_for`, returning them.
    pub(super) async fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let ms = millis(unresolved_for);
        if self.distributed().await? {
            return self.sweep_unresolved_distributed(ms, batch).await;
        }
        self.with_client(|client| async move {
            let rows = client
                .index_walk_query(
                    &sweep_unresolved_sql(),
                    &[(&ms, Type::INT8), (&batch, Type::INT8)],
                )
                .await?;
            rows.iter().map(record).collect()
        })
        .await
    }

    /// See [`KeyStore::claim_unresolved`]: one statement; `FOR UPDATE SKIP LOCKED` makes
    /// concurrent reconcilers split the due keys, and a client's takeover racing it either
    /// wins the row first (then the key is no longer unresolved when re-checked) or finds
    /// the fresh lease.
    pub(super) async fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        if self.distributed().await? {
            return self.claim_distributed(routes, lease, limit).await;
        }
        let routes: Vec<&str> = routes.to_vec();
        let lease = millis(lease);
        self.with_client(|client| async move {
            let rows = client
                .typed_query(
                    &claim_sql(),
                    &[
                        (&routes, Type::TEXT_ARRAY),
                        (&lease, Type::INT8),
                        (&limit, Type::INT8),
                    ],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(Claim {
                        record: record(row)?,
                        unresolved_since_ms: row.try_get(RECORD_LEN)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// See [`KeyStore::defer`].
    pub(super) async fn defer(
        &self,
        fence: &Fence,
        unresolved_since_ms: i64,
        retry_in: Duration,
        answer: &str,
    ) -> Result<Fenced, StoreError> {
        let retry_in = millis(retry_in);
        self.with_client(|client| async move {
            let n = client
                .typed_execute(
                    DEFER,
                    &[
                        (&fence.client_id, Type::TEXT),
                        (&fence.key, Type::TEXT),
                        (&fence.token, Type::INT8),
                        (&unresolved_since_ms, Type::INT8),
                        (&retry_in, Type::INT8),
                        (&answer, Type::TEXT),
                    ],
                )
                .await?;
            Ok(if n > 0 {
                Fenced::Applied
            } else {
                Fenced::Refused
            })
        })
        .await
    }

    /// See [`KeyStore::unresolved_counts`].
    pub(super) async fn unresolved_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.with_client(|client| async move {
            let rows = client.index_walk_query(COUNT_UNRESOLVED, &[]).await?;
            rows.iter()
                .map(|row| {
                    let n: i64 = row.try_get(1)?;
                    Ok((row.try_get(0)?, n.max(0) as u64))
                })
                .collect()
        })
        .await
    }
}

/// Due unresolved keys of routes `$1`, claimed under a fresh token with a lease of `$2` ms,
/// at most `$3`; returns each row as it now is and when its lease had run out.
fn claim_sql() -> String {
    format!(
        "UPDATE idempotency_keys \
         SET lease_token = nextval('idempotency_lease_token_seq'), \
             locked_until = now() + $2::int8 * interval '1 millisecond' \
         FROM (SELECT client_id AS due_client, key AS due_key, locked_until AS ran_out \
               FROM idempotency_keys \
               WHERE status = 'in_progress' AND locked_until < now() AND route = ANY($1::text[]) \
                 AND (probe_after IS NULL OR probe_after <= now()) \
               ORDER BY locked_until LIMIT $3 FOR UPDATE SKIP LOCKED) due \
         WHERE client_id = due.due_client AND key = due.due_key AND status = 'in_progress' \
         RETURNING {RECORD_COLUMNS}, (extract(epoch FROM due.ran_out) * 1000)::int8"
    )
}

const DEFER: &str = "UPDATE idempotency_keys \
     SET locked_until = LEAST(to_timestamp($4::int8 / 1000.0), now()), probes = probes + 1, \
         probe_after = now() + $5::int8 * interval '1 millisecond', probe_answer = $6 \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress'";

const COUNT_UNRESOLVED: &str = "SELECT route, count(*) FROM idempotency_keys \
     WHERE status = 'in_progress' AND locked_until < now() GROUP BY route";
