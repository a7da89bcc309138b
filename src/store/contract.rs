//! The store's contract, by role: the request path ([`KeyStore`]), the background jobs
//! ([`Maintenance`]), the admin API ([`Inspect`]), readiness and gauges ([`Health`]), and
//! rekey ([`super::Reseal`]). Each caller takes only its part; [`Store`] is all of them,
//! for the composition root that hands one store to every role.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::reseal::Reseal;
use super::types::*;

/// The key table as the request path uses it: what a protected request does to its key.
/// Implemented by PostgreSQL (shared by replicas) and the embedded store; the other roles
/// — the background jobs ([`Maintenance`]), the admin API ([`Inspect`]), readiness and
/// gauges ([`Health`]) — are traits of their own, so that each caller depends on the part
/// it uses.
pub trait KeyStore: Send + Sync + 'static {
    /// Atomically inserts the key in progress, or takes over an expired lease with the same
    /// fingerprint; otherwise reports what the row says.
    fn reserve(
        &self,
        req: &ReserveRequest<'_>,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// What [`KeyStore::reserve`] would answer from the replay cache alone, without a
    /// store call: a completed key's answer held in memory, or `None` (ask the store).
    /// Lets a replay be answered where the request arrived, without a task of its own.
    fn cached(&self, _req: &ReserveRequest<'_>) -> Option<Reservation> {
        None
    }

    /// Extends our lease; `Refused` means it was taken over and renewal should stop.
    fn renew(
        &self,
        fence: &Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Marks the key done with the upstream's answer, if we still hold it.
    fn complete(
        &self,
        fence: &Fence,
        completion: &Completion,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Deletes our reservation so that the same key can execute again.
    fn release(&self, fence: &Fence) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// A notifier woken when `id` is completed or released (by any replica).
    fn subscribe(&self, id: KeyId) -> Arc<Notify>;
}

/// What the background jobs need: the retention sweep and the reconciler of unresolved
/// keys.
pub trait Maintenance: Send + Sync + 'static {
    /// Deletes up to `batch` completed rows past their retention (counted from their
    /// completion) and returns how many. Never an unresolved key (in progress, lease run
    /// out): its outcome is unknown, and forgetting it would let a late retry execute
    /// again. Safe to run from several replicas at once: each row is deleted once.
    fn sweep(&self, batch: i64) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes up to `batch` unresolved keys whose lease ran out more than `unresolved_for`
    /// ago (an operator's bound, `sweep.unresolved_retention`) and returns them, so that
    /// each can be logged. Safe from several replicas at once.
    fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> impl Future<Output = Result<Vec<KeyRecord>, StoreError>> + Send;

    /// Takes over up to `limit` unresolved keys of `routes` that are due for the
    /// reconciler (no backoff pending), longest unresolved first, each under a fresh lease
    /// token with a lease of `lease`: from then on a client retry gets `409` (or waits) and
    /// another replica's reconciler skips it, exactly as for any live lease. Safe from
    /// several replicas at once: each key is claimed by one.
    fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;

    /// Gives a claimed key back unresolved after an inconclusive probe, if we still hold
    /// it: its lease as it had run out (`unresolved_since_ms`), one more probe counted, and
    /// the reconciler's next look not before `retry_in` from now; `answer` is what the probe
    /// said (kept for operators).
    fn defer(
        &self,
        fence: &Fence,
        unresolved_since_ms: i64,
        retry_in: Duration,
        answer: &str,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// How many keys are unresolved, per route (routes with none are left out).
    fn unresolved_counts(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;
}

/// What the admin API needs: one key's row, its eviction, the stuck keys.
pub trait Inspect: Send + Sync + 'static {
    /// The row for a key, if any.
    fn lookup(
        &self,
        client_id: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<KeyRecord>, StoreError>> + Send;

    /// Deletes a key whatever its state (an operator's decision); whether it existed.
    fn evict(
        &self,
        client_id: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Keys in progress whose lease ran out (their worker is gone), longest unresolved
    /// first, from after `after` (a page's last mark), at most `limit`.
    fn stuck(
        &self,
        after: Option<&PageMark>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Stuck>, StoreError>> + Send;

    /// A completed key's stored answer as the row holds it (sealed or not), for an
    /// operator who asks to see it; `None` for a key not done or not stored.
    fn answer(
        &self,
        client_id: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<StoredResponse>, StoreError>> + Send;
}

/// What readiness and the gauges read.
pub trait Health: Send + Sync + 'static {
    /// Whether the store answers at all, with a migrated schema (readiness).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Where the store's connections go now (`host:port (address)`), for `/readyz` and
    /// the log: after a failover, which server is the primary.
    fn location(&self) -> Option<String> {
        None
    }

    /// Connection pool occupancy, where there is a pool (for gauges).
    fn pool_status(&self) -> Option<PoolStatus> {
        None
    }

    /// The replay cache's occupancy and use, where there is one.
    fn replay_cache(&self) -> Option<CacheStatus> {
        None
    }
}

/// Every role at once: what the composition root ([`crate::app::App`]) needs of the one
/// store it hands to the request path, the background jobs and the admin API.
pub trait Store: KeyStore + Maintenance + Inspect + Health + Reseal {}

impl<T: KeyStore + Maintenance + Inspect + Health + Reseal> Store for T {}
