//! What `rekey` needs of a store: the completed answers not sealed with the active key, a
//! page at a time, and a compare-and-set that replaces one.
//!
//! Why a compare-and-set: rekey runs while replicas serve, and possibly from several
//! places at once. A row is replaced only while it is still the completed row that was
//! read — same lease token (a token is never reused, so an evicted and re-executed key
//! does not match), same `sealed_with` (so a second rekey that got there first is not
//! overwritten, and no answer is sealed twice on top of each other).

use std::future::Future;

use bytes::Bytes;
use rusqlite::params;
use tokio_postgres::types::Type;

use super::any::AnyStore;
use super::types::*;
use super::{EmbeddedStore, PgStore};

/// A completed row's answer as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub client_id: String,
    pub key: String,
    /// The row's lease token, which a sealed answer is bound to.
    pub token: i64,
    /// As stored: `sealed` says with which key, if any.
    pub answer: StoredResponse,
}

/// Paging through answers and replacing them, for `rekey`.
pub trait Reseal: Send + Sync {
    /// Up to `limit` completed, replayable rows whose answer is not sealed with `active`
    /// (in clear, or under another key), in `(client_id, key)` order after `after`.
    fn not_sealed_with(
        &self,
        active: &str,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<StoredRow>, StoreError>> + Send;

    /// Replaces `row`'s answer with `answer` if the row is still as it was read;
    /// `Refused` when it changed meanwhile (resealed elsewhere, evicted, swept).
    fn reseal(
        &self,
        row: &StoredRow,
        answer: &StoredResponse,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// After a pass: drops what the store still keeps of the replaced answers where it
    /// can. The embedded store empties its write-ahead log, whose older frames still hold
    /// them; PostgreSQL keeps replaced rows until `VACUUM` reuses their space (and in
    /// backups and WAL archives made before), which is the operator's.
    fn forget_replaced(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

const PG_PAGE: &str = "SELECT client_id, key, lease_token, response_status, response_headers, \
     response_body, sealed_with FROM idempotency_keys \
     WHERE status = 'done' AND replayable AND sealed_with IS DISTINCT FROM $1 \
       AND ($2::text IS NULL OR (client_id, key) > ($2, $3)) \
     ORDER BY client_id, key LIMIT $4";

const PG_RESEAL: &str = "UPDATE idempotency_keys \
     SET response_headers = $4, response_body = $5, sealed_with = $6 \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'done' \
       AND sealed_with IS NOT DISTINCT FROM $7";

pub(super) fn row(
    client_id: String,
    key: String,
    token: i64,
    status: i64,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
    sealed_with: Option<String>,
) -> Result<StoredRow, StoreError> {
    let status =
        u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
    Ok(StoredRow {
        client_id,
        key,
        token,
        answer: StoredResponse {
            status,
            headers: Bytes::from(headers.unwrap_or_default()),
            body: Bytes::from(body.unwrap_or_default()),
            sealed: sealed_with.map(|key_id| Seal { key_id, token }),
        },
    })
}

fn fenced(n: u64) -> Fenced {
    if n == 1 {
        Fenced::Applied
    } else {
        Fenced::Refused
    }
}

fn key_id(answer: &StoredResponse) -> Option<&str> {
    answer.sealed.as_ref().map(|s| s.key_id.as_str())
}

impl Reseal for PgStore {
    async fn forget_replaced(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn not_sealed_with(
        &self,
        active: &str,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let (after_client, after_key) = (after.map(|a| a.0), after.map(|a| a.1));
        self.with_client(|client| async move {
            let rows = client
                .typed_query(
                    PG_PAGE,
                    &[
                        (&active, Type::TEXT),
                        (&after_client, Type::TEXT),
                        (&after_key, Type::TEXT),
                        (&limit, Type::INT8),
                    ],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    row(
                        r.try_get(0)?,
                        r.try_get(1)?,
                        r.try_get(2)?,
                        i64::from(r.try_get::<_, i16>(3)?),
                        r.try_get(4)?,
                        r.try_get(5)?,
                        r.try_get(6)?,
                    )
                })
                .collect()
        })
        .await
    }

    async fn reseal(&self, row: &StoredRow, answer: &StoredResponse) -> Result<Fenced, StoreError> {
        let headers: &[u8] = &answer.headers;
        let body: &[u8] = &answer.body;
        let (new, old) = (key_id(answer), key_id(&row.answer));
        self.with_client(|client| async move {
            let n = client
                .typed_execute(
                    PG_RESEAL,
                    &[
                        (&row.client_id, Type::TEXT),
                        (&row.key, Type::TEXT),
                        (&row.token, Type::INT8),
                        (&headers, Type::BYTEA),
                        (&body, Type::BYTEA),
                        (&new, Type::TEXT),
                        (&old, Type::TEXT),
                    ],
                )
                .await?;
            Ok(fenced(n))
        })
        .await
    }
}

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
        let new = key_id(answer).map(str::to_owned);
        let old = key_id(&row.answer).map(str::to_owned);
        self.call(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE idempotency_keys \
                     SET response_headers = ?4, response_body = ?5, sealed_with = ?6 \
                     WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'done' \
                       AND sealed_with IS ?7",
                )?
                .execute(params![client_id, key, token, headers, body, new, old])?;
            Ok(fenced(n as u64))
        })
        .await
    }
}

impl Reseal for AnyStore {
    async fn not_sealed_with(
        &self,
        active: &str,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<StoredRow>, StoreError> {
        match self {
            AnyStore::Postgres(s) => s.not_sealed_with(active, after, limit).await,
            AnyStore::Embedded(s) => s.not_sealed_with(active, after, limit).await,
        }
    }

    async fn reseal(&self, row: &StoredRow, answer: &StoredResponse) -> Result<Fenced, StoreError> {
        match self {
            AnyStore::Postgres(s) => s.reseal(row, answer).await,
            AnyStore::Embedded(s) => s.reseal(row, answer).await,
        }
    }

    async fn forget_replaced(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Postgres(s) => s.forget_replaced().await,
            AnyStore::Embedded(s) => s.forget_replaced().await,
        }
    }
}
