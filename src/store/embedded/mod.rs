//! The embedded store: the same key table in one SQLite file, for a single proxy instance
//! with no database server (the quick start, a lone sidecar).
//!
//! SQLite because it is the most widely deployed embedded ACID engine, survives a process
//! crash without losing a committed row (WAL, `synchronous=FULL`), and has a maintained
//! Rust binding. Every call runs on tokio's blocking pool so that disk I/O never stalls the
//! reactor; one connection behind a mutex serialises writers, which SQLite does anyway, and
//! concurrent reservations, completions and releases share one transaction and one fsync
//! ([`crate::store::group_commit`], [`write`]).
//!
//! Its limit: the clock is this machine's and the file is this machine's. Several proxy
//! instances with separate files do not see each other's keys — use PostgreSQL for
//! replicas.

mod form_agreement;
mod inspect;
mod open;
mod rehash;
mod reseal;
mod schema;
mod unresolved;
mod write;

pub(super) use write::now_ms;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, params};
use tokio::sync::Notify;

use crate::store::Waiters;
use crate::store::contract::{Health, KeyStore, Maintenance};
use crate::store::group_commit::GroupCommit;
use crate::store::replay_cache::{ReplayCache, cached_in, reserve_through};
use crate::store::types::*;
use crate::store::writes::{Write, WriteBatch, Written};

/// SQLite-backed [`KeyStore`] for a single instance.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// One connection; held only inside blocking closures, never across an `.await`.
    conn: Mutex<Connection>,
    /// A turn at the connection. Callers wait for one here, as futures, before taking a
    /// blocking-pool thread: otherwise a burst of N requests holds N threads (each with its
    /// stack) blocked on `conn`.
    turn: tokio::sync::Semaphore,
    /// Waiting duplicates in this process (the only process using the file).
    waiters: Waiters,
    path: PathBuf,
    /// Bound on one call.
    timeout: Duration,
    /// Reservations, completions and releases waiting to share a transaction (and an
    /// fsync): one batch at a time, SQLite having one writer.
    group: Arc<GroupCommit>,
    /// Recently replayed answers (`store.replay_cache`); evictions happen in this process.
    cache: Option<ReplayCache>,
    /// An exclusive lock on the file while a process serves from it (see
    /// [`EmbeddedStore::open_exclusive`]); released when the process ends, however it ends.
    _lock: Option<std::fs::File>,
}

/// Calls on blocking-pool threads at once: one runs, the others are already waiting on
/// the connection's lock, so it passes from one statement to the next without a round
/// trip through the async runtime. Measured with 1,000 concurrent keyed requests: 1 turn
/// loses a quarter of the throughput; 4 kept it, with 14 threads instead of ~950 and
/// 71 MiB peak RSS instead of 98; 2 keep it as well since writes go in batches (group
/// commit), with two fewer threads, each of which held a malloc arena of its own.
const CALLS_AT_ONCE: usize = 2;

/// Writes per transaction at most.
const MAX_BATCH: usize = 256;

impl EmbeddedStore {
    /// Opens the store file for this process alone, as `serve` and `sweep` do: a second
    /// process on the same file is refused (two processes would each believe they hold
    /// every key, and waiting duplicates in one would never hear of completions in the
    /// other). With `create` false a missing file is an error instead of a new, empty
    /// store: a command pointed at the wrong path must not pretend there were no keys.
    pub fn open_exclusive(
        path: &Path,
        timeout: Duration,
        create: bool,
    ) -> Result<Self, StoreError> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        if !create && !path.exists() {
            return Err(StoreError::Config(format!(
                "there is no embedded store at {} (check store.embedded.path; `idemproxy serve` creates it)",
                path.display()
            )));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::Open {
                path: path.clone(),
                reason: format!("{e}"),
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Config(format!(
                    "{} is in use by another idemproxy process; the embedded store serves one process only (use PostgreSQL for several, and no `idemproxy sweep` is needed beside `serve`: it sweeps by itself)",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Config(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )));
            }
        }
        let mut store = Self::open(&path, timeout)?;
        if let Some(inner) = Arc::get_mut(&mut store.inner) {
            inner._lock = Some(file);
        }
        Ok(store)
    }

    /// Opens (creating if needed) the store file and brings its schema up to date, with no
    /// lock: for tests and tools that look at a file a process of their own serves from.
    pub fn open(path: &Path, timeout: Duration) -> Result<Self, StoreError> {
        let conn = open::connect(path, timeout)?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                turn: tokio::sync::Semaphore::new(CALLS_AT_ONCE),
                waiters: Waiters::default(),
                path: path.to_owned(),
                timeout,
                group: Arc::new(GroupCommit::new(1, MAX_BATCH, timeout)),
                cache: None,
                _lock: None,
            }),
        })
    }

    /// Keeps up to `bytes` of replayed answers in memory (0: none); see [`ReplayCache`].
    pub fn with_replay_cache(mut self, bytes: u64) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.cache = (bytes > 0)
                .then(|| ReplayCache::new(usize::try_from(bytes).unwrap_or(usize::MAX), true));
        }
        self
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on the blocking pool with the connection, bounded by the store timeout.
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let work = async move {
            let Ok(_turn) = self.inner.turn.acquire().await else {
                return Err(StoreError::Blocking("store closed".into()));
            };
            tokio::task::spawn_blocking(move || {
                let mut conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
                f(&mut conn)
            })
            .await
            .map_err(|join| StoreError::Blocking(join.to_string()))?
        };
        // The wait for the turn counts against the timeout, like a pool wait.
        match tokio::time::timeout(self.inner.timeout, work).await {
            Err(_) => Err(StoreError::Timeout(self.inner.timeout)),
            Ok(result) => result,
        }
    }

    /// Runs `f` with the connection with no bound: for a maintenance command's one long
    /// transaction, which a timeout would leave running after giving up on it.
    pub(super) async fn call_unbounded<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(|join| StoreError::Blocking(join.to_string()))?
    }
}

impl WriteBatch for EmbeddedStore {
    async fn write_batch(&self, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
        let woken: Vec<KeyId> = writes
            .iter()
            .filter_map(|w| match w {
                Write::Complete(f, _) | Write::Release(f) if f.notify => Some(f.key_id()),
                _ => None,
            })
            .collect();
        let n = writes.len();
        let batch = self
            .call(move |conn| write::write_batch(conn, &writes, now_ms()))
            .await;
        match batch {
            Ok(results) => {
                for id in &woken {
                    self.inner.waiters.wake(id);
                }
                results
            }
            Err(e) => {
                let shared = Arc::new(e);
                (0..n)
                    .map(|_| Err(StoreError::Shared(Arc::clone(&shared))))
                    .collect()
            }
        }
    }
}

impl KeyStore for EmbeddedStore {
    fn cached(&self, req: &ReserveRequest<'_>) -> Option<Reservation> {
        cached_in(self.inner.cache.as_ref(), req)
    }

    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        reserve_through(self.inner.cache.as_ref(), req, || async {
            self.inner
                .group
                .write(self, Write::Reserve(req.into()))
                .await?
                .into_reservation_and_expiry()
        })
        .await
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        let until = now_ms().saturating_add(millis(lease));
        let (client_id, key, token) = (fence.client_id.clone(), fence.key.clone(), fence.token);
        let n = self
            .call(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "UPDATE idempotency_keys SET locked_until_ms = ?4 \
                         WHERE client_id = ?1 AND key = ?2 AND lease_token = ?3 AND status = 'in_progress'",
                    )?
                    .execute(params![client_id, key, token, until])?)
            })
            .await?;
        Ok(if n == 1 {
            Fenced::Applied
        } else {
            Fenced::Refused
        })
    }

    async fn complete(&self, fence: &Fence, completion: &Completion) -> Result<Fenced, StoreError> {
        self.inner
            .group
            .write(self, Write::Complete(fence.clone(), completion.clone()))
            .await?
            .into_fenced()
    }

    async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        self.inner
            .group
            .write(self, Write::Release(fence.clone()))
            .await?
            .into_fenced()
    }

    fn subscribe(&self, id: KeyId) -> Arc<Notify> {
        self.inner.waiters.subscribe(id)
    }
}

impl Maintenance for EmbeddedStore {
    async fn sweep(&self, batch: i64) -> Result<u64, StoreError> {
        self.call(move |conn| {
            let now = now_ms();
            let n = conn.execute(
                "DELETE FROM idempotency_keys WHERE rowid IN ( \
                   SELECT rowid FROM idempotency_keys \
                   WHERE expires_ms < ?1 AND status = 'done' LIMIT ?2)",
                params![now, batch],
            )?;
            Ok(n as u64)
        })
        .await
    }

    async fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        Self::sweep_unresolved(self, unresolved_for, batch).await
    }

    async fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        Self::claim_unresolved(self, routes, lease, limit).await
    }

    async fn defer(
        &self,
        fence: &Fence,
        unresolved_since_ms: i64,
        retry_in: Duration,
        answer: &str,
    ) -> Result<Fenced, StoreError> {
        Self::defer(self, fence, unresolved_since_ms, retry_in, answer).await
    }

    async fn unresolved_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Self::unresolved_counts(self).await
    }
}

impl Health for EmbeddedStore {
    fn replay_cache(&self) -> Option<CacheStatus> {
        self.inner.cache.as_ref().map(|c| c.status())
    }

    /// One connection: idle when its turn is free; waiting are the writes queued for
    /// the next batch.
    fn pool_status(&self) -> Option<PoolStatus> {
        Some(PoolStatus {
            size: 1,
            available: self.inner.turn.available_permits().min(1),
            waiting: self.inner.group.waiting(),
            batches: self.inner.group.batches(),
            batched_writes: self.inner.group.batched_writes(),
            // A batch here is one SQLite transaction the process itself writes: nothing
            // refuses it that would not refuse its writes alone.
            batch_fallbacks: 0,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }
}
