//! Holding a reserved key until its outcome is written: the lease renewed for as long as
//! the worker works on the key — while the upstream works, and while a completion or a
//! release the store refused is retried — so that no retry can take over a key whose
//! worker is alive and can reach the store.
//!
//! Renewals and the completion's attempts take turns in one task, never at once, so a
//! renewal can never race the completion that ends the lease (and be counted as a lost
//! lease). A renewal the store refused to take is tried again soon, not after a third of
//! the lease: the lease must be extended as soon as the store answers again.
//!
//! An ending the store refused is held in this process ([`super::held`]) until it is
//! written: a retry reaching this process gets it, whatever became of the lease, and the
//! write is tried again as soon as any store call succeeds.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::held::{HeldAnswers, HeldEnding};
use super::observe::Observed;
use crate::config::{OnConflict, Policy};
use crate::fingerprint::Fingerprint;
use crate::store::{Completion, Fence, Fenced, KeyStore, StoreError};

/// How long to keep retrying a completion or release the store refused to take.
const RETRY_WINDOW: Duration = Duration::from_secs(300);
/// First and largest pause between those retries (the largest also at most a third of
/// the lease, so an answer lands soon after the store is back).
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Pause after a failed renewal before the next try (at most a tenth of the lease).
const RENEW_RETRY: Duration = Duration::from_millis(250);

/// The fence of a reservation on a route with `policy`: waiting duplicates are woken when
/// the route lets them wait, and the answer is kept for the route's retention.
pub(crate) fn fence_for(policy: &Policy, client_id: String, key: String, token: i64) -> Fence {
    Fence {
        client_id,
        key,
        token,
        notify: matches!(policy.on_conflict, OnConflict::Wait(_)),
        retention: policy.retention,
    }
}

/// How a held key is to end.
#[derive(Clone, Copy)]
pub(crate) enum Finish<'a> {
    /// Store this answer.
    Complete(&'a Completion),
    /// Delete the reservation: nothing happened, the key may execute afresh.
    Release,
}

/// A reservation being worked on: the store, its fence, and when to renew next.
pub(crate) struct Holder<'a, S> {
    store: Observed<'a, S>,
    fence: Fence,
    /// The request the key was reserved for: a held ending answers only its retries.
    fingerprint: Fingerprint,
    lease: Duration,
    /// When the next renewal is due; kept across [`Holder::during`] calls, so that many
    /// short retry pauses still renew on time.
    due: Instant,
    /// When the lease runs out by this process's clock, as of the last grant or renewal
    /// the store took (the store's clock decides; this is for saying what is true in the
    /// log).
    lease_ends: Instant,
    /// The lease was taken over or the key evicted: nothing to renew any more.
    lost: bool,
    /// The ending is held in this process (see [`Holder::hold`]) until `settle` ends.
    holding: bool,
}

impl<'a, S: KeyStore> Holder<'a, S> {
    /// Holds a lease of `lease` that was just granted for the request `fingerprint`.
    pub fn new(
        store: Observed<'a, S>,
        fence: Fence,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Self {
        let now = Instant::now();
        Self {
            store,
            fence,
            fingerprint,
            lease,
            due: now + lease / 3,
            lease_ends: now + lease,
            lost: false,
            holding: false,
        }
    }

    /// What is left of the lease, in milliseconds (0: it has run out).
    fn lease_left_ms(&self) -> u64 {
        self.lease_ends
            .saturating_duration_since(Instant::now())
            .as_millis() as u64
    }

    /// Holds `finish` in this process until [`Holder::settle`] ends: retries reaching it
    /// get this ending instead of a takeover. Called before the client is answered, so
    /// that its first retry already finds it.
    pub fn hold(&mut self, finish: Finish<'_>) {
        let ending = match finish {
            Finish::Complete(completion) => HeldEnding::Answer(completion.clone()),
            Finish::Release => HeldEnding::Release,
        };
        self.held().hold(
            self.fence.key_id(),
            self.fence.token,
            self.fingerprint,
            ending,
        );
        self.store.metrics.faults.held_answers.inc();
        self.holding = true;
    }

    fn held(&self) -> &'a HeldAnswers {
        self.store.held
    }

    /// Runs `work` with the lease renewed meanwhile.
    pub async fn during<T>(&mut self, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        tokio::select! {
            biased;
            result = &mut work => result,
            never = self.renew_while_polled() => match never {},
        }
    }

    /// Renews the lease whenever due, for as long as it is polled.
    async fn renew_while_polled(&mut self) -> Infallible {
        loop {
            if self.lost {
                return std::future::pending().await;
            }
            sleep_until(self.due).await;
            let asked = Instant::now();
            // Boxed: a renewal is rare (every third of a lease) and its store call carries
            // the most state of anything the waiting request holds.
            match Box::pin(self.store.renew(&self.fence, self.lease)).await {
                Ok(Fenced::Applied) => {
                    self.due = Instant::now() + self.lease / 3;
                    self.lease_ends = asked + self.lease;
                }
                Ok(Fenced::Refused) => {
                    tracing::warn!(
                        "lease lost to a takeover or an eviction; the completion will be fenced off"
                    );
                    self.lost = true;
                }
                Err(e) => {
                    let pause = RENEW_RETRY.min(self.lease / 10);
                    let lease_left_ms = self.lease_left_ms();
                    if lease_left_ms > 0 {
                        tracing::warn!(cause = %e, retry_in_ms = pause.as_millis() as u64, lease_left_ms, "could not renew the lease; trying again before it runs out");
                    } else {
                        tracing::warn!(cause = %e, retry_in_ms = pause.as_millis() as u64, "could not renew the lease, and it has run out: another replica could take the key over once the store answers; trying again");
                    }
                    self.due = Instant::now() + pause;
                }
            }
        }
    }

    /// One attempt at ending the reservation.
    pub async fn attempt(&self, finish: Finish<'_>) -> Result<Fenced, StoreError> {
        match finish {
            Finish::Complete(completion) => self.store.complete(&self.fence, completion).await,
            Finish::Release => self.store.release(&self.fence).await,
        }
    }

    /// Sees an ending through, given its first attempt's result: a refused write is
    /// logged; a failed one is retried with backoff for a bounded time, the lease renewed
    /// between attempts, and at once when the store answers again. Past the bound the key
    /// is left to its lease. Whatever the end, a held ending stops being answered.
    pub async fn settle(&mut self, finish: Finish<'_>, first: Result<Fenced, StoreError>) {
        self.retry(finish, first).await;
        if std::mem::take(&mut self.holding) {
            self.held().forget(&self.fence.key_id(), self.fence.token);
            self.store.metrics.faults.held_answers.dec();
        }
    }

    async fn retry(&mut self, finish: Finish<'_>, first: Result<Fenced, StoreError>) {
        let mut result = first;
        let give_up = Instant::now() + RETRY_WINDOW;
        let mut pause = BACKOFF.0;
        let longest = BACKOFF.1.min(self.lease / 3);
        loop {
            match (result, finish) {
                (Ok(Fenced::Applied), _) => return,
                (Ok(Fenced::Refused), Finish::Complete(_)) => {
                    tracing::warn!(
                        "completion fenced off: the lease was taken over, so the new owner's answer stands"
                    );
                    return;
                }
                (Ok(Fenced::Refused), Finish::Release) => {
                    tracing::warn!("release fenced off: the lease was taken over or evicted");
                    return;
                }
                (Err(e), Finish::Complete(_)) if Instant::now() + pause > give_up => {
                    self.store.metrics.completions_abandoned.inc();
                    tracing::error!(
                        cause = %e,
                        "completion abandoned after retrying; the key stays in progress until its lease runs out, then a retry re-executes with the same derived key"
                    );
                    return;
                }
                (Err(e), Finish::Release) if Instant::now() + pause > give_up => {
                    tracing::warn!(cause = %e, "release abandoned after retrying; the key frees up when its lease runs out");
                    return;
                }
                (Err(e), _) => {
                    let seen = self.held().answers_seen();
                    let lease_left_ms = self.lease_left_ms();
                    if lease_left_ms > 0 {
                        tracing::warn!(cause = %e, retry_in_ms = pause.as_millis() as u64, lease_left_ms, "could not write the key's outcome; retrying, and renewing the lease meanwhile; retries reaching this process get the held outcome");
                    } else {
                        tracing::warn!(cause = %e, retry_in_ms = pause.as_millis() as u64, "could not write the key's outcome, and its lease has run out; retrying; retries reaching this process get the held outcome (another replica could take the key over)");
                    }
                    let held = self.held();
                    // Whichever comes first: the pause, or any store call succeeding.
                    self.during(async {
                        tokio::select! {
                            () = sleep(pause) => {}
                            () = held.answered_since(seen) => {}
                        }
                    })
                    .await;
                    pause = (pause * 2).min(longest);
                    result = self.attempt(finish).await;
                }
            }
        }
    }
}
