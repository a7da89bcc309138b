//! The reconciler: unresolved keys on routes with a recovery probe are settled without a
//! client retry — stored when the provider has the operation, released when it does not,
//! left unresolved with a backoff when it cannot say — on both stores, from several
//! replicas at once, and racing client retries; the upstream never executes twice.

use crate::support;

use std::time::{Duration, Instant};

use support::*;

const BODY: &str = PAYMENT_BODY;

/// `/payments` with a recovery probe, a short upstream timeout and lease, and the
/// reconciler on every `interval`.
fn reconciling(interval: &str, batch: u32) -> String {
    PAYMENTS
        .replace("  timeout: 10s\n", "  timeout: 500ms\n")
        .replace("  lease: 30s\n", "  lease: 3s\n")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    recovery_probe:\n      method: GET\n      path: /probe/{key}\n",
        )
        + &format!("reconcile:\n  interval: {interval}\n  batch: {batch}\n")
}

/// `idemproxy_reconciled_total` of `/payments` for one outcome.
async fn reconciled(admin: std::net::SocketAddr, outcome: &str) -> f64 {
    let series =
        format!(r#"idemproxy_reconciled_total{{route="create-payment",outcome="{outcome}"}}"#);
    metric(admin, &series).await
}

/// `idemproxy_unresolved_keys` of `/payments`.
async fn unresolved_gauge(admin: std::net::SocketAddr) -> f64 {
    metric(
        admin,
        r#"idemproxy_unresolved_keys{route="create-payment"}"#,
    )
    .await
}

/// Waits (up to `limit`) until the key's row satisfies `done`.
async fn row_becomes(
    db: &Backend,
    key: &str,
    limit: Duration,
    done: impl Fn(Option<&idemproxy::store::KeyRecord>) -> bool,
) -> Option<idemproxy::store::KeyRecord> {
    let reached = eventually(limit, || async {
        let row = db.lookup("shop-1", key).await;
        done(row.as_ref()).then_some(())
    })
    .await;
    assert!(reached.is_some(), "key {key} never reached the state");
    db.lookup("shop-1", key).await
}

/// An upstream that hung past the timeout but did charge: the reconciler's probe finds
/// the charge and the key is completed with no client retry; the first retry replays
/// the provider's answer, and the upstream executed once.
async fn found_operations_are_stored_without_a_retry(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(&reconciling("200ms", 10), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "hung", BODY).await;
    assert_eq!(first.status, 504, "{first:?}");
    let row = row_becomes(&db, "hung", Duration::from_secs(10), |r| {
        r.is_some_and(|r| r.state.status() == "done")
    })
    .await
    .unwrap();
    assert_eq!(
        row.response_status,
        Some(200),
        "the probe's answer is stored"
    );
    assert_eq!(upstream.probes(), 1);
    assert_eq!(upstream.executions(), 1);
    let retry = client.post("/payments", "shop-1", "hung", BODY).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.json()["charge_id"], 1);
    assert_eq!(upstream.executions(), 1, "never executed again");
    assert_eq!(reconciled(proxy.admin, "found").await, 1.0);
    proxy.stop().await;
}

/// On a route whose derived key is hashed, the reconciler asks the probe with the key the
/// attempt sent (kept with the row): the charge made under it is found and stored, not
/// mistaken for a missing operation and released.
async fn probes_use_the_derived_key_the_attempt_sent(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let yaml = reconciling("200ms", 10).replace(
        "    require_key: true\n",
        "    require_key: true\n    derived_key: { hash: sha256 }\n",
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "hashed", BODY).await;
    assert_eq!(first.status, 504, "{first:?}");
    let row = row_becomes(&db, "hashed", Duration::from_secs(10), |r| {
        r.is_some_and(|r| r.state.status() == "done")
    })
    .await
    .unwrap();
    assert_eq!(row.response_status, Some(200), "found under the hashed key");
    let sent = upstream.seen()[0].headers["idempotency-key"].clone();
    assert_eq!(sent.len(), 64, "{sent:?}");
    assert_eq!(row.derived_key.as_deref(), sent.to_str().ok());
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// A worker that crashed before reaching the provider: the probe does not find the
/// operation, so the reconciler releases the key and the next retry executes, once.
async fn missing_operations_are_released(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    crashed_reservation(&db, "shop-1", "lost").await;
    let proxy = TestProxy::spawn(&reconciling("200ms", 10), &upstream, &db).await;
    row_becomes(&db, "lost", Duration::from_secs(10), |r| r.is_none()).await;
    assert_eq!(upstream.probes(), 1);
    assert_eq!(upstream.executions(), 0);
    let client = TestClient::new(&proxy);
    let retry = client.post("/payments", "shop-1", "lost", BODY).await;
    assert_eq!((retry.status.as_u16(), retry.replayed()), (201, false));
    assert_eq!(upstream.executions(), 1);
    assert_eq!(upstream.probes(), 1, "a fresh reservation does not probe");
    assert_eq!(reconciled(proxy.admin, "not_found").await, 1.0);
    proxy.stop().await;
}

/// A provider whose lookup is down: each inconclusive probe leaves the key unresolved,
/// counts one more probe in the row, and doubles the wait before the next (never sooner
/// than the backoff); `/admin/stuck` shows the key marked for the reconciler, and the
/// gauge counts it. Once the lookup is back, the key is settled.
async fn inconclusive_probes_back_off(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        probe_status: Some(503),
        ..Default::default()
    })
    .await;
    crashed_reservation(&db, "shop-1", "unsure").await;
    let started = Instant::now();
    let proxy = TestProxy::spawn(&reconciling("150ms", 10), &upstream, &db).await;
    let row = row_becomes(&db, "unsure", Duration::from_secs(15), |r| {
        r.is_some_and(|r| r.probes >= 3)
    })
    .await
    .unwrap();
    // Probes 1, 2, 3 came at least 150 ms + 300 ms apart after the first pass.
    assert!(started.elapsed() >= Duration::from_millis(150 * 4));
    assert!(
        upstream.probes() <= row.probes as usize + 1,
        "{}",
        upstream.probes()
    );
    assert_eq!(row.state.status(), "in_progress");
    assert!(
        row.state.lease_remaining_ms().unwrap() < 0,
        "still unresolved"
    );
    assert_eq!(upstream.executions(), 0);
    let stuck = TestClient::at(proxy.admin)
        .send("GET", "/admin/stuck", &[], "")
        .await;
    let keys = stuck.json()["keys"].as_array().unwrap().clone();
    let shown = keys.iter().find(|k| k["key"] == "unsure").unwrap();
    assert_eq!(shown["reconciler"], true, "{shown}");
    assert!(shown["probes"].as_i64().unwrap() >= 3, "{shown}");
    assert!(shown["next_probe_at"].is_string(), "{shown}");
    assert!(reconciled(proxy.admin, "inconclusive").await >= 3.0);
    // The gauge is brought up to date after every pass.
    let counted = eventually(Duration::from_secs(30), || async {
        let n = unresolved_gauge(proxy.admin).await;
        (n == 1.0).then_some(())
    })
    .await;
    assert!(counted.is_some(), "the gauge counts the unresolved key");
    upstream.set(Behavior::default());
    row_becomes(&db, "unsure", Duration::from_secs(20), |r| r.is_none()).await;
    let zero = eventually(Duration::from_secs(30), || async {
        let n = unresolved_gauge(proxy.admin).await;
        (n == 0.0).then_some(())
    })
    .await;
    assert!(zero.is_some(), "the gauge drops back to 0");
    assert_eq!(upstream.executions(), 0);
    proxy.stop().await;
}

/// A route without a probe is left to its clients and operators: the reconciler does not
/// touch its keys, and `/admin/stuck` says so.
async fn keys_without_a_probe_are_left_alone(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let fp = payment_fingerprint();
    let req = idemproxy::store::ReserveRequest {
        client_id: "shop-1",
        key: "orders",
        fingerprint: &fp,
        route: "orders",
        lease: Duration::from_millis(1),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    };
    use idemproxy::store::KeyStore;
    db.store().reserve(&req).await.unwrap();
    let proxy = TestProxy::spawn(&reconciling("100ms", 10), &upstream, &db).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(upstream.probes(), 0);
    let row = db.lookup("shop-1", "orders").await.unwrap();
    assert_eq!((row.state.status(), row.probes), ("in_progress", 0));
    let stuck = TestClient::at(proxy.admin)
        .send("GET", "/admin/stuck", &[], "")
        .await;
    assert_eq!(stuck.json()["keys"][0]["reconciler"], false, "{stuck:?}");
    proxy.stop().await;
}

/// Client retries racing the reconciler on the same keys — some the provider has, some it
/// does not: every retry is answered with the stored answer, a `409` while the other side
/// works, or the one execution; each operation happens exactly once.
async fn retries_racing_the_reconciler_never_execute_twice(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let direct = TestClient::at(upstream.addr);
    let keys: Vec<String> = (0..16).map(|i| format!("race-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        crashed_reservation(&db, "shop-1", key).await;
        if i % 2 == 0 {
            // The crashed worker had reached the provider for every other key.
            let derived = format!("shop-1:{key}");
            let charged = direct
                .send("POST", "/payments", &[("idempotency-key", &derived)], BODY)
                .await;
            assert_eq!(charged.status, 201);
        }
    }
    let proxy = TestProxy::spawn(&reconciling("50ms", 4), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let mut tasks = tokio::task::JoinSet::new();
    for key in keys.clone() {
        let client = client.clone();
        tasks.spawn(async move {
            // Retry until the answer is final, as a client would.
            for _ in 0..100 {
                let reply = client.post("/payments", "shop-1", &key, BODY).await;
                match reply.status.as_u16() {
                    409 => tokio::time::sleep(Duration::from_millis(30)).await,
                    200 | 201 => return (key, reply),
                    other => panic!("{key}: unexpected {other}: {reply:?}"),
                }
            }
            panic!("{key}: never final");
        });
    }
    for (key, reply) in tasks.join_all().await {
        let n: usize = key.trim_start_matches("race-").parse().unwrap();
        let derived = format!("shop-1:{key}");
        let executions = upstream
            .seen()
            .iter()
            .filter(|s| {
                s.headers
                    .get("idempotency-key")
                    .is_some_and(|v| v == &derived)
            })
            .count();
        assert_eq!(executions, 1, "{key}: one execution in all");
        if n.is_multiple_of(2) {
            assert_eq!(reply.status, 200, "{key}: the provider's answer, found");
        } else {
            assert_eq!(reply.status, 201, "{key}: executed once: {reply:?}");
        }
    }
    assert_eq!(upstream.executions(), keys.len());
    proxy.stop().await;
}

on_every_store!(
    probes_use_the_derived_key_the_attempt_sent,
    found_operations_are_stored_without_a_retry,
    missing_operations_are_released,
    inconclusive_probes_back_off,
    keys_without_a_probe_are_left_alone,
    retries_racing_the_reconciler_never_execute_twice,
);

/// Three replicas reconciling one PostgreSQL table at once, in small batches: every key
/// is probed exactly once and settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_probe_each_key_once() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let direct = TestClient::at(upstream.addr);
    let keys: Vec<String> = (0..30).map(|i| format!("replica-{i}")).collect();
    for key in &keys {
        crashed_reservation(&db, "shop-1", key).await;
        let derived = format!("shop-1:{key}");
        direct
            .send("POST", "/payments", &[("idempotency-key", &derived)], BODY)
            .await;
    }
    let yaml = reconciling("100ms", 3);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(TestProxy::spawn(&yaml, &upstream, &db).await);
    }
    for key in &keys {
        row_becomes(&db, key, Duration::from_secs(30), |r| {
            r.is_some_and(|r| r.state.status() == "done")
        })
        .await;
    }
    assert_eq!(upstream.probes(), keys.len(), "each key probed once");
    assert_eq!(upstream.executions(), keys.len(), "only the direct charges");
    let mut found = 0.0;
    for replica in &replicas {
        found += reconciled(replica.admin, "found").await;
    }
    assert_eq!(found, keys.len() as f64);
    for replica in replicas {
        replica.stop().await;
    }
}
