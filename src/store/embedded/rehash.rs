//! [`crate::store::RehashKeys`] on the embedded (SQLite) store.

use rusqlite::OptionalExtension;

use super::EmbeddedStore;
use crate::key::KeyForm;
use crate::store::rehash::{RehashKeys, Rehashed, refuse, resealed, sealed_parts};
use crate::store::reseal::row;
use crate::store::types::StoreError;
use crate::vault::Vault;

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
                [super::now_ms()],
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
