//! Retention: completed keys are deleted after their route's retention, and abandoned
//! in-progress keys once their lease ran out and the retention passed too.
//!
//! Deletes go in small batches (bounded statement time, no long locks); on PostgreSQL the
//! batch is picked with `SKIP LOCKED`, so every replica can run the sweep at once.

use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::{KeyStore, StoreError};

/// One full pass: batches until a batch comes back short. Returns the rows deleted.
pub async fn sweep_once<S: KeyStore>(
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

/// Sweeps every `interval` for as long as it is polled.
pub async fn run<S: KeyStore>(
    store: S,
    interval: Duration,
    batch: i64,
    metrics: std::sync::Arc<Metrics>,
) {
    loop {
        tokio::time::sleep(interval).await;
        match sweep_once(&store, batch, &metrics).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention sweep"),
            Err(e) => tracing::warn!(cause = %e, "retention sweep failed; will try again"),
        }
    }
}
