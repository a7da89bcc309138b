//! The store as the request path uses it: every call timed and its failures counted, so
//! that `execute` reads as the state machine it is rather than as bookkeeping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::store::{Completion, Fence, Fenced, KeyStore, Reservation, ReserveRequest, StoreError};

/// A store call site bound to the metrics and the route it counts for.
pub(crate) struct Observed<'a, S> {
    pub store: &'a S,
    pub metrics: &'a Metrics,
    pub route: &'a Arc<str>,
}

impl<S: KeyStore> Observed<'_, S> {
    fn record<T>(&self, op: &'static str, started: Instant, result: &Result<T, StoreError>) {
        self.metrics
            .observe_store(op, started.elapsed(), result.is_ok());
    }

    pub async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        let started = Instant::now();
        let result = self.store.reserve(req).await;
        self.record("reserve", started, &result);
        result
    }

    pub async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        let started = Instant::now();
        let result = self.store.renew(fence, lease).await;
        self.record("renew", started, &result);
        match &result {
            Ok(Fenced::Refused) => Metrics::count_route(&self.metrics.leases_lost, self.route),
            Err(_) => {
                self.metrics.renewal_errors.inc();
            }
            Ok(Fenced::Applied) => {}
        }
        result
    }

    pub async fn complete(
        &self,
        fence: &Fence,
        completion: &Completion,
    ) -> Result<Fenced, StoreError> {
        let started = Instant::now();
        let result = self.store.complete(fence, completion).await;
        self.record("complete", started, &result);
        if let Ok(Fenced::Refused) = result {
            Metrics::count_route(&self.metrics.fenced_off, self.route);
        }
        result
    }

    pub async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        let started = Instant::now();
        let result = self.store.release(fence).await;
        self.record("release", started, &result);
        result
    }
}
