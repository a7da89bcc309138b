//! The proxy's own error answers in a route's dialect, over HTTP: a template route answers
//! in the template's shape and content type, a Stripe route in Stripe's error object with
//! `Stripe-Should-Retry`, and the default (and anything refused before routing) stays
//! problem+json. Status, `Retry-After` and the key echo are the same in every dialect.
//! (Every kind rendered in every dialect: `problem::tests`; the real SDKs: `sdk_stripe`.)

use crate::support;

use support::*;
use tokio::io::AsyncWriteExt;

const TEMPLATE: &str = r#"'{"errorCode": "{code}", "error": {"message": "{detail}", "status": {status}, "retryAfter": {retry_after}}}'"#;

fn config() -> String {
    PAYMENTS
        .replace(
            "    require_key: true\n",
            &format!(
                "    require_key: true\n    errors:\n      template: {TEMPLATE}\n      content_type: application/vnd.acme.error+json\n"
            ),
        )
        .replace("    max_body: 1KiB\n", "    max_body: 1KiB\n    errors: stripe\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_answers_in_its_dialect() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(), &upstream, &db).await;
    let client = TestClient::new(&proxy);

    // The template route: a missing key, then a reused one.
    let missing = client
        .send(
            "POST",
            "/payments",
            &[("x-client-id", "shop-1")],
            PAYMENT_BODY,
        )
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.headers["content-type"],
        "application/vnd.acme.error+json"
    );
    let v = missing.json();
    assert_eq!(
        (v["errorCode"].as_str(), v["error"]["status"].as_u64()),
        (Some("missing-key"), Some(400))
    );
    assert!(v["error"]["retryAfter"].is_null());
    assert_eq!(
        client
            .post("/payments", "shop-1", "k1", PAYMENT_BODY)
            .await
            .status,
        201
    );
    let reused = client
        .post(
            "/payments",
            "shop-1",
            "k1",
            &PAYMENT_BODY.replace("100", "999"),
        )
        .await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.json()["errorCode"], "key-reused");
    assert_eq!(
        reused.headers["idempotency-key"], "k1",
        "the key echo stays"
    );

    // The Stripe route: a reused key is Stripe's 400 idempotency_error, not to be retried.
    assert_eq!(
        client.post("/orders/1", "shop-1", "o1", "{}").await.status,
        201
    );
    let reused = client.post("/orders/1", "shop-1", "o1", "{\"x\":1}").await;
    assert_eq!(reused.status, 400, "{reused:?}");
    assert_eq!(reused.headers["content-type"], "application/json");
    assert_eq!(reused.headers["stripe-should-retry"], "false");
    assert_eq!(reused.json()["error"]["type"], "idempotency_error");

    // Heads refused before routing: the default, problem+json.
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"GET  / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let refused = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}
