//! Retention: completed keys are deleted their route's retention after they completed.
//! Unresolved keys (in progress, lease run out: nobody knows whether the operation
//! happened) are never deleted silently — forgetting one would let a late retry execute
//! again — unless the operator bounds them with `sweep.unresolved_retention`, and then each
//! is logged at warning level and counted.
//!
//! Deletes go in small batches (bounded statement time, no long locks); on PostgreSQL the
//! batch is picked with `SKIP LOCKED`, so every replica can run the sweep at once.

use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::{Maintenance, StoreError};

/// One full pass: batches until a batch comes back short, then (with `unresolved_for`)
/// the unresolved keys past that bound. Returns the rows deleted.
pub async fn once<S: Maintenance>(
    store: &S,
    batch: i64,
    unresolved_for: Option<Duration>,
    metrics: &Metrics,
) -> Result<u64, StoreError> {
    let mut total = sweep_completed(store, batch, metrics).await?;
    if let Some(bound) = unresolved_for {
        total += sweep_unresolved(store, bound, batch, metrics).await?;
    }
    Ok(total)
}

async fn sweep_completed<S: Maintenance>(
    store: &S,
    batch: i64,
    metrics: &Metrics,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = match store.sweep(batch).await {
            Ok(n) => n,
            Err(e) => {
                metrics.sweep_errors.inc();
                return Err(e);
            }
        };
        metrics.swept_rows.inc_by(deleted);
        total += deleted;
        if deleted < batch.max(0) as u64 {
            return Ok(total);
        }
    }
}

/// Deletes unresolved keys whose lease ran out more than `bound` ago, each logged.
async fn sweep_unresolved<S: Maintenance>(
    store: &S,
    bound: Duration,
    batch: i64,
    metrics: &Metrics,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = match store.sweep_unresolved(bound, batch).await {
            Ok(rows) => rows,
            Err(e) => {
                metrics.sweep_errors.inc();
                return Err(e);
            }
        };
        for row in &deleted {
            tracing::warn!(
                key = %crate::key::key_hash(&row.client_id, &row.key),
                route = %row.route,
                attempts = row.attempts,
                "unresolved key deleted by sweep.unresolved_retention: its outcome was never known; a retry now executes afresh"
            );
        }
        let n = deleted.len() as u64;
        metrics.unresolved_swept.inc_by(n);
        total += n;
        if n < batch.max(0) as u64 {
            return Ok(total);
        }
    }
}

/// Sweeps every `interval` for as long as it is polled.
pub async fn run<S: Maintenance>(
    store: S,
    interval: Duration,
    batch: i64,
    unresolved_for: Option<Duration>,
    metrics: std::sync::Arc<Metrics>,
) {
    loop {
        tokio::time::sleep(interval).await;
        match once(&store, batch, unresolved_for, &metrics).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention sweep"),
            Err(e) => tracing::warn!(cause = %e, "retention sweep failed; will try again"),
        }
    }
}
