//! The form the store's idempotency keys are in, agreed at start (see
//! [`crate::key::form`]): a proxy hashing keys in front of a table of clear ones — or hashing
//! with another secret — would find none of them, and every retry would execute again.

use std::future::Future;

use super::any::AnyStore;
use super::types::StoreError;

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

pub(super) fn agreement(marker: &str, in_force: String) -> KeyFormAgreement {
    if in_force == marker {
        KeyFormAgreement::Agreed
    } else {
        KeyFormAgreement::Differs { stored: in_force }
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
