//! [`crate::store::SettleKeyForm`] on the embedded (SQLite) store.

use rusqlite::OptionalExtension;

use super::EmbeddedStore;
use crate::store::form_agreement::{KeyFormAgreement, SettleKeyForm, agreement};
use crate::store::types::StoreError;

impl SettleKeyForm for EmbeddedStore {
    async fn settle_key_form(&self, marker: &str) -> Result<KeyFormAgreement, StoreError> {
        let owned = marker.to_owned();
        let in_force = self
            .call(move |conn| {
                let tx =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let stored: Option<String> = tx
                    .query_row(
                        "SELECT value FROM idemproxy_settings WHERE name = 'key_form'",
                        [],
                        |r| r.get(0),
                    )
                    .optional()?;
                if stored.as_deref() == Some(owned.as_str()) {
                    return Ok(owned);
                }
                let any: bool =
                    tx.query_row("SELECT EXISTS (SELECT 1 FROM idempotency_keys)", [], |r| {
                        r.get(0)
                    })?;
                if any {
                    let stored = stored.unwrap_or_else(|| "clear".to_owned());
                    if stored != owned {
                        return Ok(stored);
                    }
                }
                tx.execute(
                    "INSERT INTO idemproxy_settings (name, value) VALUES ('key_form', ?1) \
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    [&owned],
                )?;
                tx.commit()?;
                Ok(owned)
            })
            .await?;
        Ok(agreement(marker, in_force))
    }
}
