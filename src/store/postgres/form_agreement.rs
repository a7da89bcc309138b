//! [`crate::store::SettleKeyForm`] on the PostgreSQL store.

use tokio_postgres::types::Type;

use super::PgStore;
use crate::store::form_agreement::{KeyFormAgreement, SettleKeyForm, agreement};
use crate::store::types::StoreError;

impl SettleKeyForm for PgStore {
    async fn settle_key_form(&self, marker: &str) -> Result<KeyFormAgreement, StoreError> {
        self.with_client(|client| async move {
            let row = client
                .typed_query(
                    "SELECT idempotency_settle_key_form($1)",
                    &[(&marker, Type::TEXT)],
                )
                .await?;
            let in_force: String = row
                .first()
                .ok_or_else(|| StoreError::Corrupt("no key form returned".into()))?
                .try_get(0)?;
            Ok(agreement(marker, in_force))
        })
        .await
    }
}
