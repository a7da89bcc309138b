//! Keys and fingerprints the way existing clients and providers spell them: several key
//! headers per route, fingerprints over selected headers or none at all, keys scoped per
//! route, and every protected answer marked — on both stores, counting executions.

#![allow(clippy::unwrap_used)]

mod support;

use support::*;

const BODY: &str = PAYMENT_BODY;

const FORMS: &str = r#"
upstream:
  url: {upstream}
  timeout: 10s
{store}
client_id:
  header: X-Client-Id
defaults:
  lease: 30s
routes:
  - name: aliases
    methods: [POST]
    path: /aliases
    require_key: true
    key_headers: [Idempotency-Key, X-Idempotency-Key, PayPal-Request-Id]
  - name: versioned
    methods: [POST]
    path: /versioned
    fingerprint:
      headers: [Stripe-Version]
  - name: keyed-only
    methods: [POST]
    path: /keyed-only
    fingerprint: none
  - name: refunds
    methods: [POST]
    path: /refunds
    key_scope: client_and_route
  - name: captures
    methods: [POST]
    path: /captures
    key_scope: client_and_route
  - name: quiet
    methods: [POST]
    path: /quiet
    replayed_header: X-Replayed
    echo_key_header: none
"#;

async fn send(client: &TestClient, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut all = vec![
        ("content-type", "application/json"),
        ("x-client-id", "shop-1"),
    ];
    all.extend_from_slice(headers);
    client.send("POST", path, &all, body).await
}

fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a str> {
    reply.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The first key header present is the key, under any of its names: the same key sent
/// under another listed name is the same operation. Two names carrying different keys
/// are refused, naming the header, and nothing is reserved. The provider sees only the
/// derived key, under the upstream key header.
async fn key_header_aliases(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = send(&client, "/aliases", &[("x-idempotency-key", "a-1")], BODY).await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    let again = send(&client, "/aliases", &[("paypal-request-id", "a-1")], BODY).await;
    assert!(again.replayed(), "{again:?}");
    let both = send(
        &client,
        "/aliases",
        &[("idempotency-key", "a-1"), ("x-idempotency-key", "a-1")],
        BODY,
    )
    .await;
    assert!(both.replayed(), "the same key twice is fine: {both:?}");
    assert_eq!(upstream.executions(), 1);
    let seen = &upstream.seen()[0];
    assert_eq!(seen.headers.get("idempotency-key").unwrap(), "shop-1:a-1");
    assert!(seen.headers.get("x-idempotency-key").is_none());
    let rows = db.rows().await;
    let conflict = send(
        &client,
        "/aliases",
        &[("idempotency-key", "a-2"), ("paypal-request-id", "a-3")],
        BODY,
    )
    .await;
    assert_eq!(conflict.status, 400, "{conflict:?}");
    assert!(
        conflict.detail().contains("paypal-request-id"),
        "{conflict:?}"
    );
    assert_eq!(db.rows().await, rows, "nothing reserved");
    let missing = send(&client, "/aliases", &[], BODY).await;
    assert_eq!(missing.status, 400);
    assert!(
        missing.detail().contains("x-idempotency-key"),
        "every accepted name is listed: {missing:?}"
    );
    proxy.stop().await;
}

/// `fingerprint.headers`: an API version header changes the operation (`422` under the
/// same key), other headers do not.
async fn selected_headers_are_fingerprinted(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let v1 = [("idempotency-key", "v"), ("stripe-version", "2024-06-20")];
    assert_eq!(send(&client, "/versioned", &v1, BODY).await.status, 201);
    let traced = [
        ("idempotency-key", "v"),
        ("stripe-version", "2024-06-20"),
        ("x-trace", "abc"),
    ];
    assert!(send(&client, "/versioned", &traced, BODY).await.replayed());
    let v2 = [("idempotency-key", "v"), ("stripe-version", "2025-01-01")];
    assert_eq!(send(&client, "/versioned", &v2, BODY).await.status, 422);
    let none = [("idempotency-key", "v")];
    assert_eq!(send(&client, "/versioned", &none, BODY).await.status, 422);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// `fingerprint: none`: the key alone is the operation; another body under it replays.
async fn no_fingerprint_replays_any_body(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let key = [("idempotency-key", "n")];
    assert_eq!(send(&client, "/keyed-only", &key, BODY).await.status, 201);
    let other = send(&client, "/keyed-only", &key, r#"{"amount":5}"#).await;
    assert!(other.replayed(), "{other:?}");
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// `key_scope: client_and_route`: one key on two routes is two operations, each with its
/// own derived key at the provider; each replays on its own route.
async fn keys_scoped_per_route(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let key = [("idempotency-key", "order-7")];
    assert_eq!(send(&client, "/refunds", &key, BODY).await.status, 201);
    assert_eq!(send(&client, "/captures", &key, BODY).await.status, 201);
    assert!(send(&client, "/refunds", &key, BODY).await.replayed());
    assert!(send(&client, "/captures", &key, BODY).await.replayed());
    assert_eq!(upstream.executions(), 2);
    let derived: Vec<String> = upstream
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        derived,
        ["shop-1:refunds:order-7", "shop-1:captures:order-7"]
    );
    proxy.stop().await;
}

/// Every protected answer says whether it is a replay and echoes the key as sent —
/// first answers, replays and the proxy's own problems alike; pass-through answers carry
/// neither. Both names are configurable, and the echo can be turned off.
async fn protected_answers_are_marked(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let key = [("x-idempotency-key", "\"m-1\"")];
    let first = send(&client, "/aliases", &key, BODY).await;
    assert_eq!(header(&first, "idempotent-replayed"), Some("false"));
    assert_eq!(header(&first, "x-idempotency-key"), Some("\"m-1\""));
    let replay = send(&client, "/aliases", &key, BODY).await;
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&replay, "x-idempotency-key"), Some("\"m-1\""));
    let mismatch = send(&client, "/aliases", &key, r#"{"amount":1}"#).await;
    assert_eq!(mismatch.status, 422);
    assert_eq!(header(&mismatch, "idempotent-replayed"), Some("false"));
    assert_eq!(header(&mismatch, "x-idempotency-key"), Some("\"m-1\""));
    let passed = client.send("GET", "/aliases", &[], "").await;
    assert!(header(&passed, "idempotent-replayed").is_none());
    assert!(header(&passed, "idempotency-key").is_none());
    let unkeyed = send(&client, "/versioned", &[], BODY).await;
    assert_eq!(unkeyed.status, 201, "no key: passed through unprotected");
    assert!(header(&unkeyed, "idempotent-replayed").is_none());
    let key = [("idempotency-key", "q")];
    let quiet = send(&client, "/quiet", &key, BODY).await;
    assert_eq!(header(&quiet, "x-replayed"), Some("false"));
    assert!(header(&quiet, "idempotent-replayed").is_none());
    assert!(header(&quiet, "idempotency-key").is_none());
    assert_eq!(
        header(&send(&client, "/quiet", &key, BODY).await, "x-replayed"),
        Some("true")
    );
    proxy.stop().await;
}

on_both_stores!(
    key_header_aliases,
    selected_headers_are_fingerprinted,
    no_fingerprint_replays_any_body,
    keys_scoped_per_route,
    protected_answers_are_marked,
);
