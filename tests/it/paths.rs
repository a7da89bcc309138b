//! Every spelling of a protected path is protected: the route, the fingerprint and the
//! forwarded request all use one normalised path, and spellings that cannot be normalised
//! safely are refused before anything is reserved or forwarded.

use crate::support;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

const ROUTES: &str = r#"
upstream:
  url: {upstream}
{store}
client_id:
  header: X-Client-Id
routes:
  - name: create-payment
    methods: [POST]
    path: /payments
    require_key: true
  - name: refund
    methods: [POST]
    path: /payments/{id}/refunds
    require_key: true
"#;

/// Spellings that servers read as `/payments`, and the path each must be forwarded as.
const SAFE_SPELLINGS: &[(&str, &str)] = &[
    ("/payments", "/payments"),
    ("/payments/", "/payments"),
    ("//payments", "/payments"),
    ("/payments//", "/payments"),
    ("///payments", "/payments"),
    ("/%70ayments", "/payments"),
    ("/pay%6dents", "/payments"),
    ("/pay%6Dents", "/payments"),
    ("/./payments", "/payments"),
    ("/payments/.", "/payments"),
    ("/x/../payments", "/payments"),
    ("/../payments", "/payments"),
    ("/a/b/../../payments/", "/payments"),
    ("/PAYMENTS", "/payments"),
    ("/Payments/", "/payments"),
];

/// Spellings of the refund route's path.
const SAFE_REFUND_SPELLINGS: &[&str] = &[
    "/payments/42/refunds",
    "/payments/42/refunds/",
    "//payments//42//refunds",
    "/payments/42/./refunds",
    "/payments/x/../42/refunds",
    "/payments/%34%32/refunds",
    "/Payments/42/REFUNDS",
];

/// Spellings that servers resolve differently: refused with `400`, never forwarded.
const UNSAFE_SPELLINGS: &[&str] = &[
    "/payments%2F",
    "/payments%2f",
    "/x%2F..%2Fpayments",
    "/payments%5C",
    "/payments\\",
    "/x/%2e%2e/payments",
    "/x/.%2E/payments",
    "/payments/%2e",
    "/payments%00",
    "/payments%0a",
    "/payments%zz",
    "/payments%",
    "/payments;jsessionid=1",
    "/payments/42/refunds;x=1",
];

/// A `require_key` route without a key is never executed, whatever the path's spelling:
/// each spelling gets a `400` problem and the upstream sees nothing.
async fn keyless_spellings_never_execute(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(ROUTES, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let spellings = SAFE_SPELLINGS
        .iter()
        .map(|(s, _)| *s)
        .chain(SAFE_REFUND_SPELLINGS.iter().copied())
        .chain(UNSAFE_SPELLINGS.iter().copied());
    for path in spellings {
        let reply = client
            .send(
                "POST",
                path,
                &[
                    ("content-type", "application/json"),
                    ("x-client-id", "shop-1"),
                ],
                BODY,
            )
            .await;
        assert_eq!(reply.status, 400, "{path}: {reply:?}");
        assert!(reply.is_problem(), "{path}");
        let kind = reply.json()["type"].as_str().unwrap().to_owned();
        assert!(
            kind.ends_with("missing-key") || kind.ends_with("invalid-path"),
            "{path}: {kind}"
        );
    }
    assert_eq!(upstream.executions(), 0, "a keyless spelling got through");
    assert_eq!(db.rows().await, 0);
    proxy.stop().await;
}

/// The same key sent under every spelling of one path executes once; every other
/// spelling replays it, and the upstream sees only the normalised path.
async fn one_key_under_every_spelling_executes_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(ROUTES, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for (i, (path, _)) in SAFE_SPELLINGS.iter().enumerate() {
        let reply = client.post(path, "shop-1", "pay-1", BODY).await;
        assert_eq!(reply.status, 201, "{path}: {reply:?}");
        assert_eq!(reply.replayed(), i > 0, "{path}");
    }
    for (i, path) in SAFE_REFUND_SPELLINGS.iter().enumerate() {
        let reply = client.post(path, "shop-1", "refund-1", BODY).await;
        assert_eq!(reply.status, 201, "{path}: {reply:?}");
        assert_eq!(reply.replayed(), i > 0, "{path}");
    }
    assert_eq!(upstream.executions(), 2);
    let seen: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(seen, ["/payments", "/payments/42/refunds"]);
    proxy.stop().await;
}

/// Each spelling is forwarded as the route spells it, with its query string kept.
async fn what_was_matched_is_forwarded(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(ROUTES, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for (i, (path, forwarded)) in SAFE_SPELLINGS.iter().enumerate() {
        let key = format!("k{i}");
        let reply = client
            .post(&format!("{path}?mode=test"), "shop-1", &key, BODY)
            .await;
        assert_eq!(reply.status, 201, "{path}");
        let seen = upstream.seen().pop().unwrap();
        assert_eq!(seen.path, format!("{forwarded}?mode=test"), "{path}");
    }
    proxy.stop().await;
}

/// Unsafe spellings get an `invalid-path` problem that says what is wrong, reserve
/// nothing, and are never forwarded — with a key too, and on paths no route names
/// (a protected method's path cannot be told apart from a route's without normalising
/// it). Methods no route protects pass through untouched.
async fn unsafe_spellings_are_refused(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(ROUTES, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for path in UNSAFE_SPELLINGS.iter().copied().chain(["/files/a%2Fb"]) {
        let reply = client.post(path, "shop-1", "k", BODY).await;
        assert_eq!(reply.status, 400, "{path}: {reply:?}");
        assert!(
            reply.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("invalid-path"),
            "{path}"
        );
        assert!(reply.detail().contains("path"), "{path}");
    }
    assert_eq!(upstream.executions(), 0);
    assert_eq!(db.rows().await, 0);

    let get = client.send("GET", "/payments%2F", &[], "").await;
    assert_eq!(get.status, 201, "GET is not protected: passed through");
    assert_eq!(upstream.seen().pop().unwrap().path, "/payments%2F");
    proxy.stop().await;
}

on_both_stores!(
    keyless_spellings_never_execute,
    one_key_under_every_spelling_executes_once,
    what_was_matched_is_forwarded,
    unsafe_spellings_are_refused,
);
