//! The proxy process itself dies or is stopped mid-flight.

use crate::support;
use idemproxy::store::KeyState;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// A short lease, so that a crashed proxy's keys free up within seconds.
fn short_lease() -> String {
    PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n")
}

/// The seed's crash: the proxy is SIGKILLed while the upstream charges. A new process on
/// the same database answers an immediate retry with 409; a retry after the lease takes the
/// key over and re-executes with the same derived key, which the provider recognises, so
/// exactly one charge is made.
async fn sigkill_mid_flight_then_takeover_charges_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(1500),
        dedupe: true,
        ..Default::default()
    })
    .await;
    let yaml = short_lease();
    let mut first = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let in_flight = {
        let client = client_for(first.addr);
        tokio::spawn(async move {
            client
                .try_send(
                    "POST",
                    "/payments",
                    &[
                        ("content-type", "application/json"),
                        ("idempotency-key", "crash-1"),
                        ("x-client-id", "shop-1"),
                    ],
                    BODY,
                )
                .await
        })
    };
    upstream.wait_executions(1).await;
    first.kill().await;
    assert!(
        in_flight.await.unwrap().is_err(),
        "the first client lost its connection"
    );

    let second = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let client = client_for(second.addr);
    let immediate = client.post("/payments", "shop-1", "crash-1", BODY).await;
    assert_eq!(
        immediate.status, 409,
        "the dead worker's lease still holds: {immediate:?}"
    );

    let after_lease = client
        .post_until_settled("/payments", "shop-1", "crash-1", BODY)
        .await;
    assert_eq!(after_lease.status, 201, "{after_lease:?}");
    assert_eq!(
        after_lease.json()["charge_id"],
        1,
        "the provider recognised the derived key"
    );
    assert_eq!(
        upstream.executions(),
        2,
        "re-executed once after the takeover"
    );
    assert_eq!(upstream.charges(), 1, "charged exactly once");
    let keys: Vec<_> = upstream
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].clone())
        .collect();
    assert_eq!(keys, vec!["shop-1:crash-1", "shop-1:crash-1"]);

    let replay = client.post("/payments", "shop-1", "crash-1", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, after_lease.body);
    let attempts = db.lookup("shop-1", "crash-1").await.unwrap().attempts;
    assert_eq!(attempts, 2);
    assert!(
        second.log_text().contains("took over an expired lease"),
        "{}",
        second.log_text()
    );
}

/// SIGTERM while the upstream works on requests from several connections (spread over the
/// server's threads): every call finishes, its answer is stored and sent, and the process
/// exits 0.
async fn sigterm_drains_in_flight_requests(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let mut proxy = ProxyProcess::spawn(&short_lease(), &upstream, &db).await;
    let mut in_flight = Vec::new();
    for i in 0..8 {
        // A client of its own: a connection of its own.
        let client = client_for(proxy.addr);
        in_flight.push(tokio::spawn(async move {
            client
                .post("/payments", "shop-1", &format!("term-{i}"), BODY)
                .await
        }));
    }
    upstream.wait_executions(8).await;
    proxy.terminate();

    for reply in in_flight {
        let reply = reply.await.unwrap();
        assert_eq!(
            reply.status, 201,
            "the in-flight request was finished, not cut"
        );
    }
    let status = tokio::time::timeout(Duration::from_secs(20), proxy.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        proxy.log_text()
    );
    for i in 0..8 {
        let row = db.lookup("shop-1", &format!("term-{i}")).await.unwrap();
        assert_eq!(row.state, KeyState::Done);
        assert_eq!(row.response_status, Some(201));
    }
    assert_eq!(upstream.executions(), 8);
}

/// A completed key survives the process being SIGKILLed: a new process on the same store
/// (the same file, for the embedded store) replays it without executing again.
async fn completed_keys_survive_sigkill(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = short_lease();
    let mut first = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let reply = client_for(first.addr)
        .post("/payments", "shop-1", "durable", BODY)
        .await;
    assert_eq!(reply.status, 201);
    first.kill().await;

    let second = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let replay = client_for(second.addr)
        .post("/payments", "shop-1", "durable", BODY)
        .await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.executions(), 1);
}

on_both_stores!(
    sigkill_mid_flight_then_takeover_charges_once,
    sigterm_drains_in_flight_requests,
    completed_keys_survive_sigkill,
);
