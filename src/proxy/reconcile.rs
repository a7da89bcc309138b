//! The reconciler: unresolved keys — in progress, lease run out, nobody knows whether the
//! operation happened — are settled without waiting for a client to retry, on routes
//! whose upstream can be asked (`recovery_probe`).
//!
//! Each pass claims a bounded batch of due keys (a fresh lease token each, so a client
//! retry racing it gets `409` or waits, and another replica's reconciler skips it), asks
//! the probe about every one with the lease renewed meanwhile, and ends each as the probe
//! says: "found" stores the probe's answer (a later retry replays it), "not found" releases
//! the key (a later retry executes), anything else gives it back unresolved with a backoff
//! kept in the row, so that every replica waits it out. The probe is only ever asked;
//! the operation itself is never executed from here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::{Semaphore, oneshot};

use super::call::{Probe, ask_probe};
use super::conclude::conclude;
use super::lease::{Finish, Holder, fence_for};
use super::state::{Proxy, Shared};
use crate::config::{Reconcile, Route};
use crate::key::derived_key;
use crate::metrics::{RouteName, RouteOutcome};
use crate::problem::ProxyError;
use crate::store::{Claim, KeyStore, Maintenance, StoreError};

/// Probes in flight at once per pass; the others wait their turn with their lease renewed.
const PROBES_AT_ONCE: usize = 4;
/// The longest wait before an inconclusive key is asked about again.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The peer address the probe's forwarding headers name: the proxy itself asks.
const SELF_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    pub found: u64,
    pub not_found: u64,
    pub inconclusive: u64,
}

impl<S: KeyStore + Maintenance> Proxy<S> {
    /// One pass: claims up to `reconcile.batch` due unresolved keys and settles each.
    pub async fn reconcile_once(&self, reconcile: Reconcile) -> Result<Reconciled, StoreError> {
        let shared = &self.shared;
        let table = shared.routes.current();
        let probed: Vec<&Arc<Route>> = table
            .routes()
            .iter()
            .filter(|r| r.policy.recovery_probe.is_some())
            .collect();
        let Some(lease) = probed.iter().map(|r| r.policy.lease).max() else {
            return Ok(Reconciled::default());
        };
        let names: Vec<&str> = probed.iter().map(|r| &*r.name).collect();
        let claims = shared
            .store
            .claim_unresolved(&names, lease, reconcile.batch)
            .await?;
        let turns = Semaphore::new(PROBES_AT_ONCE);
        let settled = claims.into_iter().filter_map(|claim| {
            let route = probed.iter().find(|r| *r.name == claim.record.route)?;
            let span = tracing::warn_span!(
                "key",
                key = %crate::key::key_hash(&claim.record.client_id, &claim.record.key),
                route = %route.name
            );
            Some(tracing::Instrument::instrument(
                settle(shared, route, claim, reconcile.interval, &turns),
                span,
            ))
        });
        let mut done = Reconciled::default();
        for said in futures_join_all(settled).await {
            match said {
                Said::Found => done.found += 1,
                Said::NotFound => done.not_found += 1,
                Said::Inconclusive => done.inconclusive += 1,
            }
        }
        Ok(done)
    }

    /// Brings the unresolved-keys gauge up to date (one count through the store's index
    /// of keys in progress).
    pub async fn count_unresolved(&self) {
        let shared = &self.shared;
        match shared.store.unresolved_counts().await {
            Ok(counts) => {
                let routes = shared.routes.current().names();
                shared.metrics.observe_unresolved(&routes, &counts);
            }
            Err(e) => tracing::debug!(cause = %e, "could not count unresolved keys"),
        }
    }
}

/// What the probe said about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Found,
    NotFound,
    Inconclusive,
}

impl Said {
    fn as_str(self) -> &'static str {
        match self {
            Said::Found => "found",
            Said::NotFound => "not_found",
            Said::Inconclusive => "inconclusive",
        }
    }
}

/// Asks the probe about one claimed key and ends the claim as it says.
async fn settle<S: KeyStore + Maintenance>(
    shared: &Shared<S>,
    route: &Arc<Route>,
    claim: Claim,
    interval: Duration,
    turns: &Semaphore,
) -> Said {
    let policy = &route.policy;
    let record = claim.record;
    let key_hash = crate::key::key_hash(&record.client_id, &record.key);
    let fence = fence_for(policy, record.client_id, record.key, record.lease_token);
    let store = shared.observed(&route.name);
    // A row's fingerprint is always 32 bytes; one that is not matches no request.
    let fingerprint = record.fingerprint.as_slice().try_into().unwrap_or([0; 32]);
    let mut holder = Holder::new(store, fence.clone(), fingerprint, policy.lease);
    let _turn = holder.during(turns.acquire()).await;
    let Some(probe) = &policy.recovery_probe else {
        return Said::Inconclusive;
    };
    let derived = record
        .derived_key
        .clone()
        .unwrap_or_else(|| derived_key(&fence.client_id, &fence.key));
    let value = HeaderValue::from_str(&derived).ok();
    let asked = holder
        .during(ask_probe(shared, probe, &derived, value, policy, SELF_PEER))
        .await;
    let said = match asked {
        Probe::Found(answer) => {
            tracing::warn!(route = %route.name, key = %key_hash, attempts = record.attempts, "reconciler: the recovery probe found the operation; storing its answer, retries replay it");
            // Nobody waits for this answer: the channel's other end is gone at once.
            let (tx, _) = oneshot::channel();
            conclude(&mut holder, policy, answer, tx).await;
            Said::Found
        }
        Probe::NotFound => {
            tracing::warn!(route = %route.name, key = %key_hash, attempts = record.attempts, "reconciler: the recovery probe did not find the operation; released, the next retry executes");
            let first = holder.attempt(Finish::Release).await;
            if first.is_err() {
                holder.hold(Finish::Release);
            }
            holder.settle(Finish::Release, first).await;
            Said::NotFound
        }
        Probe::Inconclusive(err) => {
            let retry_in = backoff(interval, record.probes);
            let answer = match err {
                ProxyError::ProbeInconclusive {
                    status: Some(status),
                } => status.to_string(),
                _ => "no answer".to_owned(),
            };
            tracing::warn!(route = %route.name, key = %key_hash, probes = record.probes + 1, retry_in_s = retry_in.as_secs(), "reconciler: the recovery probe was inconclusive; the key stays unresolved");
            if let Err(e) = shared
                .store
                .defer(&fence, claim.unresolved_since_ms, retry_in, &answer)
                .await
            {
                // The claim's lease runs out by itself: the key is unresolved again then.
                tracing::warn!(cause = %e, key = %key_hash, "reconciler: could not give the key back; it is unresolved again when the claim's lease runs out");
            }
            Said::Inconclusive
        }
    };
    shared
        .metrics
        .reconciled
        .get_or_create(&RouteOutcome {
            route: RouteName(Arc::clone(&route.name)),
            outcome: said.as_str(),
        })
        .inc();
    said
}

/// The wait before an inconclusive key is asked about again: the interval, doubled per
/// inconclusive probe so far, at most [`MAX_BACKOFF`] (and never below the interval).
fn backoff(interval: Duration, probes: i32) -> Duration {
    let doublings = u32::try_from(probes).unwrap_or(0).min(20);
    interval
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
        .max(interval)
}

/// Polls every future to the end, concurrently, in one task.
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut set: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs = Vec::with_capacity(set.len());
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| match f.as_mut().poll(cx) {
            std::task::Poll::Ready(out) => {
                outputs.push(out);
                false
            }
            std::task::Poll::Pending => true,
        });
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backoff doubles from the interval and stops at an hour.
    #[test]
    fn backoff_doubles_up_to_an_hour() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(30), 0), s(30));
        assert_eq!(backoff(s(30), 1), s(60));
        assert_eq!(backoff(s(30), 3), s(240));
        assert_eq!(backoff(s(30), 10), MAX_BACKOFF);
        assert_eq!(backoff(s(30), i32::MAX), MAX_BACKOFF);
        assert_eq!(backoff(s(7200), 2), s(7200));
    }
}
