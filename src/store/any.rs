//! The store chosen at start-up from the configuration.
//!
//! An enum rather than a trait object: the proxy stays generic over [`KeyStore`] (static
//! dispatch, `Send` futures), and the binary still picks the backend from the file.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::contract::{Health, Inspect, KeyStore, Maintenance};
use super::reseal::{Reseal, StoredRow};
use super::types::*;
use super::writes::{Write, WriteBatch, Written};
use super::{EmbeddedStore, PgStore};
use crate::config::StoreConfig;

/// PostgreSQL or embedded, whichever the configuration names.
#[derive(Clone)]
pub enum AnyStore {
    Postgres(PgStore),
    Embedded(EmbeddedStore),
}

impl AnyStore {
    /// Opens the configured store (the embedded file is created if missing; PostgreSQL is
    /// connected lazily, on first use).
    pub fn open(config: &StoreConfig) -> Result<Self, StoreError> {
        Ok(match config {
            StoreConfig::Postgres(pg) => AnyStore::Postgres(PgStore::new(pg)?),
            StoreConfig::Embedded {
                path,
                timeout,
                replay_cache,
            } => AnyStore::Embedded(
                EmbeddedStore::open(path, *timeout)?.with_replay_cache(*replay_cache),
            ),
        })
    }

    /// Opens the configured store as a process's own: the embedded file locked against a
    /// second process, and created only when `create` (see
    /// [`EmbeddedStore::open_exclusive`]).
    pub fn open_for_process(config: &StoreConfig, create: bool) -> Result<Self, StoreError> {
        Ok(match config {
            StoreConfig::Postgres(pg) => AnyStore::Postgres(PgStore::new(pg)?),
            StoreConfig::Embedded {
                path,
                timeout,
                replay_cache,
            } => AnyStore::Embedded(
                EmbeddedStore::open_exclusive(path, *timeout, create)?
                    .with_replay_cache(*replay_cache),
            ),
        })
    }

    /// `postgres` or `embedded`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStore::Postgres(_) => "postgres",
            AnyStore::Embedded(_) => "embedded",
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Postgres($s) => $call,
            AnyStore::Embedded($s) => $call,
        }
    };
}

impl KeyStore for AnyStore {
    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        delegate!(self, s => s.reserve(req).await)
    }

    fn cached(&self, req: &ReserveRequest<'_>) -> Option<Reservation> {
        delegate!(self, s => s.cached(req))
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        delegate!(self, s => s.renew(fence, lease).await)
    }

    async fn complete(&self, fence: &Fence, completion: &Completion) -> Result<Fenced, StoreError> {
        delegate!(self, s => s.complete(fence, completion).await)
    }

    async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        delegate!(self, s => s.release(fence).await)
    }

    fn subscribe(&self, id: KeyId) -> Arc<Notify> {
        delegate!(self, s => s.subscribe(id))
    }
}

impl Maintenance for AnyStore {
    async fn sweep(&self, batch: i64) -> Result<u64, StoreError> {
        delegate!(self, s => s.sweep(batch).await)
    }

    async fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        delegate!(self, s => s.sweep_unresolved(unresolved_for, batch).await)
    }

    async fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        delegate!(self, s => s.claim_unresolved(routes, lease, limit).await)
    }

    async fn defer(
        &self,
        fence: &Fence,
        unresolved_since_ms: i64,
        retry_in: Duration,
        answer: &str,
    ) -> Result<Fenced, StoreError> {
        delegate!(self, s => s.defer(fence, unresolved_since_ms, retry_in, answer).await)
    }

    async fn unresolved_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        delegate!(self, s => s.unresolved_counts().await)
    }
}

impl Inspect for AnyStore {
    async fn lookup(&self, client_id: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        delegate!(self, s => s.lookup(client_id, key).await)
    }

    async fn evict(&self, client_id: &str, key: &str) -> Result<bool, StoreError> {
        delegate!(self, s => s.evict(client_id, key).await)
    }

    async fn stuck(&self, after: Option<&PageMark>, limit: i64) -> Result<Vec<Stuck>, StoreError> {
        delegate!(self, s => s.stuck(after, limit).await)
    }

    async fn answer(
        &self,
        client_id: &str,
        key: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        delegate!(self, s => s.answer(client_id, key).await)
    }
}

impl Health for AnyStore {
    fn pool_status(&self) -> Option<PoolStatus> {
        delegate!(self, s => s.pool_status())
    }

    fn replay_cache(&self) -> Option<CacheStatus> {
        delegate!(self, s => s.replay_cache())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        delegate!(self, s => s.ping().await)
    }

    fn location(&self) -> Option<String> {
        delegate!(self, s => s.location())
    }
}

impl WriteBatch for AnyStore {
    async fn write_batch(&self, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
        delegate!(self, s => s.write_batch(writes).await)
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
