//! The embedded store's unresolved keys — in progress, lease run out, nobody knows
//! whether the operation happened: listed for operators, bounded by
//! `sweep.unresolved_retention`.

use std::time::Duration;

use rusqlite::params;

use super::embedded::EmbeddedStore;
use super::embedded_write::{RECORD_COLUMNS, millis, now_ms, record};
use super::types::*;

impl EmbeddedStore {
    /// Unresolved keys, longest unresolved first.
    pub(super) async fn stuck_keys(&self, limit: i64) -> Result<Vec<KeyRecord>, StoreError> {
        self.call(move |conn| {
            let sql = format!(
                "SELECT {RECORD_COLUMNS} FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until_ms < ?1 ORDER BY locked_until_ms LIMIT ?2"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![now_ms(), limit], record)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Deletes up to `batch` keys unresolved for more than `unresolved_for`, returning them.
    pub(super) async fn delete_unresolved(
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
}
