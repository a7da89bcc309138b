//! One conformance suite for every store: the same assertions run on PostgreSQL and on the
//! embedded store, so the proxy's guarantees do not depend on which one is configured.

use crate::support;

use std::time::Duration;

use std::sync::Arc;

use idemproxy::store::{
    AnyStore, Claim, Completion, Fence, Fenced, Health, Inspect, KeyId, KeyRecord, KeyStore, Lease,
    Maintenance, PageMark, PoolStatus, Reservation, ReserveRequest, StoreError, StoredResponse,
    Stuck, Write, WriteBatch, Written,
};
use support::*;
use tokio::sync::Notify;

/// What a scenario runs on: a store, with each write sent alone (as the proxy sends a lone
/// write) or `batched` (each sent in a batch with a write that changes nothing), so that
/// the same assertions hold for the statement group commit uses.
struct Subject {
    db: Backend,
    batched: bool,
}

impl Subject {
    fn store(&self) -> Store {
        Store {
            inner: self.db.store(),
            batched: self.batched,
        }
    }

    async fn rows(&self) -> i64 {
        self.db.rows().await
    }
}

#[derive(Clone)]
struct Store {
    inner: AnyStore,
    batched: bool,
}

impl Store {
    /// `write`, alone or in a batch behind a release of a key nobody holds.
    async fn write(&self, write: Write) -> Result<Written, StoreError> {
        if !self.batched {
            return self.inner.write_batch(vec![write]).await.remove(0);
        }
        let nothing = Write::Release(Fence {
            client_id: "nobody".into(),
            key: "nothing".into(),
            token: -1,
            notify: false,
            retention: DAY,
        });
        let mut answers = self.inner.write_batch(vec![nothing, write]).await;
        assert_eq!(answers.len(), 2);
        // The batch was taken as a batch, not worked around one write at a time (which
        // would pass every assertion here, only slowly: what group commit on a
        // distributed table once did).
        assert_eq!(
            self.inner.pool_status().map(|p| p.batch_fallbacks),
            Some(0),
            "the store refused a batch"
        );
        assert_eq!(
            answers[0].as_ref().unwrap(),
            &Written::Fenced(Fenced::Refused)
        );
        answers.remove(1)
    }
}

impl KeyStore for Store {
    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        self.write(Write::Reserve(req.into()))
            .await?
            .into_reservation()
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        self.inner.renew(fence, lease).await
    }

    async fn complete(&self, fence: &Fence, completion: &Completion) -> Result<Fenced, StoreError> {
        self.write(Write::Complete(fence.clone(), completion.clone()))
            .await?
            .into_fenced()
    }

    async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        self.write(Write::Release(fence.clone()))
            .await?
            .into_fenced()
    }

    fn subscribe(&self, id: KeyId) -> Arc<Notify> {
        self.inner.subscribe(id)
    }
}

impl Maintenance for Store {
    async fn sweep(&self, batch: i64) -> Result<u64, StoreError> {
        self.inner.sweep(batch).await
    }

    async fn sweep_unresolved(
        &self,
        unresolved_for: Duration,
        batch: i64,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        self.inner.sweep_unresolved(unresolved_for, batch).await
    }

    async fn claim_unresolved(
        &self,
        routes: &[&str],
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim_unresolved(routes, lease, limit).await
    }

    async fn defer(
        &self,
        fence: &Fence,
        unresolved_since_ms: i64,
        retry_in: Duration,
        answer: &str,
    ) -> Result<Fenced, StoreError> {
        self.inner
            .defer(fence, unresolved_since_ms, retry_in, answer)
            .await
    }

    async fn unresolved_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.unresolved_counts().await
    }
}

impl Inspect for Store {
    async fn lookup(&self, client_id: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.inner.lookup(client_id, key).await
    }

    async fn evict(&self, client_id: &str, key: &str) -> Result<bool, StoreError> {
        self.inner.evict(client_id, key).await
    }

    async fn stuck(&self, after: Option<&PageMark>, limit: i64) -> Result<Vec<Stuck>, StoreError> {
        self.inner.stuck(after, limit).await
    }

    async fn answer(
        &self,
        client_id: &str,
        key: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        self.inner.answer(client_id, key).await
    }
}

impl Health for Store {
    fn pool_status(&self) -> Option<PoolStatus> {
        self.inner.pool_status()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

/// Each scenario on both stores, with writes alone and batched.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        conformance!(@mode postgres, Backend::postgres().await, false, $($name),*);
        conformance!(@mode embedded, Backend::embedded(), false, $($name),*);
        conformance!(@mode postgres_batched, Backend::postgres().await, true, $($name),*);
        conformance!(@mode embedded_batched, Backend::embedded(), true, $($name),*);
        conformance!(@mode citus, Backend::citus().await, false, $($name),*);
        conformance!(@mode citus_batched, Backend::citus().await, true, $($name),*);
    };
    (@mode $mode:ident, $backend:expr, $batched:expr, $($name:ident),*) => {
        mod $mode {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Subject { db: $backend, batched: $batched }).await
                }
            )*
        }
    };
}

const FP: [u8; 32] = [1; 32];
const OTHER_FP: [u8; 32] = [2; 32];

fn req<'a>(
    key: &'a str,
    fp: &'a [u8; 32],
    lease: Duration,
    retention: Duration,
) -> ReserveRequest<'a> {
    ReserveRequest {
        client_id: "client",
        key,
        fingerprint: fp,
        route: "route",
        lease,
        retention,
        takeover: true,
        derived_key: None,
    }
}

const LONG: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);
const TINY: Duration = Duration::from_millis(1);

async fn reserved<S: KeyStore>(
    store: &S,
    key: &str,
    lease: Duration,
    retention: Duration,
) -> Lease {
    match store
        .reserve(&req(key, &FP, lease, retention))
        .await
        .unwrap()
    {
        Reservation::Reserved(lease) => lease,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// The fence of a request whose answer is kept for `retention` after it completes.
fn fence_for(key: &str, lease: &Lease, retention: Duration) -> Fence {
    Fence {
        retention,
        ..fence(key, lease)
    }
}

fn fence(key: &str, lease: &Lease) -> Fence {
    Fence {
        client_id: "client".into(),
        key: key.into(),
        token: lease.token,
        notify: false,
        retention: DAY,
    }
}

fn answer(body: &str) -> Completion {
    Completion::Stored(StoredResponse::clear(
        201,
        "content-type: application/json\r\n".into(),
        body.to_owned().into(),
    ))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Let a 1 ms lease or retention run out (the clock is the store's).
async fn expire() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

/// A fresh key is reserved (attempt 1); a duplicate is told it is in progress; a different
/// request under the same key is a mismatch.
async fn reserve_conflict_mismatch(db: Subject) {
    let store = db.store();
    let lease = reserved(&store, "k", LONG, DAY).await;
    assert_eq!((lease.attempts, lease.takeover), (1, false));
    match store.reserve(&req("k", &FP, LONG, DAY)).await.unwrap() {
        Reservation::InProgress { lease_remaining } => {
            assert!(lease_remaining > Duration::from_secs(20))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store
            .reserve(&req("k", &OTHER_FP, LONG, DAY))
            .await
            .unwrap(),
        Reservation::Mismatch
    );
}

/// A completed key replays exactly what was stored; a mismatch stays a mismatch.
async fn complete_then_replay(db: Subject) {
    let store = db.store();
    let lease = reserved(&store, "k", LONG, DAY).await;
    assert_eq!(
        store
            .complete(&fence("k", &lease), &answer("{\"id\":1}"))
            .await
            .unwrap(),
        Fenced::Applied
    );
    let Completion::Stored(stored) = answer("{\"id\":1}") else {
        unreachable!()
    };
    assert_eq!(
        store.reserve(&req("k", &FP, LONG, DAY)).await.unwrap(),
        Reservation::Done(stored)
    );
    assert_eq!(
        store
            .reserve(&req("k", &OTHER_FP, LONG, DAY))
            .await
            .unwrap(),
        Reservation::Mismatch
    );
    let record = store.lookup("client", "k").await.unwrap().unwrap();
    assert_eq!(
        (
            record.state.status(),
            record.response_status,
            record.attempts
        ),
        ("done", Some(201), 1)
    );
    assert_eq!(record.response_body_bytes, Some(8));
}

/// An expired lease with the same fingerprint is taken over with a new token and the
/// attempt counted; with another fingerprint it is a mismatch, not a takeover.
async fn takeover_after_expiry(db: Subject) {
    let store = db.store();
    let first = reserved(&store, "k", TINY, DAY).await;
    expire().await;
    assert_eq!(
        store
            .reserve(&req("k", &OTHER_FP, LONG, DAY))
            .await
            .unwrap(),
        Reservation::Mismatch
    );
    let second = reserved(&store, "k", LONG, DAY).await;
    assert!(second.takeover);
    assert_eq!(second.attempts, 2);
    assert_ne!(second.token, first.token);
}

/// A caller that may not take over (`takeover: never`) is told an expired lease is
/// unresolved, and the row is left exactly as it was; one that may takes it over.
async fn unresolved_is_reported_not_taken_over(db: Subject) {
    let store = db.store();
    let first = reserved(&store, "k", TINY, DAY).await;
    expire().await;
    let no_takeover = ReserveRequest {
        takeover: false,
        ..req("k", &FP, LONG, DAY)
    };
    assert_eq!(
        store.reserve(&no_takeover).await.unwrap(),
        Reservation::Unresolved { attempts: 1 }
    );
    let row = store.lookup("client", "k").await.unwrap().unwrap();
    assert_eq!((row.lease_token, row.attempts), (first.token, 1));
    assert!(row.state.lease_remaining_ms().unwrap() < 0);
    let taken = reserved(&store, "k", LONG, DAY).await;
    assert!(taken.takeover);
}

/// After a takeover the old owner can neither renew, complete nor release; the new owner's
/// answer is the one that stands.
async fn fence_refuses_the_stale_owner(db: Subject) {
    let store = db.store();
    let old = reserved(&store, "k", TINY, DAY).await;
    expire().await;
    let new = reserved(&store, "k", LONG, DAY).await;
    assert_eq!(
        store.renew(&fence("k", &old), LONG).await.unwrap(),
        Fenced::Refused
    );
    assert_eq!(
        store.release(&fence("k", &old)).await.unwrap(),
        Fenced::Refused
    );
    assert_eq!(
        store
            .complete(&fence("k", &new), &answer("new"))
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store
            .complete(&fence("k", &old), &answer("old"))
            .await
            .unwrap(),
        Fenced::Refused
    );
    let Reservation::Done(stored) = store.reserve(&req("k", &FP, LONG, DAY)).await.unwrap() else {
        panic!("done")
    };
    assert_eq!(stored.body, "new");
}

/// Release frees the key; the next reservation gets a token never handed out before, so a
/// worker from before the release stays fenced off. A done key cannot be released.
async fn release_frees_and_tokens_are_never_reused(db: Subject) {
    let store = db.store();
    let first = reserved(&store, "k", LONG, DAY).await;
    assert_eq!(
        store.release(&fence("k", &first)).await.unwrap(),
        Fenced::Applied
    );
    assert!(store.lookup("client", "k").await.unwrap().is_none());
    let second = reserved(&store, "k", LONG, DAY).await;
    assert!(second.token > first.token);
    assert!(!second.takeover);
    assert_eq!(
        store
            .complete(&fence("k", &first), &answer("stale"))
            .await
            .unwrap(),
        Fenced::Refused
    );
    assert_eq!(
        store
            .complete(&fence("k", &second), &answer("ok"))
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.release(&fence("k", &second)).await.unwrap(),
        Fenced::Refused,
        "done rows stay"
    );
}

/// Renewal keeps a short lease alive past its original end.
async fn renewal_extends_the_lease(db: Subject) {
    let store = db.store();
    let lease = reserved(&store, "k", Duration::from_millis(300), DAY).await;
    assert_eq!(
        store.renew(&fence("k", &lease), LONG).await.unwrap(),
        Fenced::Applied
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        store.reserve(&req("k", &FP, LONG, DAY)).await.unwrap(),
        Reservation::InProgress { .. }
    ));
}

/// An answer completed as not replayable is reported so, never replayed or re-executed.
async fn not_replayable_completion(db: Subject) {
    let store = db.store();
    let lease = reserved(&store, "k", LONG, DAY).await;
    let done = Completion::NotReplayable { status: 200 };
    assert_eq!(
        store.complete(&fence("k", &lease), &done).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.reserve(&req("k", &FP, LONG, DAY)).await.unwrap(),
        Reservation::NotReplayable { status: 200 }
    );
}

/// The sweep deletes done rows past retention and abandoned in-progress rows past it, and
/// keeps everything else.
async fn sweep_respects_retention(db: Subject) {
    let store = db.store();
    let old_done = reserved(&store, "old-done", LONG, DAY).await;
    store
        .complete(&fence_for("old-done", &old_done, TINY), &answer("x"))
        .await
        .unwrap();
    reserved(&store, "old-unresolved", TINY, TINY).await;
    reserved(&store, "old-but-live", LONG, TINY).await;
    // Reserved with a short retention, but the retention counts from the completion.
    let fresh = reserved(&store, "fresh-done", LONG, TINY).await;
    expire().await;
    store
        .complete(&fence("fresh-done", &fresh), &answer("x"))
        .await
        .unwrap();
    assert_eq!(store.sweep(100).await.unwrap(), 1);
    assert!(store.lookup("client", "old-done").await.unwrap().is_none());
    for kept in ["old-unresolved", "old-but-live", "fresh-done"] {
        assert!(
            store.lookup("client", kept).await.unwrap().is_some(),
            "{kept} was swept"
        );
    }
    assert_eq!(store.sweep(100).await.unwrap(), 0);

    // Unresolved keys go only when the operator bounds them, and they are named.
    assert!(store.sweep_unresolved(DAY, 100).await.unwrap().is_empty());
    let gone = store.sweep_unresolved(TINY, 100).await.unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(
        (gone[0].key.as_str(), gone[0].state.status()),
        ("old-unresolved", "in_progress")
    );
    assert!(
        store
            .lookup("client", "old-but-live")
            .await
            .unwrap()
            .is_some(),
        "a live lease is never swept"
    );
}

/// Two sweepers at once (two replicas) delete every expired row exactly once, in batches.
async fn concurrent_sweepers_delete_each_row_once(db: Subject) {
    let store = db.store();
    for i in 0..120 {
        let key = format!("k{i}");
        let lease = reserved(&store, &key, LONG, TINY).await;
        store
            .complete(&fence_for(&key, &lease, TINY), &answer("x"))
            .await
            .unwrap();
    }
    expire().await;
    let sweeper = |store: Store| async move {
        let mut total = 0;
        loop {
            let n = store.sweep(10).await.unwrap();
            if n == 0 {
                return total;
            }
            total += n;
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(sweeper(db.store())),
        tokio::spawn(sweeper(db.store()))
    );
    assert_eq!(a.unwrap() + b.unwrap(), 120);
    assert_eq!(db.rows().await, 0);
}

/// Dozens of tasks reserving one key at once: exactly one wins.
async fn dozens_of_concurrent_reservations(db: Subject) {
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let store = db.store();
        tasks.push(tokio::spawn(async move {
            store.reserve(&req("hot", &FP, LONG, DAY)).await.unwrap()
        }));
    }
    let mut winners = 0;
    for t in tasks {
        match t.await.unwrap() {
            Reservation::Reserved(_) => winners += 1,
            Reservation::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(winners, 1);
}

/// Operators see abandoned keys and can evict them; an evicted key starts afresh.
async fn stuck_and_evict(db: Subject) {
    let store = db.store();
    reserved(&store, "abandoned", TINY, DAY).await;
    reserved(&store, "live", LONG, DAY).await;
    expire().await;
    let stuck = store.stuck(None, 10).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].record.key, "abandoned");
    assert!(stuck[0].record.state.lease_remaining_ms().unwrap() < 0);
    assert!(store.evict("client", "abandoned").await.unwrap());
    assert!(!store.evict("client", "abandoned").await.unwrap());
    let again = reserved(&store, "abandoned", LONG, DAY).await;
    assert_eq!((again.attempts, again.takeover), (1, false));
}

/// Unresolved keys are listed a page at a time, longest unresolved first: following each
/// page's last mark lists every key exactly once, in order, also when many share a lease
/// end (reserved in one batch); a key in flight is never listed.
async fn stuck_pages_list_every_key_once(db: Subject) {
    let store = db.store();
    let keys: Vec<String> = (0..23).map(|i| format!("u{i:02}")).collect();
    let reservations = keys.iter().map(|k| {
        let store = store.clone();
        let k = k.clone();
        async move { reserved(&store, &k, TINY, DAY).await }
    });
    futures_join_all(reservations).await;
    reserved(&store, "live", LONG, DAY).await;
    expire().await;
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store.stuck(after.as_ref(), 5).await.unwrap();
        assert!(page.len() <= 5);
        let Some(last) = page.last() else { break };
        after = Some(last.mark.clone());
        seen.extend(
            page.into_iter()
                .map(|s| (s.mark.lease_end_us, s.record.key)),
        );
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "pages come in lease order, then key order");
    let mut listed: Vec<String> = seen.into_iter().map(|(_, k)| k).collect();
    listed.sort();
    assert_eq!(listed, keys);
    // A mark survives its token form.
    let first = store.stuck(None, 1).await.unwrap().remove(0).mark;
    assert_eq!(PageMark::decode(&first.encode()), Some(first));
}

/// An operator may read a completed key's stored answer; a key in flight has none.
async fn stored_answers_are_read_for_operators(db: Subject) {
    let store = db.store();
    let lease = reserved(&store, "done", LONG, DAY).await;
    store
        .complete(&fence("done", &lease), &answer("{\"id\":1}"))
        .await
        .unwrap();
    reserved(&store, "flying", LONG, DAY).await;
    let stored = store.answer("client", "done").await.unwrap().unwrap();
    assert_eq!(stored.status, 201);
    assert_eq!(&stored.body[..], b"{\"id\":1}");
    assert_eq!(&stored.headers[..], b"content-type: application/json\r\n");
    assert_eq!(stored.sealed, None);
    assert_eq!(store.answer("client", "flying").await.unwrap(), None);
    assert_eq!(store.answer("client", "never").await.unwrap(), None);
}

/// Runs futures at once and waits for all.
async fn futures_join_all<F: std::future::Future + Send + 'static>(futures: impl Iterator<Item = F>)
where
    F::Output: Send,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// A key reserved on `route` with a 1 ms lease, left unresolved.
async fn unresolved_on<S: KeyStore>(store: &S, key: &str, route: &str) -> Lease {
    let request = ReserveRequest {
        route,
        ..req(key, &FP, TINY, DAY)
    };
    match store.reserve(&request).await.unwrap() {
        Reservation::Reserved(lease) => lease,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

fn claim_fence(claim: &Claim) -> Fence {
    Fence {
        client_id: claim.record.client_id.clone(),
        key: claim.record.key.clone(),
        token: claim.record.lease_token,
        notify: false,
        retention: DAY,
    }
}

/// The reconciler claims the unresolved keys of the routes it names, and only those: each
/// under a fresh token and a live lease, so that a second claim and a client retry see a
/// key in progress; the claim's fence completes it. The gauge counts unresolved keys per
/// route, and a claimed key is not unresolved while claimed.
async fn reconciler_claims_unresolved_keys(db: Subject) {
    let store = db.store();
    let first = unresolved_on(&store, "a", "probed").await;
    unresolved_on(&store, "b", "probed").await;
    unresolved_on(&store, "c", "other").await;
    reserved(&store, "live", LONG, DAY).await;
    let done = reserved(&store, "done", TINY, DAY).await;
    store
        .complete(&fence("done", &done), &answer("{}"))
        .await
        .unwrap();
    expire().await;
    let mut counts = store.unresolved_counts().await.unwrap();
    counts.sort();
    assert_eq!(counts, [("other".into(), 1), ("probed".into(), 2)]);

    let claims = store.claim_unresolved(&["probed"], LONG, 10).await.unwrap();
    let mut keys: Vec<&str> = claims.iter().map(|c| c.record.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["a", "b"]);
    let a = claims.iter().find(|c| c.record.key == "a").unwrap();
    assert_ne!(a.record.lease_token, first.token);
    assert_eq!(
        (a.record.state.status(), a.record.attempts),
        ("in_progress", 1)
    );
    assert!(a.record.state.lease_remaining_ms().unwrap() > 0);
    assert!(a.unresolved_since_ms <= now_ms());
    assert_eq!(
        store.unresolved_counts().await.unwrap(),
        [("other".into(), 1)]
    );
    assert!(
        store
            .claim_unresolved(&["probed", "other"], LONG, 10)
            .await
            .unwrap()
            .iter()
            .all(|c| c.record.key == "c")
    );
    assert!(matches!(
        store.reserve(&req("a", &FP, LONG, DAY)).await.unwrap(),
        Reservation::InProgress { .. }
    ));
    // The first owner is fenced off; the claim's fence is the one that holds.
    assert_eq!(
        store
            .complete(&fence("a", &first), &answer("stale"))
            .await
            .unwrap(),
        Fenced::Refused
    );
    assert_eq!(
        store
            .complete(&claim_fence(a), &answer("found"))
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert!(matches!(
        store.reserve(&req("a", &FP, LONG, DAY)).await.unwrap(),
        Reservation::Done(_)
    ));
}

/// An inconclusive probe gives the key back unresolved, as long unresolved as before, with
/// one more probe counted: the reconciler leaves it alone until its backoff has passed,
/// while a client retry may take it over at once. A stale claim cannot give it back.
async fn deferred_keys_wait_out_their_backoff(db: Subject) {
    let store = db.store();
    unresolved_on(&store, "k", "probed").await;
    expire().await;
    let claim = store
        .claim_unresolved(&["probed"], LONG, 10)
        .await
        .unwrap()
        .remove(0);
    let backoff = Duration::from_millis(400);
    assert_eq!(
        store
            .defer(
                &claim_fence(&claim),
                claim.unresolved_since_ms,
                backoff,
                "503"
            )
            .await
            .unwrap(),
        Fenced::Applied
    );
    let row = store.lookup("client", "k").await.unwrap().unwrap();
    assert_eq!(row.probes, 1);
    assert_eq!(row.probe_answer.as_deref(), Some("503"));
    assert!(row.state.lease_remaining_ms().unwrap() < 0);
    assert!(row.probe_after_ms.unwrap() > now_ms());
    assert_eq!(
        store.unresolved_counts().await.unwrap(),
        [("probed".into(), 1)]
    );
    assert!(
        store
            .claim_unresolved(&["probed"], LONG, 10)
            .await
            .unwrap()
            .is_empty()
    );
    tokio::time::sleep(backoff + Duration::from_millis(50)).await;
    let again = store
        .claim_unresolved(&["probed"], LONG, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(again.record.probes, 1);
    assert!(again.unresolved_since_ms <= claim.unresolved_since_ms + 1);
    // The earlier claim's token is stale now.
    assert_eq!(
        store
            .defer(
                &claim_fence(&claim),
                claim.unresolved_since_ms,
                backoff,
                "503"
            )
            .await
            .unwrap(),
        Fenced::Refused
    );
    store
        .defer(
            &claim_fence(&again),
            again.unresolved_since_ms,
            DAY,
            "no answer",
        )
        .await
        .unwrap();
    // Waiting out a backoff is the reconciler's business: a client retry takes over.
    let taken = reserved(&store, "k", LONG, DAY).await;
    assert!(taken.takeover);
}

/// Reconcilers claiming at once, and client retries taking over at the same moment: every
/// key goes to exactly one of them.
async fn concurrent_claims_and_takeovers_split_the_keys(db: Subject) {
    let store = db.store();
    let keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    for key in &keys {
        unresolved_on(&store, key, "probed").await;
    }
    expire().await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let store = db.store();
        tasks.spawn(async move {
            let claims = store
                .claim_unresolved(&["probed"], LONG, 100)
                .await
                .unwrap();
            claims.into_iter().map(|c| c.record.key).collect::<Vec<_>>()
        });
    }
    for key in keys.iter().step_by(2).cloned() {
        let store = db.store();
        tasks.spawn(async move {
            match store.reserve(&req(&key, &FP, LONG, DAY)).await.unwrap() {
                Reservation::Reserved(lease) => {
                    assert!(lease.takeover);
                    vec![key]
                }
                Reservation::InProgress { .. } => vec![],
                other => panic!("{other:?}"),
            }
        });
    }
    let mut owners: Vec<String> = tasks.join_all().await.into_iter().flatten().collect();
    owners.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(owners, expected, "each key exactly once");
}

/// The derived key given with a new reservation is kept with the row and handed to the
/// takeover, whatever the takeover's caller would send; a row reserved without one stays
/// plain (`None`) when taken over by a caller that would send another.
async fn derived_keys_are_kept_for_takeovers(db: Subject) {
    let store = db.store();
    for (key, first, then) in [("hashed", Some("h-1"), None), ("plain", None, Some("h-2"))] {
        let request = |lease, derived_key| ReserveRequest {
            derived_key,
            ..req(key, &FP, lease, DAY)
        };
        match store.reserve(&request(TINY, first)).await.unwrap() {
            Reservation::Reserved(lease) => assert_eq!(lease.derived_key.as_deref(), first),
            other => panic!("{other:?}"),
        }
        expire().await;
        match store.reserve(&request(LONG, then)).await.unwrap() {
            Reservation::Reserved(lease) => {
                assert!(lease.takeover);
                assert_eq!(lease.derived_key.as_deref(), first, "{key}");
            }
            other => panic!("{other:?}"),
        }
        let row = store.lookup("client", key).await.unwrap().unwrap();
        assert_eq!(row.derived_key.as_deref(), first);
    }
}

conformance!(
    derived_keys_are_kept_for_takeovers,
    reconciler_claims_unresolved_keys,
    deferred_keys_wait_out_their_backoff,
    concurrent_claims_and_takeovers_split_the_keys,
    reserve_conflict_mismatch,
    unresolved_is_reported_not_taken_over,
    complete_then_replay,
    takeover_after_expiry,
    fence_refuses_the_stale_owner,
    release_frees_and_tokens_are_never_reused,
    renewal_extends_the_lease,
    not_replayable_completion,
    sweep_respects_retention,
    concurrent_sweepers_delete_each_row_once,
    dozens_of_concurrent_reservations,
    stuck_and_evict,
    stuck_pages_list_every_key_once,
    stored_answers_are_read_for_operators,
);

/// PostgreSQL calls past `pool_size` queue for a turn before they ask the pool. The
/// `pool_waiting` gauge counts them, a queued call still gives up at the store timeout
/// (and then stops counting), and the store works again once the database does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_calls_are_counted_and_bounded_by_the_timeout() {
    let db = TestDb::new().await;
    let store = idemproxy::store::PgStore::new(&idemproxy::config::PostgresConfig {
        pool_size: 2,
        connect_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(2),
        ..db.config()
    })
    .unwrap();
    // Every reservation blocks inside PostgreSQL while this transaction holds the table.
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..6 {
        let store = store.clone();
        calls.spawn(async move {
            let key = format!("queued-{n}");
            store.reserve(&req(&key, &FP, LONG, DAY)).await
        });
    }
    // At most two are on a connection (blocked on the lock; reservations share a batch
    // when they can), the others wait for a turn or a batch.
    let queued = eventually(Duration::from_secs(30), || async {
        (store.pool_status().unwrap().waiting >= 4).then_some(())
    })
    .await;
    assert!(queued.is_some(), "{:?}", store.pool_status());
    while let Some(done) = calls.join_next().await {
        let done = done.unwrap();
        assert!(
            matches!(done, Err(idemproxy::store::StoreError::Timeout(_))),
            "every call gives up at the store timeout: {done:?}"
        );
    }
    // A batch taken just before its callers gave up still runs to its own timeout.
    let idle = eventually(Duration::from_secs(30), || async {
        (store.pool_status().unwrap().waiting == 0).then_some(())
    })
    .await;
    assert!(idle.is_some(), "{:?}", store.pool_status());
    lock.rollback().await.unwrap();
    reserved(&store, "after", LONG, DAY).await;
}

/// A statement the proxy gave up on does not go on in PostgreSQL: `statement_timeout`
/// (the store timeout) ends it on the server too, so it does not keep waiting for, or
/// holding, row locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_given_up_on_end_on_the_server() {
    let db = TestDb::new().await;
    let name = format!("stmt-timeout-{}", std::process::id());
    let store = idemproxy::store::PgStore::new(&idemproxy::config::PostgresConfig {
        url: format!("{}&application_name={name}", db.url),
        timeout: Duration::from_secs(1),
        ..db.config()
    })
    .unwrap();
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let given_up = store.reserve(&req("blocked", &FP, LONG, DAY)).await;
    assert!(
        matches!(given_up, Err(idemproxy::store::StoreError::Timeout(_))),
        "{given_up:?}"
    );
    let watcher = db.client().await;
    let waiting = || async {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'",
                &[&name],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let ended = eventually(Duration::from_secs(30), || async {
        (waiting().await == 0).then_some(())
    })
    .await;
    assert!(ended.is_some(), "the statement still runs on the server");
    lock.rollback().await.unwrap();
}
