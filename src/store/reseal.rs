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

use super::types::{Fenced, Seal, StoreError, StoredResponse};

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
            sealed: sealed_with.map(|ring_key| Seal { ring_key, token }),
        },
    })
}

pub(super) fn sealed_ring_key(answer: &StoredResponse) -> Option<&str> {
    answer.sealed.as_ref().map(|s| s.ring_key.as_str())
}
