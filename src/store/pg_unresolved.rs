//! The PostgreSQL store's unresolved keys — in progress, lease run out, nobody knows
//! whether the operation happened: listed for operators, bounded by
//! `sweep.unresolved_retention`.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::pg_sql::*;
use super::postgres::PgStore;
use super::types::*;

impl PgStore {
    /// Unresolved keys, longest unresolved first.
    pub(super) async fn stuck_keys(&self, limit: i64) -> Result<Vec<KeyRecord>, StoreError> {
        self.with_client(|client| async move {
            let sql = format!(
                "SELECT {RECORD_COLUMNS} FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until < now() ORDER BY locked_until LIMIT $1"
            );
            let rows = client.typed_query(&sql, &[(&limit, Type::INT8)]).await?;
            rows.iter().map(record).collect()
        })
        .await
    }

    /// Deletes up to `batch` keys unresolved for more than `unresolved_for`, returning them.
    pub(super) async fn delete_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let ms = millis(unresolved_for);
        self.with_client(|client| async move {
            let rows = client
                .typed_query(
                    &sweep_unresolved_sql(),
                    &[(&ms, Type::INT8), (&batch, Type::INT8)],
                )
                .await?;
            rows.iter().map(record).collect()
        })
        .await
    }
}
