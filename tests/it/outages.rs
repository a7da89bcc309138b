//! The database goes away and comes back (through a relay the test cuts), and a worker
//! loses its lease while still alive.

use crate::support;
use idemproxy::store::KeyState;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

fn through(url: &str, yaml: &str) -> String {
    yaml.replace("{store}", &pg_store_yaml(url))
}

async fn row(db: &Backend) -> Option<(String, Option<i16>)> {
    db.client()
        .await
        .query_opt("SELECT status, response_status FROM idempotency_keys", &[])
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

/// Store down at reservation: 503 and nothing forwarded; once it is back, the same key
/// executes normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_at_reserve_then_back() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&through(&url, PAYMENTS), &upstream, &db).await;
    let client = TestClient::new(&proxy);

    relay.cut();
    let down = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(down.status, 503);
    assert!(down.is_problem());
    assert_eq!(upstream.executions(), 0, "fail closed");

    relay.restore();
    let back = eventually(Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let reply = client.post("/payments", "shop-1", "k", BODY).await;
            (reply.status != 503).then_some(reply)
        }
    })
    .await
    .unwrap();
    assert_eq!(back.status, 201);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Store down at completion: the client still gets the upstream's answer; once the store
/// is back, the background retry completes the row and a retry is replayed without
/// another execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_at_completion_then_back() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(&through(&url, PAYMENTS), &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    upstream.wait_executions(1).await;
    relay.cut();
    let reply = in_flight.await.unwrap();
    assert_eq!(
        reply.status, 201,
        "the client gets the upstream's answer although the store is down"
    );
    assert_eq!(
        row(&db).await,
        Some(("in_progress".into(), None)),
        "not yet stored"
    );

    relay.restore();
    let stored = eventually(Duration::from_secs(20), || async {
        (row(&db).await == Some(("done".into(), Some(201)))).then_some(())
    })
    .await;
    assert!(stored.is_some(), "the background retry completed the row");
    let replay = client.post("/payments", "shop-1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// The store refuses a completion for less than a lease (the worker's link to it is cut
/// and restored) while a client keeps retrying through another replica: the worker keeps
/// renewing its lease while it retries the completion, so no retry takes over, the
/// upstream executes once, and the stored answer is the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_blip_at_completion_keeps_the_lease() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(2000),
        ..Default::default()
    })
    .await;
    // Renewed every 1.67 s; the store is cut from 1.9 s to 5.4 s, before the lease granted
    // at the last renewal (1.67 s) runs out at 6.67 s. Completion retries alone, without
    // renewal, would next reach the store at 8.3 s: a retry would take over at 6.7 s.
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 5s\n");
    let worker = TestProxy::spawn(&through(&url, &yaml), &upstream, &db).await;
    let other = TestProxy::spawn(&yaml, &upstream, &db).await;

    let first = {
        let client = TestClient::new(&worker);
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    upstream.wait_executions(1).await;
    tokio::time::sleep(Duration::from_millis(1900)).await;
    relay.cut();
    let retries = {
        let client = TestClient::new(&other);
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            let end = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let reply = client.post("/payments", "shop-1", "k", BODY).await;
                statuses.push(reply.status.as_u16());
                if reply.status != 409 || tokio::time::Instant::now() > end {
                    return (reply, statuses);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let answered = first.await.unwrap();
    assert_eq!(answered.status, 201, "the first client gets its answer");
    tokio::time::sleep(Duration::from_millis(3400)).await;
    relay.restore();

    let (settled, statuses) = retries.await.unwrap();
    assert_eq!(
        upstream.executions(),
        1,
        "no takeover re-executed: {statuses:?}"
    );
    assert_eq!(settled.status, 201, "{statuses:?}");
    assert!(settled.replayed(), "the retry is a replay");
    assert_eq!(
        settled.body, answered.body,
        "the stored answer is the first one"
    );
    let record = db.lookup("shop-1", "k").await.unwrap();
    assert_eq!(record.attempts, 1, "never taken over");
    assert_eq!(record.state, KeyState::Done);
    worker.stop().await;
    other.stop().await;
}

/// A live worker whose lease ran out (its store link is cut, so it cannot renew) is taken
/// over by another replica; the takeover's answer is stored, and the first worker's late
/// completion is fenced off — its own client still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_worker_is_fenced_off() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(6000),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n");
    let stale = TestProxy::spawn(&through(&url, &yaml), &upstream, &db).await;
    let other = TestProxy::spawn(&yaml, &upstream, &db).await;

    let first = {
        let client = TestClient::new(&stale);
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    upstream.wait_executions(1).await;
    relay.cut(); // the first worker can no longer renew its lease
    upstream.set(Behavior::default());

    let client = TestClient::new(&other);
    let takeover = client
        .post_until_settled("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(takeover.status, 201);
    assert!(!takeover.replayed());
    assert_eq!(takeover.json()["charge_id"], 2);
    relay.restore();

    let late = first.await.unwrap();
    assert_eq!(
        late.status, 201,
        "the stale worker's client still gets its answer"
    );
    assert_eq!(late.json()["charge_id"], 1);
    // Let the stale completion run (and be refused) before looking at the row.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stale.stop().await; // drains the stale worker's completion and its retries
    let replay = client.post("/payments", "shop-1", "k", BODY).await;
    assert!(replay.replayed());
    assert_eq!(
        replay.json()["charge_id"],
        2,
        "the new owner's answer stands"
    );
    assert_eq!(upstream.executions(), 2);
    other.stop().await;
}
