//! The embedded store's unresolved keys — in progress, lease run out, nobody knows
//! whether the operation happened: listed for operators, bounded by
//! `sweep.unresolved_retention`, claimed by the reconciler and given back after an
//! inconclusive probe, counted for the gauge. Found through the partial index on keys in
//! progress (schema version 2).

use std::time::Duration;

use rusqlite::{TransactionBehavior, params};

use super::EmbeddedStore;
use super::write::{RECORD_COLUMNS, Tokens, now_ms, record};
use crate::store::types::*;

impl EmbeddedStore {
    /// Deletes up to `batch` keys unresolved for more than `unresolved_for`, returning them.
    pub(super) async fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let before = now_ms().saturating_sub(millis(unresolved_for));
        self.call(move |conn| {
            let sql = format!(
                "DELETE FROM idempotency_keys WHERE rowid IN ( \
                   SELECT rowid FROM idempotency_keys \
                   WHERE status = 'in_progress' AND locked_until_ms < ?1 LIMIT ?2) \
                 RETURNING {RECORD_COLUMNS}"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(params![before, batch], record)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// See [`KeyStore::claim_unresolved`]: one transaction, so no other writer (a client's
    /// takeover included) sees a key half claimed.
    pub(super) async fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        let routes = serde_json::to_string(routes).unwrap_or_else(|_| "[]".into());
        let lease = millis(lease);
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let due: Vec<(i64, i64)> = tx
                .prepare_cached(
                    "SELECT rowid, locked_until_ms FROM idempotency_keys \
                     WHERE status = 'in_progress' AND locked_until_ms < ?1 \
                       AND route IN (SELECT value FROM json_each(?2)) \
                       AND (probe_after_ms IS NULL OR probe_after_ms <= ?1) \
                     ORDER BY locked_until_ms LIMIT ?3",
                )?
                .query_map(params![now, routes, limit], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let mut claims = Vec::with_capacity(due.len());
            let mut tokens = Tokens::default();
            for (rowid, ran_out) in due {
                let token = tokens.take(&tx)?;
                tx.prepare_cached(
                    "UPDATE idempotency_keys SET lease_token = ?2, locked_until_ms = ?3 WHERE rowid = ?1",
                )?
                .execute(params![rowid, token, now.saturating_add(lease)])?;
                let sql = format!("SELECT {RECORD_COLUMNS} FROM idempotency_keys WHERE rowid = ?1");
                let record = tx.prepare_cached(&sql)?.query_row(params![rowid], record)?;
                claims.push(Claim {
                    record,
                    unresolved_since_ms: ran_out,
                });
            }
            tokens.store(&tx)?;
            tx.commit()?;
            Ok(claims)
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
        let fence = fence.clone();
        let retry_in = millis(retry_in);
        let answer = answer.to_owned();
        self.call(move |conn| {
            let now = now_ms();
            let n = conn.execute(
                "UPDATE idempotency_keys SET locked_until_ms = min(?4, ?5), probes = probes + 1, \
                 probe_after_ms = ?6, probe_answer = ?7 \
                 WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'in_progress'",
                params![
                    fence.client_id,
                    fence.key,
                    fence.token,
                    unresolved_since_ms,
                    now,
                    now.saturating_add(retry_in),
                    answer
                ],
            )?;
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
        self.call(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT route, count(*) FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until_ms < ?1 GROUP BY route",
            )?;
            let rows = stmt.query_map(params![now_ms()], |r| {
                let n: i64 = r.get(1)?;
                Ok((r.get(0)?, n.max(0) as u64))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}
