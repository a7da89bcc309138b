//! The key table distributed by Citus (`docs/stores.md#past-one-primary-citus`): which layout
//! the store runs on, and the statements that take another shape there.
//!
//! Citus runs a statement that names one `client_id` on the worker holding that key's shard
//! (a router query) and refuses what it cannot spread over shards: `FOR UPDATE` on a
//! query over every shard, a volatile function in a distributed `UPDATE`, a stable one
//! with column references in its `SET` (the set-based batch). So on a distributed table:
//! - writes go one statement each, concurrently, instead of through `idempotency_batch()`
//!   (one router statement per write; a batch would be a distributed transaction);
//! - a notification is sent from the coordinator after the write, not inside it: inside,
//!   it would be raised on the worker, where nobody listens;
//! - the sweeps pick their rows with a subquery instead of `SKIP LOCKED`, and repeat its
//!   conditions on the row they delete, so concurrent sweepers still delete each row once;
//! - the reconciler's claim takes its tokens first and claims each key with its own
//!   statement, which applies only while the row's lease end is the one it saw.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio_postgres::types::Type;

use super::PgStore;
use super::distribute::HAS_CITUS;
use super::sql::*;
use crate::store::types::*;
use crate::store::writes::{Write, Written};

/// Where the key table lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// One PostgreSQL (or a Citus node where the table is not distributed).
    Single,
    /// Distributed by Citus across workers.
    Distributed,
}

/// The layout as last looked up: 0 not yet, 1 single, 2 distributed; and the turn to
/// look it up, so that a burst of first calls makes one lookup, not one each.
#[derive(Default)]
pub(super) struct KnownLayout(AtomicU8, tokio::sync::Mutex<()>);

impl KnownLayout {
    fn get(&self) -> Option<Layout> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Layout::Single),
            2 => Some(Layout::Distributed),
            _ => None,
        }
    }

    fn set(&self, layout: Layout) {
        let v = match layout {
            Layout::Single => 1,
            Layout::Distributed => 2,
        };
        self.0.store(v, Ordering::Relaxed);
    }

    /// Looked up again on the next call: after a statement the server refused, since the
    /// table may have been distributed while this process ran.
    pub(super) fn forget(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

const IS_DISTRIBUTED: &str = "SELECT EXISTS (SELECT 1 FROM pg_dist_partition \
     WHERE logicalrelid = to_regclass('idempotency_keys'))";

/// What a sweep of completed keys past their retention deletes, at most `$1`.
const SWEEP_DISTRIBUTED: &str = "DELETE FROM idempotency_keys \
     WHERE (client_id, key) IN ( \
       SELECT client_id, key FROM idempotency_keys \
       WHERE expires_at < now() AND status = 'done' LIMIT $1) \
     AND expires_at < now() AND status = 'done'";

/// Unresolved keys past `$1` ms, at most `$2`. The rows' columns are computed outside the
/// `DELETE` (here and in the claim): Citus refuses a function that is not immutable in a
/// distributed statement's `RETURNING`.
fn sweep_unresolved_distributed_sql() -> String {
    format!(
        "WITH gone AS ( \
           DELETE FROM idempotency_keys \
           WHERE (client_id, key) IN ( \
             SELECT client_id, key FROM idempotency_keys \
             WHERE status = 'in_progress' AND locked_until < now() - $1::int8 * interval '1 millisecond' \
             LIMIT $2) \
           AND status = 'in_progress' AND locked_until < now() - $1::int8 * interval '1 millisecond' \
           RETURNING *) \
         SELECT {RECORD_COLUMNS} FROM gone"
    )
}

/// Due unresolved keys of routes `$1`, at most `$2`, with their lease end in microseconds.
const DUE: &str = "SELECT client_id, key, (extract(epoch FROM locked_until) * 1000000)::int8 \
     FROM idempotency_keys \
     WHERE status = 'in_progress' AND locked_until < now() AND route = ANY($1::text[]) \
       AND (probe_after IS NULL OR probe_after <= now()) \
     ORDER BY locked_until LIMIT $2";

const TOKENS: &str =
    "SELECT nextval('idempotency_lease_token_seq') FROM generate_series(1, $1::int8)";

/// Claims one due key under token `$3` with a lease of `$4` ms, while its lease end is
/// still `$5` (µs since the epoch; the comparison computes no function of a column, which
/// Citus refuses in a distributed `UPDATE`): whoever changed the row since (a client's
/// takeover, another reconciler) has it, and this claim applies to nothing.
fn claim_one_sql() -> String {
    format!(
        "WITH claimed AS ( \
           UPDATE idempotency_keys \
           SET lease_token = $3, locked_until = now() + $4::int8 * interval '1 millisecond' \
           WHERE client_id = $1 AND key = $2 AND status = 'in_progress' \
             AND locked_until = timestamptz 'epoch' + $5::int8 * interval '1 microsecond' \
             AND locked_until < now() AND (probe_after IS NULL OR probe_after <= now()) \
           RETURNING *) \
         SELECT {RECORD_COLUMNS}, $5 / 1000 FROM claimed"
    )
}

impl PgStore {
    /// The key table's layout: looked up on the first call, kept until [`KnownLayout::forget`].
    pub(super) async fn layout(&self) -> Result<Layout, StoreError> {
        if let Some(layout) = self.layout.get() {
            return Ok(layout);
        }
        let turn = tokio::time::timeout(self.timeout, self.layout.1.lock())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?;
        if let Some(layout) = self.layout.get() {
            return Ok(layout);
        }
        // On a connection of its own, closed after: the pool's stay as a call would find
        // them (the first call's bound covers opening its connection, as before).
        let lookup =
            async {
                let client = self.lanes.connector().connect().await.map_err(|cause| {
                    StoreError::Connect {
                        target: std::sync::Arc::clone(&self.target),
                        cause: deadpool::managed::PoolError::Backend(cause),
                    }
                })?;
                let citus: bool = client
                    .typed_query(HAS_CITUS, &[])
                    .await?
                    .first()
                    .ok_or_else(|| StoreError::Corrupt("no row from a layout query".into()))?
                    .try_get(0)?;
                if !citus {
                    return Ok::<_, StoreError>(Layout::Single);
                }
                let rows = client.typed_query(IS_DISTRIBUTED, &[]).await?;
                let distributed: bool = rows
                    .first()
                    .ok_or_else(|| StoreError::Corrupt("no row from a layout query".into()))?
                    .try_get(0)?;
                Ok(if distributed {
                    Layout::Distributed
                } else {
                    Layout::Single
                })
            };
        let layout = tokio::time::timeout(self.timeout, lookup)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        if self.layout.get() != Some(layout) {
            tracing::info!(?layout, "the key table's layout");
        }
        self.layout.set(layout);
        drop(turn);
        Ok(layout)
    }

    /// Whether writes go one statement each (see the module doc).
    pub(super) async fn distributed(&self) -> Result<bool, StoreError> {
        Ok(self.layout().await? == Layout::Distributed)
    }

    /// Each write in a statement of its own (a distributed table's batch): the writes of
    /// different keys all at once, those of one key one after another, completions and
    /// releases before reservations — the order `idempotency_batch()` gives them.
    pub(super) async fn write_each(&self, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
        let n = writes.len();
        let mut by_key: Vec<Vec<(usize, Write)>> = Vec::new();
        for (i, write) in writes.into_iter().enumerate() {
            let row = write.row();
            match by_key.iter_mut().find(|g| g[0].1.row() == row) {
                Some(group) => group.push((i, write)),
                None => by_key.push(vec![(i, write)]),
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for mut group in by_key {
            group.sort_by_key(|(_, w)| matches!(w, Write::Reserve(_)));
            let store = self.clone();
            set.spawn(async move {
                let mut done = Vec::with_capacity(group.len());
                for (i, write) in group {
                    done.push((i, store.write_one(&write).await));
                }
                done
            });
        }
        let mut results: Vec<Option<Result<Written, StoreError>>> = (0..n).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            for (i, result) in joined.unwrap_or_default() {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::Corrupt("a write's task ended".into()))))
            .collect()
    }

    /// Raises `payload` on `channel` from the coordinator, where the replicas listen.
    /// A lost notification costs a waiter its next look (within a second), not an answer.
    pub(super) async fn notify_from_here(&self, channel: &str, payload: &str) {
        let sent = self
            .with_client(|client| async move {
                client
                    .typed_query(
                        "SELECT pg_notify($1, $2)::text",
                        &[(&channel, Type::TEXT), (&payload, Type::TEXT)],
                    )
                    .await?;
                Ok(())
            })
            .await;
        if let Err(e) = sent {
            tracing::warn!(cause = %e, channel, "a notification was not sent; waiters look again on their own");
        }
    }

    pub(super) async fn sweep_distributed(&self, batch: i64) -> Result<u64, StoreError> {
        self.with_client(|client| async move {
            Ok(client
                .typed_execute(SWEEP_DISTRIBUTED, &[(&batch, Type::INT8)])
                .await?)
        })
        .await
    }

    pub(super) async fn sweep_unresolved_distributed(
        &self,
        ms: i64,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        self.with_client(|client| async move {
            let rows = client
                .typed_query(
                    &sweep_unresolved_distributed_sql(),
                    &[(&ms, Type::INT8), (&batch, Type::INT8)],
                )
                .await?;
            rows.iter().map(record).collect()
        })
        .await
    }

    /// See [`crate::store::Maintenance::claim_unresolved`], in the module doc's shape.
    pub(super) async fn claim_distributed(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        let routes: Vec<&str> = routes.to_vec();
        let lease = millis(lease);
        self.with_client(|client| async move {
            let due = client
                .typed_query(DUE, &[(&routes, Type::TEXT_ARRAY), (&limit, Type::INT8)])
                .await?;
            if due.is_empty() {
                return Ok(Vec::new());
            }
            let n = due.len() as i64;
            let tokens = client.typed_query(TOKENS, &[(&n, Type::INT8)]).await?;
            let claim = claim_one_sql();
            let mut claims = Vec::with_capacity(due.len());
            for (row, token) in due.iter().zip(&tokens) {
                let client_id: &str = row.try_get(0)?;
                let key: &str = row.try_get(1)?;
                let ran_out_us: i64 = row.try_get(2)?;
                let token: i64 = token.try_get(0)?;
                let claimed = client
                    .typed_query(
                        &claim,
                        &[
                            (&client_id, Type::TEXT),
                            (&key, Type::TEXT),
                            (&token, Type::INT8),
                            (&lease, Type::INT8),
                            (&ran_out_us, Type::INT8),
                        ],
                    )
                    .await?;
                for row in &claimed {
                    claims.push(Claim {
                        record: record(row)?,
                        unresolved_since_ms: row.try_get(RECORD_LEN)?,
                    });
                }
            }
            Ok(claims)
        })
        .await
    }
}
