//! `idemproxy rehash-keys`: a store of clear keys moved to hashed ones in place
//! (`encryption.hash_keys`), so that turning hashing on does not mean waiting out a
//! retention with every replica stopped.
//!
//! Why one transaction: a half-moved table has keys in two forms, and no proxy can serve
//! it (a retry of an unmoved key would not be found, and execute again). Either every key
//! moves and the store's key form is recorded with them, or nothing changes. Why it
//! refuses while any lease is held: a replica still serving would reserve clear keys
//! beside the hashed ones. The table is locked against writers meanwhile, so a replica
//! started by mistake waits instead of writing. Sealed answers are bound to their row's
//! key, so each is opened under the old key and sealed again under the new one.

use std::future::Future;

use super::any::AnyStore;
use super::reseal::StoredRow;
use super::types::{StoreError, StoredResponse};
use crate::key::KeyForm;
use crate::vault::Vault;

/// What a rehash did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rehashed {
    /// Keys moved to the hashed form.
    pub keys: u64,
    /// Of them, answers opened and sealed again under the new key.
    pub resealed: u64,
    /// The store's keys were in the target form already: nothing done.
    pub already: bool,
}

/// Moving a store's keys to another form.
pub trait RehashKeys: Send + Sync {
    /// Moves every clear key to `to`'s hashed form, resealing sealed answers with `vault`,
    /// and records `to` as the store's key form; in one transaction.
    fn rehash_keys(
        &self,
        to: &KeyForm,
        vault: Option<&Vault>,
    ) -> impl Future<Output = Result<Rehashed, StoreError>> + Send;
}

/// Why the store cannot be moved from `form`, if it cannot.
pub(super) fn refuse(form: &str, to: &KeyForm, live: i64) -> Result<bool, StoreError> {
    if !to.is_hashed() {
        return Err(StoreError::Config(
            "rehash-keys moves clear keys to hashed ones: the configuration has no `encryption.hash_keys: true`".into(),
        ));
    }
    if form == to.marker() {
        return Ok(true);
    }
    if form != "clear" {
        return Err(StoreError::Config(format!(
            "the store's keys are hashed already, under another hash_key (verifier {form}); they cannot be read back to hash again"
        )));
    }
    if live > 0 {
        return Err(StoreError::Config(format!(
            "{live} keys are in flight (their lease is held): stop every replica first, and run it again once their leases have run out"
        )));
    }
    Ok(false)
}

/// A sealed answer moved from its row's old key to `key`.
pub(super) fn resealed(
    row: StoredRow,
    key: &str,
    vault: Option<&Vault>,
) -> Result<StoredResponse, StoreError> {
    let opened = Vault::open(vault, &row.client_id, &row.key, row.answer).map_err(|why| {
        StoreError::Config(format!(
            "a stored answer cannot be opened ({why}); nothing was changed: put its key back in encryption.keys"
        ))
    })?;
    let vault = vault.ok_or_else(|| StoreError::Config("no key ring to seal with".into()))?;
    Ok(vault.seal(&row.client_id, key, row.token, &opened))
}

pub(super) fn sealed_parts(answer: &StoredResponse) -> (Vec<u8>, Vec<u8>, Option<String>) {
    (
        answer.headers.to_vec(),
        answer.body.to_vec(),
        answer.sealed.as_ref().map(|s| s.ring_key.clone()),
    )
}

impl RehashKeys for AnyStore {
    async fn rehash_keys(
        &self,
        to: &KeyForm,
        vault: Option<&Vault>,
    ) -> Result<Rehashed, StoreError> {
        match self {
            AnyStore::Postgres(s) => s.rehash_keys(to, vault).await,
            AnyStore::Embedded(s) => s.rehash_keys(to, vault).await,
        }
    }
}
