//! Group commit on both stores: writes sharing a batch each keep their own outcome —
//! duplicates of one key, a takeover beside the stale owner's completion, a member whose
//! statement fails — and concurrent requests batched by the queue still reserve each key
//! exactly once.

use crate::support;

use std::time::Duration;

use idemproxy::store::{
    Completion, Fence, Fenced, Health, Inspect, KeyStore, Lease, Reservation, Reserve, StoreError,
    StoredResponse, Write, WriteBatch, Written, key_id,
};
use support::*;

const FP: [u8; 32] = [7; 32];
const LONG: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn reserve(key: &str, fingerprint: [u8; 32], lease: Duration) -> Write {
    Write::Reserve(Reserve {
        client_id: "client".into(),
        key: key.into(),
        fingerprint,
        route: "route".into(),
        lease,
        retention: DAY,
        takeover: true,
        derived_key: None,
    })
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
        "content-type: text/plain\r\n".into(),
        body.to_owned().into(),
    ))
}

fn lease_of(written: &Result<Written, StoreError>) -> Lease {
    match written {
        Ok(Written::Reservation(Reservation::Reserved(lease), _)) => lease.clone(),
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// Runs `sql` on the backend's own table: PostgreSQL's or SQLite's spelling.
async fn execute(db: &Backend, postgres: &str, sqlite: &str) {
    match db {
        Backend::Postgres(pg) => pg.client().await.batch_execute(postgres).await.unwrap(),
        Backend::Embedded(path) => rusqlite::Connection::open(path)
            .unwrap()
            .execute_batch(sqlite)
            .unwrap(),
    }
}

/// Three writes of one key in one batch: the first reserves it, a duplicate is told it is
/// in progress, a different request under the key is a mismatch; one row.
async fn duplicates_of_one_key_in_one_batch(db: Backend) {
    let store = db.store();
    let answers = store
        .write_batch(vec![
            reserve("dup", FP, LONG),
            reserve("dup", FP, LONG),
            reserve("dup", [8; 32], LONG),
            reserve("other", FP, LONG),
        ])
        .await;
    assert_eq!(answers.len(), 4);
    let first = lease_of(&answers[0]);
    assert_eq!((first.attempts, first.takeover), (1, false));
    assert!(
        matches!(
            answers[1],
            Ok(Written::Reservation(Reservation::InProgress { .. }, _))
        ),
        "{:?}",
        answers[1]
    );
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &Written::Reservation(Reservation::Mismatch, None)
    );
    let other = lease_of(&answers[3]);
    assert_ne!(first.token, other.token);
    assert_eq!(db.rows().await, 2);
}

/// A takeover and the stale owner's completion in one batch, in both orders: one wins and
/// the other sees it — never both. On SQLite whichever comes first wins; PostgreSQL's
/// set-based batch (migration 0009) applies a batch's completions before its reservations,
/// so there the completion wins in either order: the answer the upstream gave is kept
/// instead of the request executing a second time.
async fn takeover_and_completion_in_one_batch(db: Backend) {
    let completions_first = matches!(db, Backend::Postgres(_));
    let store = db.store();
    for (key, takeover_first) in [("takeover-first", true), ("completion-first", false)] {
        let stale = lease_of(
            &store
                .write_batch(vec![reserve(key, FP, Duration::from_millis(1))])
                .await[0],
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        let completion = Write::Complete(fence(key, &stale), answer(key));
        let writes = if takeover_first {
            vec![reserve(key, FP, LONG), completion]
        } else {
            vec![completion, reserve(key, FP, LONG)]
        };
        let answers = store.write_batch(writes).await;
        if completions_first {
            let (completed, reserved) = if takeover_first { (1, 0) } else { (0, 1) };
            assert_eq!(
                answers[completed].as_ref().unwrap(),
                &Written::Fenced(Fenced::Applied)
            );
            match answers[reserved].as_ref().unwrap() {
                Written::Reservation(Reservation::Done(r), _) => assert_eq!(r.body, key.as_bytes()),
                other => panic!("expected the completed answer, got {other:?}"),
            }
        } else if takeover_first {
            let taken = lease_of(&answers[0]);
            assert_eq!((taken.attempts, taken.takeover), (2, true));
            assert_ne!(taken.token, stale.token);
            assert_eq!(
                answers[1].as_ref().unwrap(),
                &Written::Fenced(Fenced::Refused)
            );
            let row = store.lookup("client", key).await.unwrap().unwrap();
            assert_eq!(
                (row.state.status(), row.lease_token),
                ("in_progress", taken.token)
            );
        } else {
            assert_eq!(
                answers[0].as_ref().unwrap(),
                &Written::Fenced(Fenced::Applied)
            );
            match answers[1].as_ref().unwrap() {
                Written::Reservation(Reservation::Done(r), _) => assert_eq!(r.body, key.as_bytes()),
                other => panic!("expected the completed answer, got {other:?}"),
            }
        }
    }
}

/// A member whose statement fails (a trigger refuses its row) fails alone: the members
/// before and after it are written, and a member whose stored row cannot be read fails
/// alone too.
async fn a_failing_member_fails_alone(db: Backend) {
    let store = db.store();
    execute(
        &db,
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN RAISE EXCEPTION 'poisoned key'; END $$; \
         CREATE TRIGGER refuse_poison BEFORE INSERT ON idempotency_keys \
           FOR EACH ROW WHEN (NEW.key = 'poison') EXECUTE FUNCTION refuse_poison();",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON idempotency_keys \
           WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned key'); END;",
    )
    .await;
    let answers = store
        .write_batch(vec![
            reserve("before", FP, LONG),
            reserve("poison", FP, LONG),
            reserve("zafter", FP, LONG),
        ])
        .await;
    lease_of(&answers[0]);
    let refused = answers[1].as_ref().unwrap_err().to_string();
    assert!(refused.contains("poisoned key"), "{refused}");
    lease_of(&answers[2]);
    assert_eq!(db.rows().await, 2);

    // A stored status no HTTP answer has: reading it back fails, for that key only.
    let before = lease_of(&answers[0]);
    let done = store
        .write_batch(vec![Write::Complete(
            fence("before", &before),
            answer("ok"),
        )])
        .await;
    assert_eq!(done[0].as_ref().unwrap(), &Written::Fenced(Fenced::Applied));
    execute(
        &db,
        "UPDATE idempotency_keys SET response_status = -1 WHERE key = 'before'",
        "UPDATE idempotency_keys SET response_status = 70000 WHERE key = 'before'",
    )
    .await;
    let answers = store
        .write_batch(vec![
            reserve("before", FP, LONG),
            reserve("fresh", FP, LONG),
        ])
        .await;
    assert!(
        matches!(answers[0], Err(StoreError::Corrupt(_))),
        "{:?}",
        answers[0]
    );
    let fresh = lease_of(&answers[1]);

    // The batches a failing member sent down the slower path still moved the token
    // counter on: the next reservation's token was never handed out before.
    let later = lease_of(&store.write_batch(vec![reserve("later", FP, LONG)]).await[0]);
    assert!(later.token > fresh.token, "{later:?} after {fresh:?}");
}

/// Hundreds of requests at once through the queue (so batches form): every key is
/// reserved exactly once, every completion applies, and every later reservation replays
/// its own key's answer.
async fn concurrent_writes_through_the_queue(db: Backend) {
    let store = db.store();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..300 {
        let store = store.clone();
        tasks.spawn(async move {
            let key = format!("key-{}", n % 100);
            let reservation = store
                .reserve(&idemproxy::store::ReserveRequest {
                    client_id: "client",
                    key: &key,
                    fingerprint: &FP,
                    route: "route",
                    lease: LONG,
                    retention: DAY,
                    takeover: true,
                    derived_key: None,
                })
                .await
                .unwrap();
            if let Reservation::Reserved(lease) = reservation {
                let applied = store
                    .complete(&fence(&key, &lease), &answer(&key))
                    .await
                    .unwrap();
                assert_eq!(applied, Fenced::Applied);
                1
            } else {
                assert!(
                    matches!(
                        reservation,
                        Reservation::InProgress { .. } | Reservation::Done(_)
                    ),
                    "{reservation:?}"
                );
                0
            }
        });
    }
    let mut winners = 0;
    while let Some(won) = tasks.join_next().await {
        winners += won.unwrap();
    }
    assert_eq!(winners, 100, "each key reserved exactly once");
    for n in 0..100 {
        let key = format!("key-{n}");
        match store
            .write_batch(vec![reserve(&key, FP, LONG), reserve("key-0", FP, LONG)])
            .await
            .remove(0)
            .unwrap()
        {
            Written::Reservation(Reservation::Done(r), _) => assert_eq!(r.body, key.as_bytes()),
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// A completion and a release that share a batch wake the duplicates waiting on their
/// keys (`on_conflict: wait`): on PostgreSQL through the batch's own `NOTIFY`.
async fn a_batch_wakes_the_waiters_of_its_keys(db: Backend) {
    let store = db.store();
    let done = lease_of(&store.write_batch(vec![reserve("done", FP, LONG)]).await[0]);
    let freed = lease_of(&store.write_batch(vec![reserve("freed", FP, LONG)]).await[0]);
    let subscriptions = ["done", "freed"].map(|k| store.subscribe(key_id("client", k)));
    // Let PostgreSQL's notification connection come up (and its wake-up on connecting pass).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut woken: Vec<_> = subscriptions
        .iter()
        .map(|n| Box::pin(n.notified()))
        .collect();
    for w in &mut woken {
        w.as_mut().enable();
    }
    let waking = |key: &str, lease: &Lease| Fence {
        notify: true,
        ..fence(key, lease)
    };
    let answers = store
        .write_batch(vec![
            Write::Complete(waking("done", &done), answer("x")),
            Write::Release(waking("freed", &freed)),
        ])
        .await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Written::Fenced(Fenced::Applied)))),
        "{answers:?}"
    );
    for (key, w) in ["done", "freed"].iter().zip(woken) {
        assert!(
            tokio::time::timeout(Duration::from_secs(3), w)
                .await
                .is_ok(),
            "the waiters of {key} were not woken"
        );
    }
}

on_both_stores!(
    a_batch_wakes_the_waiters_of_its_keys,
    duplicates_of_one_key_in_one_batch,
    takeover_and_completion_in_one_batch,
    a_failing_member_fails_alone,
    concurrent_writes_through_the_queue,
);
// On a distributed table each write of a batch is a statement of its own, alone by
// construction; and a distributed table takes no trigger, which is how
// `a_failing_member_fails_alone` makes one write fail.
on_citus!(
    a_batch_wakes_the_waiters_of_its_keys,
    duplicates_of_one_key_in_one_batch,
    takeover_and_completion_in_one_batch,
    concurrent_writes_through_the_queue,
);

/// A lone write runs in its caller's task; when that caller goes away mid-write (its client
/// disconnected), the writes that queued behind it are still sent and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_behind_an_abandoned_lone_write_are_answered() {
    let db = TestDb::new().await;
    let store = idemproxy::store::PgStore::new(&idemproxy::config::PostgresConfig {
        pool_size: 2,
        timeout: Duration::from_secs(5),
        ..db.config()
    })
    .unwrap();
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let request = |key: &'static str| {
        let store = store.clone();
        async move {
            store
                .reserve(&idemproxy::store::ReserveRequest {
                    client_id: "client",
                    key,
                    fingerprint: &FP,
                    route: "route",
                    lease: LONG,
                    retention: DAY,
                    takeover: true,
                    derived_key: None,
                })
                .await
        }
    };
    let abandoned = tokio::spawn(request("abandoned"));
    // The lone write holds the one batch place (pool 2: one batch at a time), blocked.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued: Vec<_> = ["q1", "q2", "q3"]
        .into_iter()
        .map(|k| tokio::spawn(request(k)))
        .collect();
    let waiting = eventually(Duration::from_secs(30), || async {
        (Health::pool_status(&store).unwrap().waiting == 3).then_some(())
    })
    .await;
    assert!(waiting.is_some(), "the three did not queue");
    abandoned.abort();
    let _ = abandoned.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.rollback().await.unwrap();
    for q in queued {
        assert!(
            matches!(q.await.unwrap(), Ok(Reservation::Reserved(_))),
            "a queued write was left without an answer"
        );
    }
}

/// On PostgreSQL, batches run on the store's own thread, on connections of their own (so
/// that the next batch goes out as soon as the last one is answered), while calls from a
/// request's task keep to the others; both lanes together keep to `pool_size`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_batches_run_on_a_thread_and_connections_of_their_own() {
    let db = TestDb::new().await;
    let store = db.store();
    assert_eq!(store.max_connections(), TEST_POOL_SIZE);
    assert_eq!(store.pool().status().max_size, TEST_POOL_SIZE - 1);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let store = store.clone();
        tasks.spawn(async move {
            let key = format!("lane-{n}");
            let request = idemproxy::store::ReserveRequest {
                client_id: "client",
                key: &key,
                fingerprint: &FP,
                route: "route",
                lease: LONG,
                retention: DAY,
                takeover: true,
                derived_key: None,
            };
            matches!(store.reserve(&request).await, Ok(Reservation::Reserved(_)))
        });
    }
    while let Some(reserved) = tasks.join_next().await {
        assert!(reserved.unwrap(), "every new key is reserved");
    }
    let status = store.pool_status().unwrap();
    assert!(status.batches > 0, "the writes were batched");
    assert!(status.size <= TEST_POOL_SIZE, "{} connections", status.size);
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect();
    assert!(
        threads.iter().any(|name| name == "idemproxy-store"),
        "no store thread among {threads:?}"
    );
    assert!(
        store.pool().status().size < status.size,
        "the batches used connections of their own"
    );
}
