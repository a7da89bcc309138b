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

use rusqlite::OptionalExtension;

use super::any::AnyStore;
use super::reseal::{StoredRow, row};
use super::types::{StoreError, StoredResponse};
use super::{EmbeddedStore, PgStore};
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
fn refuse(form: &str, to: &KeyForm, live: i64) -> Result<bool, StoreError> {
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
fn resealed(
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

fn sealed_parts(answer: &StoredResponse) -> (Vec<u8>, Vec<u8>, Option<String>) {
    (
        answer.headers.to_vec(),
        answer.body.to_vec(),
        answer.sealed.as_ref().map(|s| s.key_id.clone()),
    )
}

impl RehashKeys for PgStore {
    async fn rehash_keys(
        &self,
        to: &KeyForm,
        vault: Option<&Vault>,
    ) -> Result<Rehashed, StoreError> {
        // No per-call bound: the whole table moves in this one transaction.
        let mut client = self
            .pool()
            .get()
            .await
            .map_err(|e| StoreError::Config(format!("connecting to PostgreSQL: {e}")))?;
        let tx = client.transaction().await.map_err(StoreError::Postgres)?;
        let pg = StoreError::Postgres;
        tx.batch_execute(
            "LOCK TABLE idemproxy_settings IN SHARE ROW EXCLUSIVE MODE; \
             LOCK TABLE idempotency_keys IN EXCLUSIVE MODE",
        )
        .await
        .map_err(pg)?;
        let form: Option<String> = tx
            .query_opt(
                "SELECT value FROM idemproxy_settings WHERE name = 'key_form'",
                &[],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get(0));
        let live: i64 = tx
            .query_one(
                "SELECT count(*) FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until > now()",
                &[],
            )
            .await
            .map_err(pg)?
            .get(0);
        if refuse(form.as_deref().unwrap_or("clear"), to, live)? {
            return Ok(Rehashed {
                already: true,
                ..Rehashed::default()
            });
        }
        let pairs = tx
            .query(
                "SELECT client_id, key, sealed_with IS NOT NULL FROM idempotency_keys",
                &[],
            )
            .await
            .map_err(pg)?;
        let mut done = Rehashed::default();
        for pair in &pairs {
            let (client_id, key, sealed): (String, String, bool) =
                (pair.get(0), pair.get(1), pair.get(2));
            let new = to.stored(&client_id, key.clone());
            if sealed {
                let r = tx
                    .query_one(
                        "SELECT lease_token, response_status, response_headers, response_body, \
                         sealed_with FROM idempotency_keys WHERE client_id = $1 AND key = $2",
                        &[&client_id, &key],
                    )
                    .await
                    .map_err(pg)?;
                let status: Option<i16> = r.get(1);
                let stored = row(
                    client_id.clone(),
                    key.clone(),
                    r.get(0),
                    i64::from(status.unwrap_or_default()),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                )?;
                let (headers, body, with) = sealed_parts(&resealed(stored, &new, vault)?);
                tx.execute(
                    "UPDATE idempotency_keys SET key = $3, response_headers = $4, \
                     response_body = $5, sealed_with = $6 WHERE client_id = $1 AND key = $2",
                    &[&client_id, &key, &new, &headers, &body, &with],
                )
                .await
                .map_err(pg)?;
                done.resealed += 1;
            } else {
                tx.execute(
                    "UPDATE idempotency_keys SET key = $3 WHERE client_id = $1 AND key = $2",
                    &[&client_id, &key, &new],
                )
                .await
                .map_err(pg)?;
            }
            done.keys += 1;
        }
        tx.execute(
            "INSERT INTO idemproxy_settings (name, value) VALUES ('key_form', $1) \
             ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            &[&to.marker()],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(done)
    }
}

impl RehashKeys for EmbeddedStore {
    async fn rehash_keys(
        &self,
        to: &KeyForm,
        vault: Option<&Vault>,
    ) -> Result<Rehashed, StoreError> {
        let (to, vault) = (to.clone(), vault.cloned());
        self.call_unbounded(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let form: Option<String> = tx
                .query_row(
                    "SELECT value FROM idemproxy_settings WHERE name = 'key_form'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            let live: i64 = tx.query_row(
                "SELECT count(*) FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until_ms > ?1",
                [super::embedded_write::now_ms()],
                |r| r.get(0),
            )?;
            if refuse(form.as_deref().unwrap_or("clear"), &to, live)? {
                return Ok(Rehashed {
                    already: true,
                    ..Rehashed::default()
                });
            }
            let pairs: Vec<(String, String, bool)> = tx
                .prepare("SELECT client_id, key, sealed_with IS NOT NULL FROM idempotency_keys")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?;
            let mut done = Rehashed::default();
            for (client_id, key, sealed) in pairs {
                let new = to.stored(&client_id, key.clone());
                if sealed {
                    let (token, status, headers, body, with) = tx.query_row(
                        "SELECT lease_token, response_status, response_headers, response_body, \
                         sealed_with FROM idempotency_keys WHERE client_id = ?1 AND key = ?2",
                        [&client_id, &key],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                    )?;
                    let stored = row(
                        client_id.clone(),
                        key.clone(),
                        token,
                        status,
                        headers,
                        body,
                        with,
                    )?;
                    let (headers, body, with) =
                        sealed_parts(&resealed(stored, &new, vault.as_ref())?);
                    tx.execute(
                        "UPDATE idempotency_keys SET key = ?3, response_headers = ?4, \
                         response_body = ?5, sealed_with = ?6 WHERE client_id = ?1 AND key = ?2",
                        rusqlite::params![client_id, key, new, headers, body, with],
                    )?;
                    done.resealed += 1;
                } else {
                    tx.execute(
                        "UPDATE idempotency_keys SET key = ?3 WHERE client_id = ?1 AND key = ?2",
                        rusqlite::params![client_id, key, new],
                    )?;
                }
                done.keys += 1;
            }
            tx.execute(
                "INSERT INTO idemproxy_settings (name, value) VALUES ('key_form', ?1) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [to.marker()],
            )?;
            tx.commit()?;
            // The write-ahead log's older frames still hold the clear keys (a busy log is
            // no error: the next checkpoint empties it).
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            Ok(done)
        })
        .await
    }
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
