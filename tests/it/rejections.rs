//! Requests rejected before forwarding get a clear problem and reserve nothing, so the
//! client can fix them and retry with the same key.

use crate::support;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Invalid JSON is 400 and reserves nothing; the corrected request with the same key then
/// executes.
async fn invalid_json_then_valid(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let bad = client
        .post("/payments", "shop-1", "k", r#"{"amount":100,"#)
        .await;
    assert_eq!(bad.status, 400);
    assert!(bad.is_problem());
    assert!(bad.detail().contains("not valid JSON"), "{bad:?}");
    assert_eq!(db.rows().await, 0);
    assert_eq!(upstream.executions(), 0);

    // A member named twice could be read two ways; it is refused, not fingerprinted.
    let twice = client
        .post(
            "/payments",
            "shop-1",
            "k",
            r#"{"amount":100,"amount":500,"currency":"RUB","recipient":"r","purpose":"p"}"#,
        )
        .await;
    assert_eq!(twice.status, 400);
    assert!(twice.detail().contains("appears twice"), "{twice:?}");
    assert_eq!(db.rows().await, 0);

    let good = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(good.status, 201);
    assert!(!good.replayed());
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Missing, over-long and repeated keys, a missing client id and an oversized body are
/// each answered with a problem document of the right status; none reserves anything.
async fn bad_requests_reserve_nothing(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let json = ("content-type", "application/json");
    let shop = ("x-client-id", "shop-1");

    let missing = client.send("POST", "/payments", &[json, shop], BODY).await;
    assert_eq!(missing.status, 400);
    assert!(missing.detail().contains("idempotency-key"), "{missing:?}");

    let long = "k".repeat(300);
    let too_long = client
        .send(
            "POST",
            "/payments",
            &[json, shop, ("idempotency-key", &long)],
            BODY,
        )
        .await;
    assert_eq!(too_long.status, 400);
    assert!(too_long.detail().contains("255"));

    let twice = client
        .send(
            "POST",
            "/payments",
            &[
                json,
                shop,
                ("idempotency-key", "a"),
                ("idempotency-key", "b"),
            ],
            BODY,
        )
        .await;
    assert_eq!(twice.status, 400);
    assert!(twice.detail().contains("more than once"));

    let empty = client
        .send(
            "POST",
            "/payments",
            &[json, shop, ("idempotency-key", "\"\"")],
            BODY,
        )
        .await;
    assert_eq!(empty.status, 400);

    let anonymous = client
        .send("POST", "/payments", &[json, ("idempotency-key", "k")], BODY)
        .await;
    assert_eq!(anonymous.status, 400);
    assert!(anonymous.detail().contains("x-client-id"), "{anonymous:?}");

    // /orders/* allows 1 KiB.
    let big = "x".repeat(2048);
    let too_big = client
        .send(
            "POST",
            "/orders/1",
            &[
                ("content-type", "text/plain"),
                shop,
                ("idempotency-key", "k"),
            ],
            &big,
        )
        .await;
    assert_eq!(too_big.status, 413);
    assert!(too_big.is_problem());

    for reply in [&missing, &too_long, &twice, &empty, &anonymous, &too_big] {
        assert!(reply.is_problem(), "{reply:?}");
        assert_eq!(reply.json()["status"], reply.status.as_u16());
        assert!(!reply.json()["type"].as_str().unwrap().is_empty());
        assert!(!reply.json()["title"].as_str().unwrap().is_empty());
    }
    assert_eq!(db.rows().await, 0, "no rejected request reserved a key");
    assert_eq!(upstream.executions(), 0);

    // The same key, fixed, goes through.
    let fixed = client
        .send(
            "POST",
            "/orders/1",
            &[
                ("content-type", "text/plain"),
                shop,
                ("idempotency-key", "k"),
            ],
            "small",
        )
        .await;
    assert_eq!(fixed.status, 201);
    proxy.stop().await;
}

/// The store being unreachable at reserve fails closed: 503, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_at_reserve_fails_closed() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    // A port nothing listens on stands in for a database that is down.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let yaml = PAYMENTS.replace(
        "{store}",
        &pg_store_yaml(&format!("postgres://postgres@127.0.0.1:{port}/none")),
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let reply = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(reply.status, 503);
    assert!(reply.is_problem());
    assert_eq!(upstream.executions(), 0, "fail closed: never forwarded");
    proxy.stop().await;
}

on_both_stores!(invalid_json_then_valid, bad_requests_reserve_nothing);
