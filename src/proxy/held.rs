//! Answers this process holds but could not yet write to the store.
//!
//! Why: when the store refuses a completion (down, disk full) the client still gets the
//! upstream's answer, and the completion is retried in the background. Meanwhile the
//! key's lease may run out (its renewals fail too), and a retry that reaches the store
//! once it is back would take the key over and execute the operation a second time — or,
//! with `takeover: never`, be told the outcome is unknown although this process knows it.
//! So a retry is first looked up here: the process that holds a key's unwritten answer
//! answers it itself (a release not yet written answers `409`), and the held writes are
//! retried the moment any store call succeeds again ([`HeldAnswers::store_answered`]),
//! not after their backoff.
//!
//! The common case costs one atomic load per reservation: nothing is held.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::fingerprint::Fingerprint;
use crate::store::{Completion, KeyId, Reservation};

/// How a held key is to end, as written once the store takes it.
#[derive(Clone)]
pub(crate) enum HeldEnding {
    /// This answer (as the client got it, in clear).
    Answer(Completion),
    /// The reservation is to be deleted: nothing happened upstream.
    Release,
}

impl HeldEnding {
    /// What a retry of the request it is held for is answered while it is held: the
    /// answer, or "in progress" for a release not yet written (the lease a retry would
    /// find is this process's own).
    pub fn reservation(&self) -> Reservation {
        match self {
            HeldEnding::Answer(Completion::Stored(answer)) => Reservation::Done(answer.clone()),
            HeldEnding::Answer(Completion::NotReplayable { status }) => {
                Reservation::NotReplayable { status: *status }
            }
            HeldEnding::Release => Reservation::InProgress {
                lease_remaining: HELD_RETRY_AFTER,
            },
        }
    }
}

/// What a request finds held for its key.
pub(crate) enum HeldFor {
    /// The ending of the request it repeats.
    ThisRequest(HeldEnding),
    /// Another request's under the same key: the key was reused (`422`).
    AnotherRequest,
}

/// One held key: who holds it (its lease token), what it answers, and for which request.
struct Held {
    token: i64,
    fingerprint: Fingerprint,
    ending: HeldEnding,
}

/// The answers this process holds, by key.
#[derive(Default)]
pub(crate) struct HeldAnswers {
    /// Entries in `entries`, read without the lock on every reservation.
    count: AtomicUsize,
    entries: Mutex<HashMap<KeyId, Held>>,
    /// Bumped whenever a store call succeeds while something is held: the holders' retry
    /// loops compare it with what they saw, so a success between two looks is not missed.
    answered: AtomicU64,
    /// Wakes the holders' retry loops when the store answers again.
    kick: Notify,
}

/// What a retry is answered while the pause between a holder's write attempts runs: the
/// lease it would otherwise find in progress is this process's own.
const HELD_RETRY_AFTER: Duration = Duration::from_secs(1);

impl HeldAnswers {
    /// Holds `ending` for the key `id`, reserved under `token` for the request
    /// `fingerprint`, until [`HeldAnswers::forget`].
    pub fn hold(&self, id: KeyId, token: i64, fingerprint: Fingerprint, ending: HeldEnding) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        entries.insert(
            id,
            Held {
                token,
                fingerprint,
                ending,
            },
        );
        self.count.store(entries.len(), Ordering::Release);
    }

    /// The key's ending is written (or fenced off, or given up): stop answering for it.
    /// Only the holder under `token` can take it back.
    pub fn forget(&self, id: &KeyId, token: i64) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.get(id).is_some_and(|h| h.token == token) {
            entries.remove(id);
        }
        self.count.store(entries.len(), Ordering::Release);
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// What this process holds for the key `id`, as seen by a request with `fingerprint`;
    /// `None`: nothing held, ask the store. One look, under one lock.
    pub fn lookup(&self, id: &KeyId, fingerprint: &Fingerprint) -> Option<HeldFor> {
        if self.len() == 0 {
            return None;
        }
        let entries = self.entries.lock().ok()?;
        let held = entries.get(id)?;
        Some(if held.fingerprint == *fingerprint {
            HeldFor::ThisRequest(held.ending.clone())
        } else {
            HeldFor::AnotherRequest
        })
    }

    /// A store call succeeded: if anything is held, its writes are due now.
    pub fn store_answered(&self) {
        if self.len() > 0 {
            self.answered.fetch_add(1, Ordering::AcqRel);
            self.kick.notify_waiters();
        }
    }

    /// How many times the store has answered while something was held (see
    /// [`HeldAnswers::answered_since`]).
    pub fn answers_seen(&self) -> u64 {
        self.answered.load(Ordering::Acquire)
    }

    /// Waits until the store has answered after `seen` (at once if it already has).
    pub async fn answered_since(&self, seen: u64) {
        loop {
            let kicked = self.kick.notified();
            tokio::pin!(kicked);
            kicked.as_mut().enable();
            if self.answers_seen() != seen {
                return;
            }
            kicked.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredResponse;
    use bytes::Bytes;

    fn answer() -> HeldEnding {
        HeldEnding::Answer(Completion::Stored(StoredResponse::clear(
            201,
            Bytes::new(),
            Bytes::from_static(b"{}"),
        )))
    }

    /// What a request is answered from what is held (the store not asked).
    fn reservation(held: &HeldAnswers, id: &KeyId, fp: &Fingerprint) -> Option<Reservation> {
        held.lookup(id, fp).map(|found| match found {
            HeldFor::ThisRequest(ending) => ending.reservation(),
            HeldFor::AnotherRequest => Reservation::Mismatch,
        })
    }

    /// A held answer is replayed to the same request, refused to another, and gone once
    /// its holder forgets it — but not when a stale holder (another token) does.
    #[test]
    fn held_answers_answer_retries_until_forgotten() {
        let held = HeldAnswers::default();
        let (id, fp) = ([1; 32], [2; 32]);
        assert!(reservation(&held, &id, &fp).is_none());
        held.hold(id, 7, fp, answer());
        assert!(
            matches!(reservation(&held, &id, &fp), Some(Reservation::Done(a)) if a.status == 201)
        );
        assert!(matches!(
            reservation(&held, &id, &[3; 32]),
            Some(Reservation::Mismatch)
        ));
        held.forget(&id, 6);
        assert_eq!(held.len(), 1);
        held.forget(&id, 7);
        assert_eq!(held.len(), 0);
        assert!(held.lookup(&id, &fp).is_none());
    }

    /// A release not yet written answers "in progress", never a takeover.
    #[test]
    fn a_held_release_answers_in_progress() {
        let held = HeldAnswers::default();
        held.hold([1; 32], 1, [2; 32], HeldEnding::Release);
        assert!(matches!(
            held.lookup(&[1; 32], &[2; 32]),
            Some(HeldFor::ThisRequest(e)) if matches!(e.reservation(), Reservation::InProgress { .. })
        ));
    }

    /// A store answer seen before the wait starts is not missed.
    #[tokio::test]
    async fn an_answer_before_the_wait_is_not_missed() {
        let held = HeldAnswers::default();
        held.hold([1; 32], 1, [2; 32], HeldEnding::Release);
        let seen = held.answers_seen();
        held.store_answered();
        tokio::time::timeout(Duration::from_secs(1), held.answered_since(seen))
            .await
            .expect("woken");
    }
}
