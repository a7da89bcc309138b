//! [`crate::store::Reseal`] on the embedded (SQLite) store.

use rusqlite::params;

use super::EmbeddedStore;
use crate::store::reseal::{Reseal, StoredRow, row, sealed_ring_key};
use crate::store::types::{Fenced, StoreError, StoredResponse};

impl Reseal for EmbeddedStore {
    async fn forget_replaced(&self) -> Result<(), StoreError> {
        self.call(|conn| {
            // Busy (a reader holds the log) is not an error: the next checkpoint does it.
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            Ok(())
        })
        .await
    }

    async fn not_sealed_with(
        &self,
        active: &str,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let active = active.to_owned();
        let after = after.map(|(c, k)| (c.to_owned(), k.to_owned()));
        self.call(move |conn| {
            let (after_client, after_key) = match &after {
                Some((c, k)) => (Some(c.as_str()), Some(k.as_str())),
                None => (None, None),
            };
            let mut stmt = conn.prepare_cached(
                "SELECT client_id, key, lease_token, response_status, response_headers, \
                 response_body, sealed_with FROM idempotency_keys \
                 WHERE status = 'done' AND replayable AND sealed_with IS NOT ?1 \
                   AND (?2 IS NULL OR (client_id, key) > (?2, ?3)) \
                 ORDER BY client_id, key LIMIT ?4",
            )?;
            let rows = stmt.query_map(params![active, after_client, after_key, limit], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })?;
            let mut out = Vec::new();
            for r in rows {
                let (c, k, t, s, h, b, w) = r?;
                out.push(row(c, k, t, s, h, b, w)?);
            }
            Ok(out)
        })
        .await
    }

    async fn reseal(&self, row: &StoredRow, answer: &StoredResponse) -> Result<Fenced, StoreError> {
        let (client_id, key, token) = (row.client_id.clone(), row.key.clone(), row.token);
        let (headers, body) = (answer.headers.to_vec(), answer.body.to_vec());
        let new = sealed_ring_key(answer).map(str::to_owned);
        let old = sealed_ring_key(&row.answer).map(str::to_owned);
        self.call(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE idempotency_keys \
                     SET response_headers = ?4, response_body = ?5, sealed_with = ?6 \
                     WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'done' \
                       AND sealed_with IS ?7",
                )?
                .execute(params![client_id, key, token, headers, body, new, old])?;
            Ok(Fenced::from_rows(n as u64))
        })
        .await
    }
}
