//! Keys and fingerprints the way existing clients and providers spell them: several key
//! headers per route, fingerprints over selected headers or none at all, keys scoped per
//! route, and every protected answer marked — on both stores, counting executions.

use crate::support;

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
  - name: square
    methods: [POST]
    path: /square
    require_key: true
    key_from: { body: /idempotency_key }
  - name: legacy
    methods: [POST]
    path: /legacy
    key_from: { body: /order_number }
    echo_key_header: X-Order-Number
  - name: provider-body
    methods: [POST]
    path: /provider-body
    require_key: true
    upstream_key: { body: /idempotency_key }
  - name: square-both
    methods: [POST]
    path: /square-both
    require_key: true
    key_from: { body: /idempotency_key }
    upstream_key: { body: /idempotency_key }
  - name: hashed
    methods: [POST]
    path: /hashed
    derived_key: { hash: sha256 }
  - name: shortened
    methods: [POST]
    path: /shortened
    derived_key: { max_length: 64 }
  - name: square-short
    methods: [POST]
    path: /square-short
    derived_key: { max_length: 45 }
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

/// `key_from: { body: /idempotency_key }`: the key is read from a JSON member or a form
/// field when no key header is present (a header wins); it replays and guards against
/// reuse like a header key, and the same body key from two clients is two operations.
async fn keys_read_from_the_body(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let body = r#"{"idempotency_key":"sq-1","amount":100}"#;
    let first = send(&client, "/square", &[], body).await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    assert!(send(&client, "/square", &[], body).await.replayed());
    let reused = send(
        &client,
        "/square",
        &[],
        r#"{"idempotency_key":"sq-1","amount":5}"#,
    )
    .await;
    assert_eq!(reused.status, 422, "{reused:?}");
    let other_client = client
        .send(
            "POST",
            "/square",
            &[
                ("content-type", "application/json"),
                ("x-client-id", "shop-2"),
            ],
            body,
        )
        .await;
    assert_eq!(
        (other_client.status.as_u16(), other_client.replayed()),
        (201, false)
    );
    assert_eq!(upstream.executions(), 2);
    assert_eq!(
        upstream.seen()[0].headers.get("idempotency-key").unwrap(),
        "shop-1:sq-1",
        "the derived key from the body key"
    );
    assert_eq!(
        upstream.seen()[0].body,
        body,
        "the body is forwarded as sent"
    );
    // A header wins over the body.
    let headed = send(&client, "/square", &[("idempotency-key", "h-1")], body).await;
    assert_eq!((headed.status.as_u16(), headed.replayed()), (201, false));
    assert_eq!(
        upstream.seen()[2].headers.get("idempotency-key").unwrap(),
        "shop-1:h-1"
    );
    // A form body, and a number as the key.
    let form = client
        .send(
            "POST",
            "/square",
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("x-client-id", "shop-1"),
            ],
            "amount=5&idempotency_key=f-1",
        )
        .await;
    assert_eq!(form.status, 201, "{form:?}");
    assert_eq!(
        upstream.seen()[3].headers.get("idempotency-key").unwrap(),
        "shop-1:f-1"
    );
    let numbered = send(&client, "/legacy", &[], r#"{"order_number":12345}"#).await;
    assert_eq!(numbered.status, 201);
    assert_eq!(
        header(&numbered, "x-order-number"),
        Some("12345"),
        "echoed under its name"
    );
    assert_eq!(
        upstream.seen()[4].headers.get("idempotency-key").unwrap(),
        "shop-1:12345"
    );
    assert!(
        send(&client, "/legacy", &[], r#"{"order_number":12345}"#)
            .await
            .replayed()
    );
    proxy.stop().await;
}

/// A body key that is missing (where required), empty, not a string or number, sent
/// twice, or in a body that is not JSON gets the same `400`s as a bad header key, and
/// nothing is reserved. Where a key is not required, a body without one is forwarded
/// unprotected.
async fn bad_body_keys_are_refused(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let missing = send(&client, "/square", &[], r#"{"amount":100}"#).await;
    assert_eq!(missing.status, 400);
    assert!(
        missing.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("missing-key")
    );
    assert!(missing.detail().contains("/idempotency_key"), "{missing:?}");
    for (body, reason) in [
        (r#"{"idempotency_key":""}"#, "empty"),
        (r#"{"idempotency_key":{"a":1}}"#, "string or a number"),
        (r#"{"idempotency_key":"café"}"#, "non-ASCII"),
        (r#"{"idempotency_key": "x""#, "not valid JSON"),
    ] {
        let bad = send(&client, "/square", &[], body).await;
        assert_eq!(bad.status, 400, "{body}: {bad:?}");
        assert!(
            bad.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("invalid-key"),
            "{bad:?}"
        );
        assert!(bad.detail().contains(reason), "{body}: {bad:?}");
    }
    let twice = client
        .send(
            "POST",
            "/square",
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("x-client-id", "shop-1"),
            ],
            "idempotency_key=a&idempotency_key=b",
        )
        .await;
    assert_eq!(twice.status, 400, "{twice:?}");
    assert!(twice.detail().contains("more than once"), "{twice:?}");
    assert_eq!(db.rows().await, 0, "nothing reserved");
    assert_eq!(upstream.executions(), 0);
    let unkeyed = send(&client, "/legacy", &[], r#"{"amount":1}"#).await;
    assert_eq!(unkeyed.status, 201);
    assert!(
        header(&unkeyed, "idempotent-replayed").is_none(),
        "not protected"
    );
    assert_eq!(
        send(&client, "/legacy", &[], r#"{"amount":1}"#)
            .await
            .status,
        201
    );
    assert_eq!(upstream.executions(), 2, "forwarded each time");
    assert_eq!(upstream.seen()[0].body, r#"{"amount":1}"#);
    assert_eq!(db.rows().await, 0);
    proxy.stop().await;
}

/// `upstream_key: { body: /idempotency_key }`: the derived key reaches the provider in the
/// body — replaced in place or added, the rest of the body byte for byte as sent — and
/// not in a header; the fingerprint is the client's body, so a retry replays. A body
/// that cannot carry it is refused before anything is reserved.
async fn derived_keys_written_into_the_body(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let key = [("idempotency-key", "pb-1")];
    let body = r#"{ "amount" : 1.50 ,"idempotency_key":"mine", "n":[1e2] }"#;
    assert_eq!(
        send(&client, "/provider-body", &key, body).await.status,
        201
    );
    assert!(send(&client, "/provider-body", &key, body).await.replayed());
    assert_eq!(upstream.executions(), 1);
    let seen = &upstream.seen()[0];
    assert_eq!(
        seen.body,
        r#"{ "amount" : 1.50 ,"idempotency_key":"shop-1:pb-1", "n":[1e2] }"#
    );
    assert!(seen.headers.get("idempotency-key").is_none());
    let key = [("idempotency-key", "pb-2")];
    assert_eq!(
        send(&client, "/provider-body", &key, r#"{"amount":2}"#)
            .await
            .status,
        201
    );
    assert_eq!(
        upstream.seen()[1].body,
        r#"{"amount":2,"idempotency_key":"shop-1:pb-2"}"#
    );
    // The client's key read from the body and the provider's written back in its place.
    let square = r#"{"idempotency_key":"sq-9","amount":3}"#;
    assert_eq!(send(&client, "/square-both", &[], square).await.status, 201);
    assert!(send(&client, "/square-both", &[], square).await.replayed());
    assert_eq!(
        upstream.seen()[2].body,
        r#"{"idempotency_key":"shop-1:sq-9","amount":3}"#
    );
    let rows = db.rows().await;
    let key = [("idempotency-key", "pb-3")];
    let refused = send(&client, "/provider-body", &key, "[1, 2]").await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("invalid-body")
    );
    assert!(refused.detail().contains("/idempotency_key"), "{refused:?}");
    assert_eq!(db.rows().await, rows, "nothing reserved");
    assert_eq!(upstream.executions(), 3);
    proxy.stop().await;
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `derived_key: { hash: sha256 }` sends 64 hex characters, the same across restarts;
/// `{ max_length: 64 }` sends the plain form when it fits and the hash when it does not.
async fn derived_keys_fit_the_provider(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let key = [("idempotency-key", "h-1")];
    for _ in 0..2 {
        let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
        let client = TestClient::new(&proxy);
        send(&client, "/hashed", &key, BODY).await;
        proxy.stop().await;
    }
    let sent: Vec<String> = upstream
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(sent.len(), 1, "replayed after the restart: {sent:?}");
    assert_eq!(sent[0], sha256_hex("shop-1:h-1"));
    let proxy = TestProxy::spawn(FORMS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    send(&client, "/shortened", &[("idempotency-key", "short")], BODY).await;
    let long = "l".repeat(60);
    send(&client, "/shortened", &[("idempotency-key", &long)], BODY).await;
    let seen = upstream.seen();
    assert_eq!(seen[1].headers["idempotency-key"], "shop-1:short");
    assert_eq!(
        seen[2].headers["idempotency-key"].to_str().unwrap(),
        sha256_hex(&format!("shop-1:{long}"))
    );
    // A limit under 64 (Square's 45): a key at Square's own maximum does not fit with
    // its client id, and goes as 43 base64url characters — another client's the same key
    // as another, and a short key still as it is.
    let square = "k".repeat(45);
    send(
        &client,
        "/square-short",
        &[("idempotency-key", &square)],
        BODY,
    )
    .await;
    let other = [
        ("content-type", "application/json"),
        ("x-client-id", "shop-2"),
        ("idempotency-key", square.as_str()),
    ];
    client.send("POST", "/square-short", &other, BODY).await;
    send(
        &client,
        "/square-short",
        &[("idempotency-key", "short-sq")],
        BODY,
    )
    .await;
    let seen = upstream.seen();
    let sent = |i: usize| {
        seen[i].headers["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(sent(3), base64url_sha256(&format!("shop-1:{square}")));
    assert_eq!(sent(3).len(), 43);
    assert_eq!(sent(4), base64url_sha256(&format!("shop-2:{square}")));
    assert_ne!(sent(3), sent(4));
    assert_eq!(sent(5), "shop-1:short-sq");
    proxy.stop().await;
}

fn base64url_sha256(text: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The derived key is kept with the reservation: when `derived_key:` changes between an
/// attempt and the retry that takes it over, the retry sends what the attempt sent —
/// either way round — so the provider sees one operation.
async fn a_reconfigured_derived_key_does_not_change_a_takeover(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: std::time::Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let yaml = |form: &str| {
        PAYMENTS
            .replace("  timeout: 10s\n", "  timeout: 500ms\n")
            .replace("  lease: 30s\n", "  lease: 3s\n")
            .replace(
                "    require_key: true\n",
                &format!("    require_key: true\n    derived_key: {form}\n"),
            )
    };
    for (first, then, key) in [
        ("{ hash: sha256 }", "plain", "was-hashed"),
        ("plain", "{ hash: sha256 }", "was-plain"),
    ] {
        upstream.set(Behavior {
            delay: std::time::Duration::from_secs(5),
            ..Default::default()
        });
        let proxy = TestProxy::spawn(&yaml(first), &upstream, &db).await;
        let timed_out = TestClient::new(&proxy)
            .post("/payments", "shop-1", key, BODY)
            .await;
        assert_eq!(timed_out.status, 504, "{timed_out:?}");
        proxy.stop().await;
        tokio::time::sleep(std::time::Duration::from_millis(3_300)).await;
        upstream.set(Behavior::default());
        let proxy = TestProxy::spawn(&yaml(then), &upstream, &db).await;
        let retry = TestClient::new(&proxy)
            .post("/payments", "shop-1", key, BODY)
            .await;
        assert_eq!(retry.status, 201, "the takeover executes: {retry:?}");
        proxy.stop().await;
        let sent: Vec<String> = upstream
            .seen()
            .iter()
            .filter(|s| s.body.contains(&b'1'))
            .map(|s| s.headers["idempotency-key"].to_str().unwrap().to_owned())
            .rev()
            .take(2)
            .collect();
        assert_eq!(sent[0], sent[1], "{key}: one derived key for both attempts");
        let plain = format!("shop-1:{key}");
        let expected = if first == "plain" {
            plain.clone()
        } else {
            sha256_hex(&plain)
        };
        assert_eq!(sent[0], expected, "{key}");
    }
}

on_both_stores!(
    derived_keys_fit_the_provider,
    a_reconfigured_derived_key_does_not_change_a_takeover,
    derived_keys_written_into_the_body,
    keys_read_from_the_body,
    bad_body_keys_are_refused,
    key_header_aliases,
    selected_headers_are_fingerprinted,
    no_fingerprint_replays_any_body,
    keys_scoped_per_route,
    protected_answers_are_marked,
);
