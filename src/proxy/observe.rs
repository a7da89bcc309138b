//! The store as the request path uses it: every call timed and its failures counted, and
//! answers sealed on the way in and opened on the way out when `encryption:` is on, so that
//! `execute` reads as the state machine it is rather than as bookkeeping.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::faults::StoreFaults;
use super::held::HeldAnswers;
use crate::metrics::Metrics;
use crate::store::{Completion, Fence, Fenced, KeyStore, Reservation, ReserveRequest, StoreError};
use crate::vault::Vault;

/// A store call site bound to the metrics and the route it counts for.
pub(crate) struct Observed<'a, S> {
    pub store: &'a S,
    pub metrics: &'a Metrics,
    pub route: &'a Arc<str>,
    /// The key ring; `None`: answers are stored in clear (and a sealed one cannot open).
    pub vault: Option<&'a Vault>,
    /// Keyed requests held back while the store's key form is not agreed.
    pub hold: &'a KeyFormHold,
    /// Endings this process holds unwritten; told when the store answers again.
    pub held: &'a HeldAnswers,
    /// The store's faults as calls meet them (disk full, down), for the log, the metrics
    /// and readiness.
    pub faults: &'a StoreFaults,
}

/// Keyed requests held back (answered `503`) until the store's key form is agreed: a
/// proxy that started while the store could not be reached has not yet checked that the
/// stored keys are in its form, and reserving in the wrong one would execute retries again.
#[derive(Debug, Default)]
pub struct KeyFormHold {
    held: AtomicBool,
    why: Mutex<String>,
}

impl KeyFormHold {
    /// Holds keyed requests back; `why` is what their store error says.
    pub fn hold(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            *w = why;
        }
        self.held.store(true, Ordering::Release);
    }

    /// Lets keyed requests through.
    pub fn release(&self) {
        self.held.store(false, Ordering::Release);
    }

    fn check(&self) -> Result<(), StoreError> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = self.why.lock().map(|w| w.clone()).unwrap_or_default();
        Err(StoreError::Config(why))
    }
}

impl<S: KeyStore> Observed<'_, S> {
    /// Times and counts one call; tells the fault tracker how it went (`wrote`: it wrote
    /// a row), and the held endings when the store takes writes again.
    fn record<T>(
        &self,
        op: &'static str,
        started: Instant,
        result: &Result<T, StoreError>,
        wrote: bool,
    ) {
        self.metrics
            .observe_store(op, started.elapsed(), result.is_ok());
        match result {
            Ok(_) => {
                if self.faults.answered(wrote, self.metrics) {
                    self.held.store_answered();
                }
            }
            Err(e) => self.faults.met(e, self.metrics),
        }
    }

    /// Reserves `req`; `clear_key` is the key as the client sent it (`req.key` may be its
    /// stored hash), which log lines name the key by.
    pub async fn reserve(
        &self,
        req: &ReserveRequest<'_>,
        clear_key: &str,
    ) -> Result<Reservation, StoreError> {
        self.hold.check()?;
        let started = Instant::now();
        let result = self.store.reserve(req).await;
        let wrote = matches!(result, Ok(Reservation::Reserved(_)));
        self.record("reserve", started, &result, wrote);
        match result {
            Ok(Reservation::Done(stored)) => Ok(self.open(req, clear_key, stored)),
            other => other,
        }
    }

    /// What [`Observed::reserve`] would answer from the replay cache alone (see
    /// `KeyStore::cached`), timed and opened the same way; `None` while keyed requests are
    /// held back, so that the store call says why.
    pub fn cached(&self, req: &ReserveRequest<'_>, clear_key: &str) -> Option<Reservation> {
        self.hold.check().ok()?;
        let started = Instant::now();
        let hit = self.store.cached(req)?;
        self.metrics
            .observe_store("reserve", started.elapsed(), true);
        Some(match hit {
            Reservation::Done(stored) => self.open(req, clear_key, stored),
            other => other,
        })
    }

    /// A completed key's answer as the client gets it: opened, or — when it cannot be —
    /// said so, counted, and logged loudly: a retry then gets a problem, never the
    /// ciphertext, and the operation is not executed again.
    fn open(
        &self,
        req: &ReserveRequest<'_>,
        clear_key: &str,
        stored: crate::store::StoredResponse,
    ) -> Reservation {
        match Vault::open(self.vault, req.client_id, req.key, stored) {
            Ok(answer) => Reservation::Done(answer),
            Err(why) => {
                Metrics::count_route(&self.metrics.unreadable, self.route);
                tracing::error!(
                    route = %self.route,
                    key = %crate::key::key_hash(req.client_id, clear_key),
                    encryption_key = why.ring_key(),
                    reason = why.reason(),
                    "a stored answer cannot be decrypted: {why}; the retry gets 500 and nothing is executed again (put the key back in encryption.keys, or resolve the key by hand)"
                );
                Reservation::Unreadable(why)
            }
        }
    }

    pub async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        let started = Instant::now();
        let result = self.store.renew(fence, lease).await;
        self.record("renew", started, &result, true);
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
        let sealed;
        let completion = match (self.vault, completion) {
            (Some(vault), Completion::Stored(answer)) if answer.sealed.is_none() => {
                sealed = Completion::Stored(vault.seal(
                    &fence.client_id,
                    &fence.key,
                    fence.token,
                    answer,
                ));
                &sealed
            }
            _ => completion,
        };
        let result = self.store.complete(fence, completion).await;
        self.record("complete", started, &result, true);
        if let Ok(Fenced::Refused) = result {
            Metrics::count_route(&self.metrics.fenced_off, self.route);
        }
        result
    }

    pub async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        let started = Instant::now();
        let result = self.store.release(fence).await;
        self.record("release", started, &result, true);
        result
    }
}
