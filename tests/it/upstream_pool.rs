//! The upstream connection pool: connections are reused, their number stays within
//! `upstream.max_connections`, and a connection the upstream closed while idle costs no
//! request (the request goes out on a new one, and runs exactly once).

use crate::support;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Sequential requests, pass-through and keyed, share one upstream connection.
async fn connections_are_reused(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for i in 0..10 {
        let passed = client.send("POST", "/orders/1", &[], "{}").await;
        assert_eq!(passed.status, 201);
        let keyed = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(keyed.status, 201);
    }
    assert_eq!(upstream.executions(), 20);
    assert_eq!(
        upstream.connections(),
        1,
        "one keep-alive connection for all"
    );
    proxy.stop().await;
}

/// Dozens of concurrent keyed requests to a slow upstream: every one executes exactly once,
/// over no more connections than `upstream.max_connections`.
async fn connections_stay_within_the_limit(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  timeout: 10s\n", "  timeout: 10s\n  max_connections: 4\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let replies = client
        .post_each_key_at_once(40, "/payments", "shop-1", "k", BODY)
        .await;
    assert!(replies.iter().all(|r| r.status == 201), "{replies:?}");
    assert_eq!(upstream.executions(), 40);
    assert!(
        upstream.most_open_connections() <= 4,
        "{} connections open at once",
        upstream.most_open_connections()
    );
    assert!(
        upstream.connections() <= 4,
        "{} opened",
        upstream.connections()
    );
    proxy.stop().await;
}

/// The upstream closes keep-alive connections idle for 50 ms. A request after such a pause
/// must not fail on the dead connection: it goes out on a new one and executes once.
async fn idle_connections_closed_by_the_upstream_cost_nothing(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        idle_close: Some(Duration::from_millis(50)),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for i in 0..5 {
        let reply = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(reply.status, 201, "{}", reply.detail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(upstream.executions(), 5);
    assert_eq!(
        upstream.connections(),
        5,
        "each pause cost the upstream its connection"
    );
    proxy.stop().await;
}

on_both_stores!(
    connections_are_reused,
    connections_stay_within_the_limit,
    idle_connections_closed_by_the_upstream_cost_nothing,
);
