//! The queue's rules, with a batch runner that records what it was given and holds each
//! batch until the test lets it go (the stores' own batches are tested against real
//! databases in tests/it/group_commit.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{STALLED, *};
use crate::store::{Fence, Fenced};

/// Runs batches only as the test adds permits to `gate`; records each batch's size and
/// the most batches that ran at once.
#[derive(Clone)]
struct Held {
    gate: Arc<Semaphore>,
    sizes: Arc<Mutex<Vec<usize>>>,
    running: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            gate: Arc::new(Semaphore::new(0)),
            sizes: Arc::default(),
            running: Arc::default(),
            most_at_once: Arc::default(),
        }
    }
}

impl WriteBatch for Held {
    async fn write_batch(&self, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        self.sizes.lock().map(|mut s| s.push(writes.len())).ok();
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        writes
            .iter()
            .map(|_| Ok(Written::Fenced(Fenced::Applied)))
            .collect()
    }
}

fn release(n: u64) -> Write {
    Write::Release(Fence {
        client_id: "c".into(),
        key: format!("k{n}"),
        token: i64::try_from(n).unwrap_or(i64::MAX),
        notify: false,
        retention: Duration::from_secs(60),
    })
}

/// Lets the spawned writers reach the queue.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

async fn queue_up(
    group: &Arc<GroupCommit>,
    store: &Held,
    writes: std::ops::Range<u64>,
) -> Vec<tokio::task::JoinHandle<Result<Written, StoreError>>> {
    let tasks = writes
        .map(|n| {
            let (group, store) = (Arc::clone(group), store.clone());
            tokio::spawn(async move { group.write(&store, release(n)).await })
        })
        .collect();
    settle().await;
    tasks
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_batch_starts_only_when_a_full_one_waits() {
    let group = Arc::new(GroupCommit {
        stalled: Duration::from_secs(60),
        ..GroupCommit::new(2, 4, Duration::from_secs(10))
    });
    let store = Held::default();
    // The first write runs alone and is held; three more queue behind it, short of a
    // full batch: they wait for the running one instead of starting a batch of three.
    let mut tasks = queue_up(&group, &store, 0..1).await;
    tasks.extend(queue_up(&group, &store, 1..4).await);
    assert_eq!(store.most_at_once.load(Ordering::SeqCst), 1);
    assert_eq!(group.waiting(), 3);
    // A fourth makes a full batch: a second place is taken beside the held one.
    tasks.extend(queue_up(&group, &store, 4..5).await);
    assert_eq!(store.most_at_once.load(Ordering::SeqCst), 2);
    assert_eq!(group.waiting(), 0);
    store.gate.add_permits(10);
    for task in tasks {
        assert_eq!(
            task.await.ok().and_then(Result::ok),
            Some(Written::Fenced(Fenced::Applied))
        );
    }
    assert_eq!(
        *store.sizes.lock().unwrap_or_else(|e| e.into_inner()),
        [1, 4]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn what_queued_behind_a_running_batch_goes_in_the_next_one() {
    let group = Arc::new(GroupCommit {
        stalled: Duration::from_secs(60),
        ..GroupCommit::new(4, 64, Duration::from_secs(10))
    });
    let store = Held::default();
    let mut tasks = queue_up(&group, &store, 0..1).await;
    tasks.extend(queue_up(&group, &store, 1..11).await);
    assert_eq!(group.waiting(), 10);
    store.gate.add_permits(10);
    for task in tasks {
        assert!(task.await.ok().and_then(Result::ok).is_some());
    }
    assert_eq!(
        *store.sizes.lock().unwrap_or_else(|e| e.into_inner()),
        [1, 10]
    );
    // Every place was given back: the next write runs alone at once.
    let tasks = queue_up(&group, &store, 11..12).await;
    store.gate.add_permits(1);
    for task in tasks {
        assert!(task.await.ok().and_then(Result::ok).is_some());
    }
    assert_eq!(store.most_at_once.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_that_stalls_does_not_hold_up_the_writes_behind_it() {
    let group = Arc::new(GroupCommit::new(2, 64, Duration::from_secs(10)));
    let store = Held::default();
    let mut tasks = queue_up(&group, &store, 0..2).await;
    assert_eq!(store.most_at_once.load(Ordering::SeqCst), 1);
    assert_eq!(group.waiting(), 1);
    // The held batch runs on past STALLED: the next write starts a second batch, which
    // takes the one that waited too.
    tokio::time::sleep(STALLED + Duration::from_millis(5)).await;
    tasks.extend(queue_up(&group, &store, 2..3).await);
    assert_eq!(store.most_at_once.load(Ordering::SeqCst), 2);
    assert_eq!(group.waiting(), 0);
    store.gate.add_permits(10);
    for task in tasks {
        assert!(task.await.ok().and_then(Result::ok).is_some());
    }
    assert_eq!(
        *store.sizes.lock().unwrap_or_else(|e| e.into_inner()),
        [1, 2]
    );
}

fn fenced(n: usize) -> Result<Written, StoreError> {
    Ok(Written::Fenced(if n.is_multiple_of(2) {
        Fenced::Applied
    } else {
        Fenced::Refused
    }))
}

fn is_fenced(answer: &Result<Written, StoreError>, n: usize) -> bool {
    matches!(
        (answer, n % 2),
        (Ok(Written::Fenced(Fenced::Applied)), 0) | (Ok(Written::Fenced(Fenced::Refused)), 1)
    )
}

/// A current-thread runtime on a thread of its own (as each server thread runs), kept
/// alive until `stop` is sent.
fn other_runtime() -> (
    Handle,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let handle = runtime.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        runtime.block_on(async move {
            let _ = stopped.await;
        });
    });
    (handle, stop, thread)
}

#[tokio::test(flavor = "current_thread")]
async fn every_caller_gets_its_own_answer_whichever_runtime_it_waits_on() {
    let (away, stop, thread) = other_runtime();
    let here = Handle::current();
    let homes = [None, Some(away.clone()), Some(here), Some(away.clone())];
    let mut callers = Vec::new();
    let mut answers = Vec::new();
    for n in 0..12 {
        let (reply, answer) = oneshot::channel();
        callers.push((reply, homes[n % homes.len()].clone()));
        answers.push(answer);
    }
    // One answer short: the last caller is told so instead of waiting forever.
    deliver(callers, (0..11).map(fenced).collect());
    for (n, answer) in answers.into_iter().enumerate() {
        let answer = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("answered in time")
            .expect("answered");
        if n < 11 {
            assert!(is_fenced(&answer, n), "caller {n} got another's answer");
        } else {
            assert!(matches!(answer, Err(StoreError::Corrupt(_))));
        }
    }
    let _ = stop.send(());
    let _ = thread.join();
}

#[tokio::test(flavor = "current_thread")]
async fn a_caller_whose_runtime_stopped_is_not_answered_and_nothing_hangs() {
    let (away, stop, thread) = other_runtime();
    let _ = stop.send(());
    let _ = thread.join();
    let (reply, answer) = oneshot::channel();
    deliver(vec![(reply, Some(away))], vec![fenced(0)]);
    let answer = tokio::time::timeout(Duration::from_secs(5), answer)
        .await
        .expect("no hang");
    assert!(answer.is_err());
}
