//! [`crate::store::Reseal`] on the PostgreSQL store.

use tokio_postgres::types::Type;

use super::PgStore;
use crate::store::reseal::{Reseal, StoredRow, row, sealed_ring_key};
use crate::store::types::{Fenced, StoreError, StoredResponse};

const RESEAL: &str = "UPDATE idempotency_keys \
     SET response_headers = $4, response_body = $5, sealed_with = $6 \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'done' \
       AND sealed_with IS NOT DISTINCT FROM $7";

const PAGE: &str = "SELECT client_id, key, lease_token, response_status, response_headers, \
     response_body, sealed_with FROM idempotency_keys \
     WHERE status = 'done' AND replayable AND sealed_with IS DISTINCT FROM $1 \
       AND ($2::text IS NULL OR (client_id, key) > ($2, $3)) \
     ORDER BY client_id, key LIMIT $4";

impl Reseal for PgStore {
    async fn forget_replaced(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn not_sealed_with(
        &self,
        active: &str,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let (after_client, after_key) = (after.map(|a| a.0), after.map(|a| a.1));
        self.with_client(|client| async move {
            let rows = client
                .typed_query(
                    PAGE,
                    &[
                        (&active, Type::TEXT),
                        (&after_client, Type::TEXT),
                        (&after_key, Type::TEXT),
                        (&limit, Type::INT8),
                    ],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    row(
                        r.try_get(0)?,
                        r.try_get(1)?,
                        r.try_get(2)?,
                        i64::from(r.try_get::<_, i16>(3)?),
                        r.try_get(4)?,
                        r.try_get(5)?,
                        r.try_get(6)?,
                    )
                })
                .collect()
        })
        .await
    }

    async fn reseal(&self, row: &StoredRow, answer: &StoredResponse) -> Result<Fenced, StoreError> {
        let headers: &[u8] = &answer.headers;
        let body: &[u8] = &answer.body;
        let (new, old) = (sealed_ring_key(answer), sealed_ring_key(&row.answer));
        self.with_client(|client| async move {
            let n = client
                .typed_execute(
                    RESEAL,
                    &[
                        (&row.client_id, Type::TEXT),
                        (&row.key, Type::TEXT),
                        (&row.token, Type::INT8),
                        (&headers, Type::BYTEA),
                        (&body, Type::BYTEA),
                        (&new, Type::TEXT),
                        (&old, Type::TEXT),
                    ],
                )
                .await?;
            Ok(Fenced::from_rows(n))
        })
        .await
    }
}
