//! The upstream refuses, hangs, says "nothing was done", or answers too much.

use crate::support;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Connection refused means nothing was sent: 502, the key is released, and once the
/// upstream is up the same key executes.
async fn refused_then_healthy(db: Backend) {
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let yaml = PAYMENTS.replace("{upstream}", &format!("http://{addr}"));
    // A placeholder upstream only for the harness's substitution; the route goes to `addr`.
    let placeholder = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&yaml, &placeholder, &db).await;
    let client = TestClient::new(&proxy);

    let refused = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(refused.status, 502);
    assert!(refused.is_problem());
    assert!(
        refused.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("upstream-unreachable")
    );
    assert_eq!(db.rows().await, 0, "released: nothing was sent");

    let upstream = Upstream::spawn_at(addr, Behavior::default()).await;
    let ok = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// An upstream that hangs past the timeout: 504, and the key stays in progress (the
/// outcome is unknown), so a retry gets 409 instead of a second execution.
async fn hanging_upstream_keeps_the_key(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  timeout: 10s\n", "  timeout: 500ms\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let timed_out = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(timed_out.status, 504);
    assert!(timed_out.is_problem());
    let retry = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(retry.status, 409);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// A payments proxy whose route says `takeover: never` (3 s lease), in front of an
/// upstream that answers only after the proxy's 500 ms timeout.
async fn hanging_upstream_never_taken_over(db: &Backend) -> (Upstream, TestProxy) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS
        .replace("  timeout: 10s\n", "  timeout: 500ms\n")
        .replace("  lease: 30s\n", "  lease: 3s\n")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    takeover: never\n",
        );
    let proxy = TestProxy::spawn(&yaml, &upstream, db).await;
    (upstream, proxy)
}

/// `takeover: never`: after a timeout and the lease, a retry of the unresolved key is
/// never a second execution — every retry gets the final `outcome-unknown` problem, the
/// key stays as it was — until an operator evicts it, and then the next retry executes.
async fn takeover_never_answers_outcome_unknown(db: Backend) {
    let (upstream, proxy) = hanging_upstream_never_taken_over(&db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "k", BODY).await.status,
        504
    );
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    for _ in 0..3 {
        let retry = client.post("/payments", "shop-1", "k", BODY).await;
        assert_eq!(retry.status, 424, "{retry:?}");
        assert!(retry.is_problem());
        assert!(
            retry.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("outcome-unknown"),
            "{retry:?}"
        );
    }
    assert_eq!(upstream.executions(), 1);
    let row = db.lookup("shop-1", "k").await.unwrap();
    assert_eq!((row.state.status(), row.attempts), ("in_progress", 1));
    upstream.set(Behavior::default());
    let evicted = TestClient::at(proxy.admin)
        .send("DELETE", "/admin/keys/shop-1/k", &[], "")
        .await;
    assert_eq!(evicted.status, 200);
    let fresh = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!((fresh.status.as_u16(), fresh.replayed()), (201, false));
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

/// An operator settles unresolved keys through the admin API: an answer is stored and
/// replayed to every retry (no second execution), a release lets the next retry execute;
/// a live lease, a completed key, an unknown key and a malformed resolution are refused,
/// each with its reason.
async fn operator_resolves_unresolved_keys(db: Backend) {
    let (upstream, proxy) = hanging_upstream_never_taken_over(&db).await;
    let client = TestClient::new(&proxy);
    let admin = TestClient::at(proxy.admin);
    let resolve = |key: &str, body: &str| {
        let (admin, path, body) = (
            admin.clone(),
            format!("/admin/keys/shop-1/{key}/resolve"),
            body.to_owned(),
        );
        async move { admin.send("POST", &path, &[], &body).await }
    };
    for key in ["answered", "released"] {
        assert_eq!(
            client.post("/payments", "shop-1", key, BODY).await.status,
            504
        );
    }
    let live = resolve("answered", r#"{"release": true}"#).await;
    assert_eq!(live.status, 409, "{live:?}");
    assert!(live.detail().contains("lease is live"), "{live:?}");
    tokio::time::sleep(Duration::from_millis(3_300)).await;

    let bad = resolve("answered", r#"{"status": 201, "release": true}"#).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.is_problem());
    let bad = resolve("answered", r#"{"status": 9000}"#).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(resolve("nobody", r#"{"release": true}"#).await.status, 404);

    let stored = resolve(
        "answered",
        r#"{"status": 201, "headers": {"content-type": "application/json"}, "body": "{\"charge\":\"found-by-hand\"}"}"#,
    )
    .await;
    assert_eq!(stored.status, 200, "{stored:?}");
    for _ in 0..2 {
        let retry = client.post("/payments", "shop-1", "answered", BODY).await;
        assert_eq!(
            (retry.status.as_u16(), retry.replayed()),
            (201, true),
            "{retry:?}"
        );
        assert_eq!(retry.body, r#"{"charge":"found-by-hand"}"#);
        assert_eq!(retry.headers["content-type"], "application/json");
    }
    let again = resolve("answered", r#"{"release": true}"#).await;
    assert_eq!(again.status, 409);
    assert!(again.detail().contains("completed"), "{again:?}");

    assert_eq!(
        resolve("released", r#"{"release": true}"#).await.status,
        200
    );
    upstream.set(Behavior::default());
    let fresh = client.post("/payments", "shop-1", "released", BODY).await;
    assert_eq!((fresh.status.as_u16(), fresh.replayed()), (201, false));
    assert_eq!(
        upstream.executions(),
        3,
        "two timed out, one after the release"
    );
    proxy.stop().await;
}

/// A status listed in `release_on` releases the key instead of storing the answer: the
/// client gets it, and the same key executes again.
async fn release_on_statuses_free_the_key(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        status: 503,
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace(
        "    require_key: true\n",
        "    require_key: true\n    release_on: [503]\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let busy = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(busy.status, 503);
    assert!(!busy.is_problem(), "the upstream's own answer");
    assert_eq!(db.rows().await, 0);
    upstream.set(Behavior::default());
    let ok = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

/// An answer over `max_stored_response` reaches the first client whole; the key is
/// completed as not replayable, so a retry gets a clear problem and nothing executes again.
async fn oversized_answers_are_not_replayable(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        pad_to: 200_000,
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace(
        "    require_key: true\n",
        "    require_key: true\n    max_stored_response: 64KiB\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let first = client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 200_000, "whole, not truncated");
    assert!(first.body.starts_with(br#"{"charge_id":1"#));

    let retry = client.post("/payments", "shop-1", "k", BODY).await;
    // A final status: retrying clients (which retry every 409) must not loop on it.
    assert_eq!(retry.status, 410);
    assert!(retry.is_problem());
    assert!(
        retry.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("not-replayable")
    );
    assert!(
        retry.headers.get("retry-after").is_none(),
        "retrying will not help"
    );
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// `on_ambiguous: store` makes a timeout the final answer: the 504 problem is stored and
/// replayed, and nothing executes again.
async fn ambiguous_store_replays_the_timeout(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(3),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS
        .replace("  timeout: 10s\n", "  timeout: 300ms\n")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    on_ambiguous: store\n",
        );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "amb", BODY).await;
    assert_eq!(first.status, 504);
    let again = client.post("/payments", "shop-1", "amb", BODY).await;
    assert_eq!(again.status, 504);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// A status listed in `ambiguous_statuses` (a gateway's 502) keeps the key in progress by
/// default: the client gets the answer, a retry gets 409, nothing executes twice at once.
async fn ambiguous_status_keeps_the_key(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        status: 502,
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace(
        "    require_key: true\n",
        "    require_key: true\n    ambiguous_statuses: [502, 504]\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "gw", BODY).await;
    assert_eq!(first.status, 502);
    assert!(!first.is_problem(), "the gateway's own answer");
    let retry = client.post("/payments", "shop-1", "gw", BODY).await;
    assert_eq!(retry.status, 409);
    assert_eq!(upstream.executions(), 1);
    assert_eq!(
        db.lookup("shop-1", "gw").await.unwrap().state.status(),
        "in_progress"
    );
    proxy.stop().await;
}

/// `on_ambiguous: release` frees the key after a timeout, so the retry executes again.
async fn ambiguous_release_frees_the_key(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS
        .replace("  timeout: 10s\n", "  timeout: 300ms\n")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    on_ambiguous: release\n",
        );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "rel", BODY).await.status,
        504
    );
    assert!(db.lookup("shop-1", "rel").await.is_none(), "released");
    upstream.set(Behavior::default());
    let retry = client.post("/payments", "shop-1", "rel", BODY).await;
    assert_eq!(retry.status, 201);
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

on_both_stores!(
    operator_resolves_unresolved_keys,
    takeover_never_answers_outcome_unknown,
    refused_then_healthy,
    hanging_upstream_keeps_the_key,
    release_on_statuses_free_the_key,
    oversized_answers_are_not_replayable,
    ambiguous_store_replays_the_timeout,
    ambiguous_status_keeps_the_key,
    ambiguous_release_frees_the_key,
);
