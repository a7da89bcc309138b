//! Group commit: concurrent reservations, completions and releases share one round trip
//! and one commit.
//!
//! Why: a keyed request is two writes, and a database commits (and fsyncs) each write on
//! its own. Under load most of the store's work is that per-transaction cost, not the
//! rows. Here a write joins a queue; when no batch is running, the writer starts one at
//! once with whatever is queued (an idle proxy therefore sends at once: nothing waits for
//! a timer), and while a batch runs the next one accumulates. A second batch (up to
//! `max_in_flight`) starts beside it only once a full batch's worth waits: two half
//! batches cost the database nearly twice what one whole one does, so more batches at
//! once pay only when one cannot take what arrives (measured in bench/RESULTS.md).
//!
//! A batch is not a transaction whose failure fails its neighbours: each member gets its
//! own outcome, and a statement error in one member makes the store run the members one by
//! one (see the stores' `write_batch`), so only the bad one fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::types::*;
use super::writes::{Write, WriteBatch, Written};

/// How long a batch runs before writes that queue behind it may start another beside it
/// (where the store allows several): far longer than a batch takes under load (a few
/// milliseconds), far shorter than the store timeout.
const STALLED: Duration = Duration::from_millis(20);

/// The queue of writes waiting for a batch.
pub(super) struct GroupCommit {
    queue: Mutex<Queue>,
    /// Batches running at once (PostgreSQL: a few connections; SQLite: its one writer).
    max_in_flight: usize,
    /// Writes per batch at most.
    max_batch: usize,
    /// Bound on one write, the wait in the queue included.
    timeout: Duration,
    /// [`STALLED`], but for tests.
    stalled: Duration,
    /// Batches sent and the writes in them, since start (for metrics).
    batches: AtomicU64,
    batched_writes: AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Member>,
    in_flight: usize,
    /// When the latest batch started: a batch running far longer than usual (a lock wait
    /// behind another replica, a connection that hangs) must not hold up every write.
    latest_start: Option<Instant>,
}

struct Member {
    write: Write,
    reply: Reply,
    /// The runtime its caller waits on, to hand it its answer there ([`deliver`]).
    home: Option<Handle>,
}

impl GroupCommit {
    pub(super) fn new(max_in_flight: usize, max_batch: usize, timeout: Duration) -> Self {
        Self {
            queue: Mutex::default(),
            max_in_flight: max_in_flight.max(1),
            max_batch: max_batch.max(1),
            timeout,
            stalled: STALLED,
            batches: AtomicU64::new(0),
            batched_writes: AtomicU64::new(0),
        }
    }

    /// Batches sent since start.
    pub(super) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Writes sent in batches since start.
    pub(super) fn batched_writes(&self) -> u64 {
        self.batched_writes.load(Ordering::Relaxed)
    }

    /// Counts a batch of `writes` sent (also a write sent on its own, outside a batch).
    pub(super) fn count(&self, writes: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_writes
            .fetch_add(u64::try_from(writes).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Whether a writer may start a batch now: when none runs, or when a place is free and
    /// a full batch waits or the latest batch has run for longer than [`STALLED`].
    /// Otherwise a running batch takes the queue when it ends.
    fn may_start(&self, queue: &Queue) -> bool {
        queue.in_flight == 0
            || (queue.in_flight < self.max_in_flight
                && (queue.waiting.len() >= self.max_batch
                    || queue
                        .latest_start
                        .is_some_and(|t| t.elapsed() >= self.stalled)))
    }

    /// Writes waiting for a batch to take them (for the `pool_waiting` gauge).
    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `write` in the next batch, bounded by the store timeout.
    pub(super) async fn write<S: WriteBatch>(
        self: &Arc<Self>,
        store: &S,
        write: Write,
    ) -> Result<Written, StoreError> {
        let alone = {
            let mut queue = self.lock();
            let alone = queue.waiting.is_empty() && self.may_start(&queue);
            if alone {
                queue.in_flight += 1;
                queue.latest_start = Some(Instant::now());
            }
            alone
        };
        if alone {
            // Boxed: inline, its state (the write, the timer, the place) would size every
            // caller's future, most of which only wait in the queue.
            return Box::pin(self.write_alone(store, write)).await;
        }
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = self.lock();
            queue.waiting.push(Member {
                write,
                reply,
                home: Handle::try_current().ok(),
            });
            if self.may_start(&queue) {
                queue.in_flight += 1;
                queue.latest_start = Some(Instant::now());
                Some(self.take(&mut queue))
            } else {
                None
            }
        };
        if let Some(batch) = start {
            // A task of its own: the batch answers every member even when the caller that
            // started it goes away (its client disconnected).
            self.start(store, batch);
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Blocking(
                "the batch this write was in ended without an answer".into(),
            )),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// A write that found nothing queued and a place free: sent at once from the caller's
    /// own task. Handing it to a batch task and back would cost an idle proxy a task
    /// wake-up per write (measured: +0.1 ms on a keyed request's p50). Writes that queue
    /// meanwhile are handed to a batch task when this one is done, or when its caller
    /// goes away first.
    async fn write_alone<S: WriteBatch>(
        self: &Arc<Self>,
        store: &S,
        write: Write,
    ) -> Result<Written, StoreError> {
        let mut place = Place {
            group: self,
            store,
            held: true,
        };
        // Boxed: a store's batch future is large, and inline it would size every caller's
        // future (most of which only wait in the queue) to it.
        self.count(1);
        let result =
            tokio::time::timeout(self.timeout, Box::pin(store.write_batch(vec![write]))).await;
        place.hand_over();
        match result {
            Ok(mut results) => results
                .pop()
                .unwrap_or_else(|| Err(StoreError::Corrupt("a batch gave no answer".into()))),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Up to `max_batch` waiting writes whose callers still wait (a caller that gave up,
    /// or whose client left, asked for nothing any more).
    fn take(&self, queue: &mut Queue) -> Vec<Member> {
        queue.waiting.retain(|m| !m.reply.is_closed());
        let n = queue.waiting.len().min(self.max_batch);
        queue.waiting.drain(..n).collect()
    }

    /// The next batch for a holder of a place, or — when nothing waits — the place given
    /// back, under the same lock a writer checks it under: a write queued after this
    /// either sees the place free or is in the batch returned.
    fn next_or_give_back(&self) -> Vec<Member> {
        let mut queue = self.lock();
        let batch = self.take(&mut queue);
        if batch.is_empty() {
            queue.in_flight = queue.in_flight.saturating_sub(1);
        } else {
            queue.latest_start = Some(Instant::now());
        }
        batch
    }

    /// Gives a place back unconditionally (its holder ended unexpectedly).
    fn give_back(&self) {
        let mut queue = self.lock();
        queue.in_flight = queue.in_flight.saturating_sub(1);
    }

    /// Runs `batch` and what queues after it in a task of the store's choosing, which holds
    /// the place its caller took. Without a runtime (the process is ending) the place is
    /// given back: the members' callers are gone too.
    fn start<S: WriteBatch>(self: &Arc<Self>, store: &S, batch: Vec<Member>) {
        if !store.start_batches(Arc::clone(self).drive(store.clone(), batch)) {
            self.give_back();
        }
    }

    /// Runs batches until the queue is empty, then gives up its place.
    async fn drive<S: WriteBatch>(self: Arc<Self>, store: S, mut batch: Vec<Member>) {
        let mut running = Running(Some(&self));
        loop {
            if !batch.is_empty() {
                let (writes, callers): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .map(|m| (m.write, (m.reply, m.home)))
                    .unzip();
                self.count(writes.len());
                let results = store.write_batch(writes).await;
                deliver(callers, results);
            }
            batch = self.next_or_give_back();
            if batch.is_empty() {
                running.0 = None;
                return;
            }
        }
    }
}

/// Where a member's caller waits for its answer.
type Reply = oneshot::Sender<Result<Written, StoreError>>;

/// Where a batch's answers go: a member's reply and the runtime its caller waits on.
type Caller = (Reply, Option<Handle>);

/// A reply and the answer it carries.
type Answer = (Reply, Result<Written, StoreError>);

/// Hands each caller its answer, on the runtime it waits on.
///
/// Why not simply `send` from here: waking a task of another current-thread runtime (the
/// server runs one per core; PostgreSQL's batches run on the store's thread) writes to
/// that runtime's eventfd, one system call per member — measured, about a tenth of the
/// proxy's CPU on the keyed path. One task spawned on each other runtime, handing its
/// callers their answers there, costs one per runtime and batch.
fn deliver(callers: Vec<Caller>, results: Vec<Result<Written, StoreError>>) {
    let here = Handle::try_current().ok().map(|h| h.id());
    let mut results = results.into_iter();
    let mut away: Vec<(Handle, Vec<Answer>)> = Vec::new();
    for (reply, home) in callers {
        let result = results.next().unwrap_or_else(|| {
            Err(StoreError::Corrupt(
                "a batch gave fewer answers than writes".into(),
            ))
        });
        match home {
            Some(home) if Some(home.id()) != here => {
                match away.iter_mut().find(|(h, _)| h.id() == home.id()) {
                    Some((_, answers)) => answers.push((reply, result)),
                    None => away.push((home, vec![(reply, result)])),
                }
            }
            // A caller that gave up meanwhile no longer listens.
            _ => drop(reply.send(result)),
        }
    }
    for (home, answers) in away {
        // A runtime that has stopped drops the task, and with it the replies: its
        // callers are gone too.
        drop(home.spawn(async move {
            for (reply, result) in answers {
                let _ = reply.send(result);
            }
        }));
    }
}

/// A place among the running batches held by a lone write's caller.
struct Place<'a, S: WriteBatch> {
    group: &'a Arc<GroupCommit>,
    store: &'a S,
    held: bool,
}

impl<S: WriteBatch> Place<'_, S> {
    /// Gives the place to a batch task for what queued meanwhile, or back if nothing did.
    fn hand_over(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        let batch = self.group.next_or_give_back();
        if batch.is_empty() {
            return;
        }
        self.group.start(self.store, batch);
    }
}

impl<S: WriteBatch> Drop for Place<'_, S> {
    fn drop(&mut self) {
        self.hand_over();
    }
}

/// Gives a running batch's place back if its task ends unexpectedly (a panic), so that a
/// later write can start the next batch.
struct Running<'a>(Option<&'a GroupCommit>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            group.give_back();
        }
    }
}

#[cfg(test)]
#[path = "group_commit_tests.rs"]
mod tests;
