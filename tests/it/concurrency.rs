//! Concurrent duplicates: the unique index picks one winner, everyone else is told so.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use support::*;

/// The seed's scenario: two requests with one key at the same moment. One executes, the
/// other gets 409 with Retry-After as a problem document; the upstream ran once.
async fn seed_pair_executes_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let body = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

    let (a, b) = tokio::join!(
        client.post("/payments", "shop-1", "key-1", body),
        client.post("/payments", "shop-1", "key-1", body),
    );
    let mut statuses = vec![a.status.as_u16(), b.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, vec![201, 409], "{a:?} {b:?}");
    let conflict = if a.status == 409 { &a } else { &b };
    assert!(conflict.is_problem());
    assert_eq!(conflict.headers["retry-after"], "1");
    assert_eq!(conflict.json()["status"], 409);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Fifty concurrent duplicates of each of twenty keys: exactly twenty executions, one per
/// key, and every other duplicate got either 409 or the replayed answer.
async fn fifty_duplicates_of_twenty_keys(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(&db.patient_payments(), &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let mut tasks = Vec::new();
    for _dup in 0..50 {
        for key in 0..20u32 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let body =
                    format!(r#"{{"amount":{key},"currency":"EUR","recipient":"r","purpose":"p"}}"#);
                let reply = client
                    .post("/payments", "shop-1", &format!("k-{key}"), &body)
                    .await;
                (key, reply)
            }));
        }
    }
    let mut executed: HashMap<u32, usize> = HashMap::new();
    let mut answers: HashMap<u32, Vec<bytes::Bytes>> = HashMap::new();
    for task in tasks {
        let (key, reply) = task.await.unwrap();
        match reply.status.as_u16() {
            201 if !reply.replayed() => *executed.entry(key).or_default() += 1,
            201 => {}
            409 => assert!(reply.is_problem()),
            other => panic!("unexpected status {other}: {reply:?}"),
        }
        if reply.status == 201 {
            answers.entry(key).or_default().push(reply.body);
        }
    }
    assert_eq!(upstream.executions(), 20, "exactly one execution per key");
    assert_eq!(executed.len(), 20);
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");
    for (key, bodies) in answers {
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "key {key} got different answers"
        );
    }
    proxy.stop().await;
}

/// A live worker's lease is renewed while the upstream works: a duplicate that arrives
/// after the original lease would have run out still gets 409, never a takeover.
async fn slow_upstream_keeps_its_lease(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(5000),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let body = r#"{"amount":1,"currency":"RUB","recipient":"r","purpose":"p"}"#;
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "slow", body).await })
    };
    upstream.wait_executions(1).await;
    tokio::time::sleep(Duration::from_millis(4000)).await; // past the 3 s lease
    let dup = client.post("/payments", "shop-1", "slow", body).await;
    assert_eq!(
        dup.status, 409,
        "the lease was renewed, so no takeover: {dup:?}"
    );
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

on_every_store!(
    seed_pair_executes_once,
    fifty_duplicates_of_twenty_keys,
    slow_upstream_keeps_its_lease
);

/// A burst of 200 concurrent keyed requests on the embedded store: each executes exactly
/// once, and the store's single connection is queued for as futures, not by a blocked
/// thread per request (the blocking pool would otherwise grow to ~200 threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_burst_does_not_hold_a_thread_per_request() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    const BODY: &str = r#"{"amount":1,"currency":"RUB","recipient":"r","purpose":"p"}"#;
    let replies = client
        .post_each_key_at_once(200, "/payments", "shop-1", "b", BODY)
        .await;
    assert!(replies.iter().all(|r| r.status == 201), "{replies:?}");
    assert_eq!(upstream.executions(), 200);
    // Idle blocking-pool threads linger for 10 s, so the count still shows the burst.
    let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
    assert!(threads < 60, "{threads} threads after the burst");
    proxy.stop().await;
}
