//! What the admin API and the console read and do to single keys in the embedded store:
//! look one up, evict it, list the unresolved ones a page at a time (keyset pagination on
//! the partial index of keys in progress), and read a stored answer for an operator who
//! asks to see it.

use rusqlite::{OptionalExtension, params};

use super::EmbeddedStore;
use super::write::{RECORD_COLUMNS, RECORD_LEN, now_ms, record};
use crate::store::contract::Inspect;
use crate::store::types::*;

impl Inspect for EmbeddedStore {
    async fn lookup(&self, client_id: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let (client_id, key) = (client_id.to_owned(), key.to_owned());
        self.call(move |conn| {
            let sql = format!(
                "SELECT {RECORD_COLUMNS} FROM idempotency_keys WHERE client_id = ?1 AND key = ?2"
            );
            Ok(conn
                .query_row(&sql, params![client_id, key], record)
                .optional()?)
        })
        .await
    }

    async fn evict(&self, client_id: &str, key: &str) -> Result<bool, StoreError> {
        let (client, k) = (client_id.to_owned(), key.to_owned());
        let existed = self
            .call(move |conn| {
                Ok(conn.execute(
                    "DELETE FROM idempotency_keys WHERE client_id = ?1 AND key = ?2",
                    params![client, k],
                )? > 0)
            })
            .await?;
        if let Some(cache) = &self.inner.cache {
            cache.invalidate(&key_id(client_id, key));
        }
        Ok(existed)
    }

    async fn stuck(&self, after: Option<&PageMark>, limit: i64) -> Result<Vec<Stuck>, StoreError> {
        // The file keeps lease ends in milliseconds; marks carry microseconds.
        let after = after.map(|m| {
            (
                m.lease_end_us.div_euclid(1000),
                m.client_id.clone(),
                m.key.clone(),
            )
        });
        self.call(move |conn| {
            let sql = format!(
                "SELECT {RECORD_COLUMNS}, locked_until_ms FROM idempotency_keys \
                 WHERE status = 'in_progress' AND locked_until_ms < ?1 \
                   AND (?3 IS NULL OR (locked_until_ms, client_id, key) > (?3, ?4, ?5)) \
                 ORDER BY locked_until_ms, client_id, key LIMIT ?2"
            );
            let (ms, client_id, key) = match after {
                Some((ms, c, k)) => (Some(ms), Some(c), Some(k)),
                None => (None, None, None),
            };
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![now_ms(), limit, ms, client_id, key], |row| {
                let record = record(row)?;
                let lease_end_ms: i64 = row.get(RECORD_LEN)?;
                let mark = PageMark {
                    lease_end_us: lease_end_ms.saturating_mul(1000),
                    client_id: record.client_id.clone(),
                    key: record.key.clone(),
                };
                Ok(Stuck { record, mark })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn answer(
        &self,
        client_id: &str,
        key: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let (client_id, key) = (client_id.to_owned(), key.to_owned());
        self.call(move |conn| {
            let row = conn
                .query_row(
                    "SELECT response_status, response_headers, response_body, sealed_with, lease_token \
                     FROM idempotency_keys \
                     WHERE client_id = ?1 AND key = ?2 AND status = 'done' AND replayable",
                    params![client_id, key],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, Option<Vec<u8>>>(1)?,
                            r.get::<_, Option<Vec<u8>>>(2)?,
                            r.get::<_, Option<String>>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    },
                )
                .optional()?;
            let Some((status, headers, body, sealed_with, token)) = row else {
                return Ok(None);
            };
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            Ok(Some(StoredResponse {
                status,
                headers: headers.unwrap_or_default().into(),
                body: body.unwrap_or_default().into(),
                sealed: sealed_with.map(|ring_key| Seal { ring_key, token }),
            }))
        })
        .await
    }
}
