//! Several idemproxy replicas on one PostgreSQL behave as one.

use crate::support;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Fifty concurrent duplicates of each of twenty keys, sent round-robin across three
/// replicas: twenty executions, one per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_across_replicas_execute_once() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let config = db.patient_payments();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(TestProxy::spawn(&config, &upstream, &db).await);
    }
    let clients: Vec<TestClient> = replicas.iter().map(TestClient::new).collect();
    let mut tasks = Vec::new();
    let mut n = 0usize;
    for _ in 0..50 {
        for key in 0..20 {
            let client = clients[n % clients.len()].clone();
            n += 1;
            tasks.push(tokio::spawn(async move {
                let reply = client
                    .post("/payments", "shop-1", &format!("r-{key}"), BODY)
                    .await;
                (key, reply)
            }));
        }
    }
    let mut executed = std::collections::HashMap::new();
    for t in tasks {
        let (key, reply) = t.await.unwrap();
        assert!(matches!(reply.status.as_u16(), 201 | 409), "{reply:?}");
        if reply.status == 201 && !reply.replayed() {
            *executed.entry(key).or_insert(0) += 1;
        }
    }
    assert_eq!(upstream.executions(), 20);
    assert_eq!(executed.len(), 20);
    assert!(executed.values().all(|n| *n == 1));
    for r in replicas {
        r.stop().await;
    }
}

/// A replica SIGKILLed with requests in flight: the other replicas take its keys over once
/// the lease runs out and finish each exactly once (the provider sees the same derived key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_is_covered_by_the_others() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(1500),
        dedupe: true,
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n");
    let mut doomed = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let others = [
        ProxyProcess::spawn(&yaml, &upstream, &db).await,
        ProxyProcess::spawn(&yaml, &upstream, &db).await,
    ];
    let keys: Vec<String> = (0..5).map(|i| format!("kill-{i}")).collect();
    for key in &keys {
        let client = client_for(doomed.addr);
        let key = key.clone();
        tokio::spawn(async move {
            let _ = client
                .try_send(
                    "POST",
                    "/payments",
                    &[
                        ("content-type", "application/json"),
                        ("idempotency-key", &key),
                        ("x-client-id", "shop-1"),
                    ],
                    BODY,
                )
                .await;
        });
    }
    upstream.wait_executions(5).await;
    doomed.kill().await;

    for (i, key) in keys.iter().enumerate() {
        let client = client_for(others[i % 2].addr);
        let reply = eventually(Duration::from_secs(20), || {
            let client = client.clone();
            let key = key.clone();
            async move {
                let reply = client.post("/payments", "shop-1", &key, BODY).await;
                (reply.status != 409).then_some(reply)
            }
        })
        .await
        .unwrap();
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    assert_eq!(upstream.charges(), 5, "each payment charged once");
    assert_eq!(
        upstream.executions(),
        10,
        "each re-executed once, with the same derived key"
    );
    // Every replica now replays the same answers.
    for key in &keys {
        let a = client_for(others[0].addr)
            .post("/payments", "shop-1", key, BODY)
            .await;
        let b = client_for(others[1].addr)
            .post("/payments", "shop-1", key, BODY)
            .await;
        assert!(a.replayed() && b.replayed());
        assert_eq!(a.body, b.body);
    }
}
