//! What the admin API and the console read and do to single keys in PostgreSQL: look
//! one up, evict it (telling every replica's replay cache), list the unresolved ones a page
//! at a time, and read a stored answer for an operator who asks to see it.

use tokio_postgres::types::Type;

use super::sql::*;
use super::{Param, PgStore};
use crate::store::contract::Inspect;
use crate::store::types::*;

impl Inspect for PgStore {
    async fn lookup(&self, client_id: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.with_client(|client| async move {
            let sql = format!(
                "SELECT {RECORD_COLUMNS} FROM idempotency_keys WHERE client_id = $1 AND key = $2"
            );
            let rows = client
                .typed_query(&sql, &[(&client_id, Type::TEXT), (&key, Type::TEXT)])
                .await?;
            rows.first().map(record).transpose()
        })
        .await
    }

    async fn evict(&self, client_id: &str, key: &str) -> Result<bool, StoreError> {
        let id = key_id(client_id, key);
        let sql = if self.distributed().await? {
            EVICT_DISTRIBUTED.as_str()
        } else {
            EVICT
        };
        let (existed, raise) = self
            .with_client(|client| async move {
                let payload = crate::key::hex(&id);
                let params: [Param<'_>; 3] = [
                    (&client_id, Type::TEXT),
                    (&key, Type::TEXT),
                    (&payload, Type::TEXT),
                ];
                let rows = client.typed_query(sql, &params).await?;
                let row = rows
                    .first()
                    .ok_or_else(|| StoreError::Corrupt("no row from an eviction".into()))?;
                let raise: Option<String> = row.try_get(1)?;
                Ok((
                    row.try_get::<_, i64>(0)? > 0,
                    raise.filter(|p| !p.is_empty()),
                ))
            })
            .await?;
        // On a distributed table the statement returned the notice for this process to
        // send (see `distributed`).
        if let Some(payload) = raise {
            self.notify_from_here(super::listen::EVICTED, &payload)
                .await;
        }
        // Every replica (this one included) also hears the notice; this one need not wait.
        if let Some(cache) = &self.cache {
            cache.invalidate(&id);
        }
        Ok(existed)
    }

    async fn stuck(&self, after: Option<&PageMark>, limit: i64) -> Result<Vec<Stuck>, StoreError> {
        let mark = after.map(|m| (m.lease_end_us, m.client_id.clone(), m.key.clone()));
        self.with_client(|client| async move {
            let rows = match &mark {
                None => {
                    client
                        .index_walk_query(&stuck_sql(""), &[(&limit, Type::INT8)])
                        .await?
                }
                Some((us, client_id, key)) => {
                    let after = "AND (locked_until, client_id, key) > \
                         ('epoch'::timestamptz + $2::int8 * interval '1 microsecond', $3, $4)";
                    let params: [Param<'_>; 4] = [
                        (&limit, Type::INT8),
                        (us, Type::INT8),
                        (client_id, Type::TEXT),
                        (key, Type::TEXT),
                    ];
                    client.index_walk_query(&stuck_sql(after), &params).await?
                }
            };
            rows.iter()
                .map(|row| {
                    let record = record(row)?;
                    let mark = PageMark {
                        lease_end_us: row.try_get(RECORD_LEN)?,
                        client_id: record.client_id.clone(),
                        key: record.key.clone(),
                    };
                    Ok(Stuck { record, mark })
                })
                .collect()
        })
        .await
    }

    async fn answer(
        &self,
        client_id: &str,
        key: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        self.with_client(|client| async move {
            let rows = client
                .typed_query(ANSWER, &[(&client_id, Type::TEXT), (&key, Type::TEXT)])
                .await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let status: i16 = row.try_get(0)?;
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            let headers: Option<Vec<u8>> = row.try_get(1)?;
            let body: Option<Vec<u8>> = row.try_get(2)?;
            let sealed = row
                .try_get::<_, Option<String>>(3)?
                .map(|ring_key| -> Result<Seal, StoreError> {
                    Ok(Seal {
                        ring_key,
                        token: row.try_get(4)?,
                    })
                })
                .transpose()?;
            Ok(Some(StoredResponse {
                status,
                headers: headers.unwrap_or_default().into(),
                body: body.unwrap_or_default().into(),
                sealed,
            }))
        })
        .await
    }
}

/// Unresolved keys by lease end, then client id and key, from `after` (a condition on
/// `$2`–`$4`, or nothing for the first page), at most `$1`; each with its lease end in
/// microseconds (the page mark). The partial index on keys in progress gives them in lease
/// order, so a page reads about `$1` entries however long the list is.
fn stuck_sql(after: &str) -> String {
    format!(
        "SELECT {RECORD_COLUMNS}, (extract(epoch FROM locked_until) * 1000000)::int8 \
         FROM idempotency_keys \
         WHERE status = 'in_progress' AND locked_until < now() {after} \
         ORDER BY locked_until, client_id, key LIMIT $1"
    )
}

/// A completed key's stored answer, with what opens it if it is sealed.
const ANSWER: &str = "SELECT response_status, response_headers, response_body, sealed_with, \
     lease_token FROM idempotency_keys \
     WHERE client_id = $1 AND key = $2 AND status = 'done' AND replayable";
