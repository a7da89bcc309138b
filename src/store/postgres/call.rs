//! How a store call gets a connection: a turn among `pool_size` (so that queued calls stay
//! small), the pooled connection, the store timeout over all of it, and what a call given
//! up on or a connection that broke does to the pool.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};

use tokio::sync::OwnedSemaphorePermit;

use super::lanes::Lane;
use super::{Object, PgStore, Pool};
use crate::store::types::*;

impl PgStore {
    /// Waits for one of `pool_size` turns to use a connection; the call holds it until done.
    ///
    /// Why: past `pool_size` concurrent calls, calls queue, and under load (a thousand
    /// requests on sixteen connections) most requests are such a call. Queued on this
    /// semaphore, each holds a small future; queued inside deadpool's `get`, each would hold
    /// that future's room for opening and recycling a connection (about 3 KiB).
    /// [`PgStore::with_client`] boxes what follows the turn, so a waiting call stays small.
    async fn turn(&self, lane: &Lane) -> Result<OwnedSemaphorePermit, StoreError> {
        let _waiting = Waiting::enter(&self.waiting);
        Arc::clone(&lane.turns)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Config("the store is closed".into()))
    }

    /// The pool of calls from requests' tasks, for migrations and tests.
    pub fn pool(&self) -> &Pool {
        &self.lanes.calls.pool
    }

    /// A pooled connection of its own, unbounded by the store timeout: for migrations,
    /// whose statements may take longer than a request's.
    pub async fn client(&self) -> Result<Object, StoreError> {
        self.pool()
            .get()
            .await
            .map_err(|cause| StoreError::Connect {
                target: Arc::clone(&self.target),
                cause,
            })
    }

    /// The most connections this store opens at once: `pool_size`, over both lanes.
    pub fn max_connections(&self) -> usize {
        self.lanes.pools().map(|pool| pool.status().max_size).sum()
    }

    /// Runs `call` on a pooled connection of the caller's lane (see [`super::lanes`]):
    /// after a turn (see [`PgStore::turn`]), with what follows the turn boxed, all of it
    /// bounded by the store timeout.
    pub(super) async fn with_client<T, Fut>(
        &self,
        call: impl FnOnce(Object) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, StoreError>>,
    {
        // The connection of a call given up on is not lent again: its statement may still
        // run, or its server may have stopped answering (a frozen primary), and the next
        // call on it would only wait behind the first.
        let spoiler = std::sync::Mutex::new(None);
        let lane = self.lanes.here();
        let turn_then_call = async {
            let _turn = self.turn(lane).await?;
            Box::pin(async {
                let client = lane.pool.get().await.map_err(|cause| StoreError::Connect {
                    target: Arc::clone(&self.target),
                    cause,
                })?;
                *spoiler.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.spoiler());
                call(client).await
            })
            .await
        };
        let result = match tokio::time::timeout(self.timeout, turn_then_call).await {
            Ok(result) => result,
            Err(_) => {
                if let Some(spoiled) = spoiler
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                {
                    spoiled.store(true, Ordering::Relaxed);
                }
                Err(StoreError::Timeout(self.timeout))
            }
        };
        if let Err(e) = &result
            && e.breaks_connections()
        {
            // The server went read-only (a demoted primary, a standby) or away: every
            // idle connection to it is as stale as this one. New ones find the primary
            // (`target_session_attrs=read-write`) instead of failing one call each.
            let dropped: usize = self
                .lanes
                .pools()
                .map(|pool| pool.retain(|_, _| false).removed.len())
                .sum();
            tracing::warn!(cause = %e, dropped, "store connection unusable; idle connections dropped, new ones will be made");
        }
        result
    }
}

/// Counts a call as waiting until it is dropped (done, or given up by its timeout).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
