//! Completed keys replay their first answer; fingerprints decide what counts as "the same".

use crate::support;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// A retry after completion gets the same status and body, marked as a replay, and only
/// allow-listed headers; the upstream is not called again.
async fn retry_after_completion_replays(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let first = client.post("/payments", "shop-1", "k1", BODY).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(
        first.headers["set-cookie"], "session=secret",
        "the first client gets the whole answer"
    );

    let again = client.post("/payments", "shop-1", "k1", BODY).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["content-type"], "application/json");
    assert_eq!(again.headers["location"], "/payments/1");
    assert!(
        again.headers.get("set-cookie").is_none(),
        "Set-Cookie is never replayed unless configured"
    );
    assert!(again.headers.get("x-upstream-only").is_none());
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// The seed's checks: another amount with the same key is 422; the same key and body from
/// another client is its own operation and executes.
async fn other_amount_is_rejected_other_client_executes(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    assert_eq!(
        client
            .post("/payments", "shop-1", "order-1", BODY)
            .await
            .status,
        201
    );
    let other = client
        .post(
            "/payments",
            "shop-1",
            "order-1",
            &BODY.replace("100", "500"),
        )
        .await;
    assert_eq!(other.status, 422);
    assert!(other.is_problem());
    assert_eq!(other.json()["status"], 422);
    assert_eq!(upstream.executions(), 1);

    let shop2 = client.post("/payments", "shop-2", "order-1", BODY).await;
    assert_eq!(shop2.status, 201);
    assert!(!shop2.replayed());
    assert_eq!(upstream.executions(), 2);
    let seen = upstream.seen();
    assert_eq!(seen[0].headers["idempotency-key"], "shop-1:order-1");
    assert_eq!(seen[1].headers["idempotency-key"], "shop-2:order-1");
    proxy.stop().await;
}

/// The same JSON with keys reordered, other whitespace and a number spelled differently is
/// replayed; so is a body whose only change is outside the route's fingerprint fields.
async fn canonical_json_and_fields_replay(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let first = client
        .post(
            "/payments",
            "shop-1",
            "k",
            r#"{"amount":100,"currency":"RUB","recipient":"r","purpose":"p","sent_at":1}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    let reordered = client
        .post(
            "/payments",
            "shop-1",
            "k",
            "{\n  \"purpose\" : \"p\", \"recipient\":\"r\",\n  \"currency\":\"RUB\", \"amount\": 1.0e2, \"sent_at\": 2, \"attempt\": 2 }",
        )
        .await;
    assert_eq!(reordered.status, 201, "{reordered:?}");
    assert!(reordered.replayed());
    assert_eq!(reordered.body, first.body);
    assert_eq!(upstream.executions(), 1);

    // A whole-body route: reordering replays, a changed field is a different request.
    let a = client
        .post("/orders/1", "shop-1", "o", r#"{"a":1,"b":[1,2]}"#)
        .await;
    let b = client
        .post("/orders/1", "shop-1", "o", r#"{ "b":[1,2.0], "a":1 }"#)
        .await;
    assert_eq!((a.status.as_u16(), b.replayed()), (201, true));
    let c = client
        .post("/orders/1", "shop-1", "o", r#"{"a":1,"b":[1,2],"c":0}"#)
        .await;
    assert_eq!(c.status, 422);
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

/// An upstream 500 is an answer like any other: stored, replayed, not re-executed.
async fn upstream_errors_are_stored(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        status: 500,
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let first = client.post("/payments", "shop-1", "k500", BODY).await;
    assert_eq!(first.status, 500);
    assert!(
        !first.is_problem(),
        "the upstream's own error, not the proxy's"
    );
    upstream.set(Behavior::default());
    let again = client.post("/payments", "shop-1", "k500", BODY).await;
    assert_eq!(again.status, 500);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Requests that are not protected (no route, other method, no key on an optional route)
/// pass through untouched and reserve nothing; hop-by-hop headers are dropped and
/// X-Forwarded-* set on the way.
async fn unprotected_requests_pass_through(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let get = client
        .send(
            "GET",
            "/payments?x=1",
            &[
                ("x-custom", "kept"),
                ("connection", "x-drop"),
                ("x-drop", "1"),
            ],
            "",
        )
        .await;
    assert_eq!(get.status, 201);
    let no_key = client
        .send(
            "POST",
            "/orders/7",
            &[("content-type", "text/plain")],
            "plain body",
        )
        .await;
    assert_eq!(no_key.status, 201);
    let other = client
        .send("POST", "/elsewhere", &[("idempotency-key", "k")], "x")
        .await;
    assert_eq!(other.status, 201);
    let again = client
        .send("POST", "/elsewhere", &[("idempotency-key", "k")], "x")
        .await;
    assert!(!again.replayed());
    assert_eq!(upstream.executions(), 4);
    assert_eq!(
        db.rows().await,
        0,
        "nothing reserved for unprotected requests"
    );

    let seen = upstream.seen();
    assert_eq!(seen[0].path, "/payments?x=1");
    assert_eq!(seen[0].headers["x-custom"], "kept");
    assert!(seen[0].headers.get("x-drop").is_none());
    assert_eq!(seen[0].headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen[0].headers["x-forwarded-proto"], "http");
    assert_eq!(seen[1].body, "plain body");
    assert_eq!(
        seen[2].headers["idempotency-key"], "k",
        "pass-through leaves the key alone"
    );
    proxy.stop().await;
}

/// A route with a configured upstream key header sends the derived key there and not the
/// client's raw key.
async fn derived_key_goes_to_the_configured_header(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = PAYMENTS.replace(
        "  lease: 30s\n",
        "  lease: 30s\n  upstream_key_header: X-Provider-Key\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let reply = client.post("/payments", "a:b", "k", BODY).await;
    assert_eq!(reply.status, 201);
    let seen = upstream.seen();
    assert_eq!(seen[0].headers["x-provider-key"], "a%3Ab:k");
    assert!(seen[0].headers.get("idempotency-key").is_none());
    let _ = Duration::ZERO;
    proxy.stop().await;
}

/// Headers a route lists in `store_headers` are stored and replayed — `Set-Cookie` too,
/// once it is listed.
async fn configured_headers_are_replayed(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = PAYMENTS.replace(
        "    require_key: true\n",
        "    require_key: true\n    store_headers: [Set-Cookie, X-Upstream-Only]\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "h", BODY).await.status,
        201
    );
    let again = client.post("/payments", "shop-1", "h", BODY).await;
    assert!(again.replayed());
    assert_eq!(again.headers["set-cookie"], "session=secret");
    assert_eq!(again.headers["x-upstream-only"], "1");
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// With no `routes:` at all, every POST and PATCH carrying a key is protected (the whole
/// body fingerprinted), and other methods pass through.
async fn implicit_routes_protect_post_and_patch(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = "upstream:\n  url: {upstream}\n{store}";
    let proxy = TestProxy::spawn(yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for method in ["POST", "PATCH"] {
        let headers = [
            ("idempotency-key", method),
            ("content-type", "application/json"),
        ];
        let first = client
            .send(method, "/anything/at/all", &headers, r#"{"a":1}"#)
            .await;
        let again = client
            .send(method, "/anything/at/all", &headers, r#"{ "a" : 1.0 }"#)
            .await;
        assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
        assert!(again.replayed(), "{method} is protected");
    }
    let put = [("idempotency-key", "PUT")];
    client.send("PUT", "/anything", &put, "x").await;
    assert!(
        !client.send("PUT", "/anything", &put, "x").await.replayed(),
        "PUT passes through"
    );
    assert_eq!(upstream.executions(), 4);
    proxy.stop().await;
}

on_both_stores!(
    retry_after_completion_replays,
    other_amount_is_rejected_other_client_executes,
    canonical_json_and_fields_replay,
    upstream_errors_are_stored,
    unprotected_requests_pass_through,
    derived_key_goes_to_the_configured_header,
    configured_headers_are_replayed,
    implicit_routes_protect_post_and_patch,
);
