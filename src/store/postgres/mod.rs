//! The PostgreSQL store: one table shared by any number of proxy replicas.
//!
//! Each call takes a connection from the pool, runs one statement (one round trip; prepared
//! once per direct connection, unnamed and typed through a transaction pooler, see
//! [`connect`]) and is bounded by the configured store timeout, so a database that hangs
//! is treated like one that is down instead of stalling requests. Reservations,
//! completions and releases of concurrent requests share a statement ([`crate::store::group_commit`],
//! [`batch`]).

mod batch;
mod call;
mod conn;
mod connect;
mod distribute;
mod distributed;
mod form_agreement;
mod inspect;
mod io_thread;
mod lanes;
mod listen;
mod manager;
mod migrate;
mod rehash;
mod reseal;
mod settings;
mod sql;
mod tls;
mod tuning;
mod unresolved;

pub use migrate::{MIGRATIONS, migrate};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::types::{ToSql, Type};

use crate::config::PostgresConfig;
use crate::store::Waiters;
use crate::store::contract::{Health, KeyStore, Maintenance};
use crate::store::group_commit::GroupCommit;
use crate::store::replay_cache::{ReplayCache, cached_in, reserve_through};
use crate::store::types::*;
use crate::store::writes::Write;
use connect::Connector;
use lanes::Lanes;
use listen::listen;
use manager::PgManager;
use settings::connection_config;
use sql::*;
use tls::PgTlsConnect;

/// The store's connection pool.
pub type Pool = deadpool::managed::Pool<PgManager>;
/// A pooled connection.
type Object = deadpool::managed::Object<PgManager>;

/// PostgreSQL-backed [`KeyStore`].
#[derive(Clone)]
pub struct PgStore {
    /// Connections are checked out per call, from the lane of where the caller runs; the
    /// pools bound concurrency towards the database.
    lanes: Arc<Lanes>,
    /// Bound on one call (pool wait included).
    timeout: Duration,
    /// Duplicates waiting in this process, woken from the `LISTEN` connection.
    waiters: Arc<Waiters>,
    /// Connection settings for the `LISTEN` connection, which lives outside the pool.
    listen_hosts: Arc<Vec<tokio_postgres::Config>>,
    /// Bounds on connecting and on statements, for the `LISTEN` connection's connector.
    connect_timeout: Duration,
    /// TLS for every connection (`sslmode`); unused under `disable`.
    tls: PgTlsConnect,
    /// Where connections go (hosts, database, user), for errors.
    target: Arc<str>,
    /// Whether the `LISTEN` task was started (lazily: only wait-mode routes need it).
    listening: Arc<OnceLock<()>>,
    /// Calls waiting for a turn, for the `pool_waiting` gauge.
    waiting: Arc<AtomicUsize>,
    /// Reservations, completions and releases waiting to share a batch.
    group: Arc<GroupCommit>,
    /// Recently replayed answers (`store.replay_cache`), dropped when any replica evicts.
    cache: Option<Arc<ReplayCache>>,
    /// Whether the `LISTEN` connection has its own URL (so reaches PostgreSQL even when
    /// `url` goes through a pooler, which would swallow eviction notices).
    listen_direct: bool,
    /// Whether the key table is distributed (Citus), as last looked up.
    layout: Arc<distributed::KnownLayout>,
    /// Batches the server refused whose writes then ran one at a time.
    batch_fallbacks: Arc<AtomicU64>,
    /// When the last warning about a refused batch was logged (ms since the epoch).
    batch_refusal_warned: Arc<AtomicU64>,
}

impl PgStore {
    /// Builds the pool; no connection is made until the first call.
    pub fn new(config: &PostgresConfig) -> Result<Self, StoreError> {
        let hosts_of = |url: &str| {
            crate::config::libpq::split_hosts(url)
                .iter()
                .map(|url| connection_config(url, config))
                .collect::<Result<Vec<_>, _>>()
        };
        let listen_hosts = hosts_of(config.listen_url.as_ref().unwrap_or(&config.url))?;
        let hosts = hosts_of(&config.url)?;
        let tls = PgTlsConnect::new(Arc::clone(&config.tls.client));
        let connector = Connector::new(
            "pool",
            hosts,
            tls.clone(),
            config.connect_timeout,
            config.timeout,
        );
        let lanes = Lanes::new(config, connector, batches_at_once(config.pool_size))?;
        Ok(Self {
            group: Arc::new(GroupCommit::new(
                batches_at_once(config.pool_size),
                MAX_BATCH,
                config.timeout,
            )),
            lanes: Arc::new(lanes),
            timeout: config.timeout,
            waiters: Arc::default(),
            listen_hosts: Arc::new(listen_hosts),
            connect_timeout: config.connect_timeout,
            tls,
            target: config.target().into(),
            listening: Arc::default(),
            waiting: Arc::default(),
            // Not live until the `LISTEN` connection is: evictions must be heard first.
            cache: (config.replay_cache > 0).then(|| {
                Arc::new(ReplayCache::new(
                    usize::try_from(config.replay_cache).unwrap_or(usize::MAX),
                    false,
                ))
            }),
            listen_direct: config.listen_url.is_some(),
            layout: Arc::default(),
            batch_fallbacks: Arc::default(),
            batch_refusal_warned: Arc::default(),
        })
    }

    /// Starts the `LISTEN` connection, once: wait-mode routes and the replay cache need it.
    fn start_listening(&self) {
        self.listening.get_or_init(|| {
            let connector = Connector::new(
                "notification",
                self.listen_hosts.to_vec(),
                self.tls.clone(),
                self.connect_timeout,
                self.timeout,
            );
            tokio::spawn(listen(
                connector,
                Arc::clone(&self.waiters),
                self.cache.clone(),
            ));
        });
    }

    /// The replay cache, where it can be trusted: evictions by other replicas are heard
    /// only on a direct connection, so not behind a transaction pooler without a
    /// `listen_url`.
    fn replay_cache(&self) -> Option<&ReplayCache> {
        let cache = self.cache.as_deref()?;
        self.start_listening();
        (self.listen_direct || !self.behind_pooler()).then_some(cache)
    }

    /// The host and address connections go to now (`host:port (address)`), once one was
    /// made: for the start-up log and `/readyz`.
    pub fn connected_to(&self) -> Option<String> {
        self.lanes.connector().in_use()
    }

    /// Whether a connection so far used TLS (for the start-up log).
    pub fn tls_used(&self) -> bool {
        self.tls.was_used()
    }

    /// Whether the connections so far went through a transaction pooler (for the
    /// start-up log: notifications do not pass one).
    pub fn behind_pooler(&self) -> bool {
        self.lanes.connector().behind_pooler()
    }
}

/// A statement parameter with its type: the types let a statement be sent unnamed through
/// a transaction pooler (where consecutive statements of one client run on different
/// server connections) and prepared once elsewhere.
pub(super) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Writes per batch at most: a batch holds its rows' locks until it commits.
const MAX_BATCH: usize = 64;

/// Batches running at once on a pool of `pool_size`: far fewer than the pool, so that
/// under load writes gather into batches instead of each taking a connection (and a
/// commit) of its own; more than one on a large pool, whose database has the cores to run
/// several. The rest of the pool serves replays' reads, renewals and the sweeper.
/// Measured on 2 cores shared with the load: 1 or 2 batches at once 7.4–10k keyed req/s,
/// 16 (every connection its own batch) 5.0k. The second and later ones start only once a
/// full batch waits (see `group_commit`).
fn batches_at_once(pool_size: usize) -> usize {
    (pool_size / 8).clamp(1, 4)
}

/// How long a pooled connection is used before it is replaced.
pub(super) const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(30 * 60);

impl KeyStore for PgStore {
    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        reserve_through(self.replay_cache(), req, || async {
            self.write(Write::Reserve(req.into()))
                .await?
                .into_reservation_and_expiry()
        })
        .await
    }

    fn cached(&self, req: &ReserveRequest<'_>) -> Option<Reservation> {
        cached_in(self.replay_cache(), req)
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        self.fenced(RENEW, fence, false, &[(&millis(lease), Type::INT8)])
            .await
    }

    async fn complete(&self, fence: &Fence, completion: &Completion) -> Result<Fenced, StoreError> {
        self.write(Write::Complete(fence.clone(), completion.clone()))
            .await?
            .into_fenced()
    }

    async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        self.write(Write::Release(fence.clone()))
            .await?
            .into_fenced()
    }

    fn subscribe(&self, id: KeyId) -> Arc<Notify> {
        let notify = self.waiters.subscribe(id);
        self.start_listening();
        notify
    }
}

impl Maintenance for PgStore {
    async fn sweep(&self, batch: i64) -> Result<u64, StoreError> {
        if self.distributed().await? {
            return self.sweep_distributed(batch).await;
        }
        self.with_client(|client| async move {
            Ok(client.typed_execute(SWEEP, &[(&batch, Type::INT8)]).await?)
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

impl Health for PgStore {
    fn pool_status(&self) -> Option<PoolStatus> {
        let (size, available, waiting) = self.lanes.pools().map(Pool::status).fold(
            (0, 0, 0),
            |(size, available, waiting), s| {
                (size + s.size, available + s.available, waiting + s.waiting)
            },
        );
        Some(PoolStatus {
            size,
            available,
            waiting: waiting + self.waiting.load(Ordering::Relaxed) + self.group.waiting(),
            batches: self.group.batches(),
            batched_writes: self.group.batched_writes(),
            batch_fallbacks: self.batch_fallbacks.load(Ordering::Relaxed),
        })
    }

    fn replay_cache(&self) -> Option<CacheStatus> {
        self.cache.as_ref().map(|c| c.status())
    }

    /// Reachable, and the schema migrated far enough for this binary.
    async fn ping(&self) -> Result<(), StoreError> {
        let found = self.schema_version().await?;
        let needed = migrate::LATEST;
        if found < needed {
            return Err(StoreError::SchemaBehind { found, needed });
        }
        Ok(())
    }

    fn location(&self) -> Option<String> {
        self.connected_to()
    }
}
