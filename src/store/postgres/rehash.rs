//! [`crate::store::RehashKeys`] on the PostgreSQL store.

use super::PgStore;
use crate::key::KeyForm;
use crate::store::rehash::{RehashKeys, Rehashed, refuse, resealed, sealed_parts};
use crate::store::reseal::row;
use crate::store::types::StoreError;
use crate::vault::Vault;

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
