//! The pool's connections in two lanes: most for calls from requests' own tasks, a few
//! for group commit's batches, opened and driven on the store's thread
//! ([`super::io_thread`]).
//!
//! Why two: a batch is read fastest by a thread that does nothing else, but a call from a
//! request's task on a connection driven by another thread pays two wake-ups between
//! threads, which is what an idle proxy's latency is made of. So each caller gets
//! connections driven where it runs. Together they keep to `pool_size`.

use std::sync::Arc;

use deadpool::Runtime;
use deadpool::managed::{Hook, HookError, Timeouts};
use tokio::sync::Semaphore;

use super::connect::Connector;
use super::manager::PgManager;
use super::{MAX_CONNECTION_LIFETIME, Pool, io_thread};
use crate::config::PostgresConfig;
use crate::store::types::StoreError;

/// Connections for one kind of caller, and the turns to use them (see `PgStore::turn`).
#[derive(Clone)]
pub(super) struct Lane {
    pub pool: Pool,
    pub turns: Arc<Semaphore>,
}

/// Both lanes; `batches` is absent when the pool is too small to spare connections.
pub(super) struct Lanes {
    pub calls: Lane,
    pub batches: Option<Lane>,
}

impl Lanes {
    /// `pool_size` connections: `batches` of them for batches when that leaves at least
    /// three for calls, all of them for calls otherwise.
    pub fn new(
        config: &PostgresConfig,
        connector: Connector,
        batches: usize,
    ) -> Result<Self, StoreError> {
        let connector = Arc::new(connector);
        let batches = if config.pool_size >= batches + 3 {
            batches
        } else {
            0
        };
        let lane = |size: usize, on_store_thread: bool| -> Result<Lane, StoreError> {
            let manager = PgManager::new(Arc::clone(&connector), size, on_store_thread);
            Ok(Lane {
                pool: pool(manager, size, config)?,
                turns: Arc::new(Semaphore::new(size)),
            })
        };
        Ok(Self {
            calls: lane(config.pool_size - batches, false)?,
            batches: (batches > 0).then(|| lane(batches, true)).transpose()?,
        })
    }

    /// The lane for a call made where the caller runs: a batch's on the store's thread.
    pub fn here(&self) -> &Lane {
        match &self.batches {
            Some(batches) if io_thread::is_current() => batches,
            _ => &self.calls,
        }
    }

    /// Whether batches have connections of their own (and so run on the store's thread).
    pub fn batches_apart(&self) -> bool {
        self.batches.is_some()
    }

    /// Both lanes' pools.
    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        std::iter::once(&self.calls.pool).chain(self.batches.as_ref().map(|lane| &lane.pool))
    }

    /// What makes the connections (hosts, order, the one in use), shared by both lanes.
    pub fn connector(&self) -> &Connector {
        self.calls.pool.manager().connector()
    }
}

fn pool(manager: PgManager, size: usize, config: &PostgresConfig) -> Result<Pool, StoreError> {
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        // Connecting is bounded by the store timeout of the call that needs it, and
        // each host by the connect timeout: a pool-level bound on the whole connect
        // would spend it all on a dead first host and never reach the next one.
        .timeouts(Timeouts {
            wait: Some(config.timeout),
            create: None,
            recycle: Some(config.timeout),
        })
        // Connections are renewed now and then, so that a name that moved (a managed
        // failover changes what the host name points at) is followed.
        .pre_recycle(Hook::sync_fn(|_, metrics| {
            if metrics.age() > MAX_CONNECTION_LIFETIME {
                Err(HookError::message(
                    "connection reached its maximum lifetime",
                ))
            } else {
                Ok(())
            }
        }))
        .build()
        .map_err(|e| StoreError::Config(format!("pool: {e}")))
}
