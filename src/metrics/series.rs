//! Series the proxy keeps up beyond counting requests: those created at zero so alerts
//! see them from the start, and the gauges brought up to date from the store.

use std::sync::Arc;

use super::*;

impl Metrics {
    /// Creates every per-route series an alert or a dashboard names, at zero, for the
    /// configured routes: a rule over a series that does not exist yet sees nothing.
    pub fn prime(&self, routes: &[Arc<str>]) {
        for route in routes {
            let label = || RouteName(Arc::clone(route));
            for family in [
                &self.takeovers,
                &self.fenced_off,
                &self.leases_lost,
                &self.unreadable,
            ] {
                let _ = family.get_or_create(&RouteLabel { route: label() });
            }
            let _ = self
                .unresolved_keys
                .get_or_create(&RouteLabel { route: label() });
            for outcome in known::RECONCILED {
                let _ = self.reconciled.get_or_create(&RouteOutcome {
                    route: label(),
                    outcome,
                });
            }
            for (outcome, status_class) in known::REQUEST_OUTCOMES {
                let _ = self.requests.get_or_create(&RouteOutcomeClass {
                    route: label(),
                    outcome,
                    status_class,
                });
            }
        }
        if let Ok(mut shown) = self.unresolved_routes.lock() {
            for route in routes {
                if !shown.contains(route) {
                    shown.push(Arc::clone(route));
                }
            }
        }
    }

    /// Brings the replay cache's series up to `status` (read from the store at a scrape).
    pub fn observe_replay_cache(&self, status: crate::store::CacheStatus) {
        use std::sync::atomic::Ordering;
        self.replay_cache_bytes
            .set(i64::try_from(status.bytes).unwrap_or(i64::MAX));
        let seen = self
            .replay_cache_hits_seen
            .swap(status.hits, Ordering::Relaxed);
        self.replay_cache_hits
            .inc_by(status.hits.saturating_sub(seen));
    }

    /// Brings the pool's gauges and group commit's counters up to `pool` (read from the
    /// store at a scrape).
    pub fn observe_pool(&self, pool: crate::store::PoolStatus) {
        use std::sync::atomic::Ordering;
        self.pool_size
            .set(i64::try_from(pool.size).unwrap_or(i64::MAX));
        self.pool_available
            .set(i64::try_from(pool.available).unwrap_or(i64::MAX));
        self.pool_waiting
            .set(i64::try_from(pool.waiting).unwrap_or(i64::MAX));
        let seen = self
            .store_batches_seen
            .swap(pool.batches, Ordering::Relaxed);
        self.store_batches.inc_by(pool.batches.saturating_sub(seen));
        let seen = self
            .store_batched_writes_seen
            .swap(pool.batched_writes, Ordering::Relaxed);
        self.store_batched_writes
            .inc_by(pool.batched_writes.saturating_sub(seen));
        let seen = self
            .store_batch_fallbacks_seen
            .swap(pool.batch_fallbacks, Ordering::Relaxed);
        self.store_batch_fallbacks
            .inc_by(pool.batch_fallbacks.saturating_sub(seen));
    }

    /// Sets the unresolved-keys gauge from a count of the store: `routes` (the
    /// configured ones) and every route shown before are reported, 0 where none is left.
    pub fn observe_unresolved(&self, routes: &[Arc<str>], counts: &[(String, u64)]) {
        let Ok(mut shown) = self.unresolved_routes.lock() else {
            return;
        };
        for route in routes {
            if !shown.contains(route) {
                shown.push(Arc::clone(route));
            }
        }
        for (route, _) in counts {
            if !shown.iter().any(|r| **r == **route) && shown.len() < MAX_CACHED_SERIES {
                shown.push(Arc::from(route.as_str()));
            }
        }
        for route in shown.iter() {
            let n = counts
                .iter()
                .find(|(r, _)| **r == **route)
                .map_or(0, |(_, n)| *n);
            let _ = self
                .unresolved_keys
                .get_or_create(&RouteLabel {
                    route: RouteName(Arc::clone(route)),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
