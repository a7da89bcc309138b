//! The form the store's idempotency keys are in, agreed at start (see
//! [`crate::key_form`]): a proxy hashing keys in front of a table of clear ones — or hashing
//! with another secret — would find none of them, and every retry would execute again.

use std::future::Future;

use rusqlite::OptionalExtension;
use tokio_postgres::types::Type;

use super::any::AnyStore;
use super::types::StoreError;
use super::{EmbeddedStore, PgStore};

/// Whether the store's keys are in the form this proxy uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFormAgreement {
    /// They are, or the store held no keys and now records this form.
    Agreed,
    /// Keys are stored in `stored`; this proxy would not find them.
    Differs { stored: String },
}

/// Agreeing on the key form.
pub trait SettleKeyForm: Send + Sync {
    /// Records `marker` as the store's key form unless keys are stored in another form
    /// (rows from before the form was recorded are in `clear`).
    fn settle_key_form(
        &self,
        marker: &str,
    ) -> impl Future<Output = Result<KeyFormAgreement, StoreError>> + Send;
}

fn agreement(marker: &str, in_force: String) -> KeyFormAgreement {
    if in_force == marker {
        KeyFormAgreement::Agreed
    } else {
        KeyFormAgreement::Differs { stored: in_force }
    }
}

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

impl SettleKeyForm for AnyStore {
    async fn settle_key_form(&self, marker: &str) -> Result<KeyFormAgreement, StoreError> {
        match self {
            AnyStore::Postgres(s) => s.settle_key_form(marker).await,
            AnyStore::Embedded(s) => s.settle_key_form(marker).await,
        }
    }
}
