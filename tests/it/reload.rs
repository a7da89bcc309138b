//! SIGHUP reloads the configuration file under load: routes added and a policy changed
//! apply to new requests at once, a request in flight finishes under the policy it started
//! with, an invalid file changes nothing, a setting only a restart can change is named —
//! and no request fails because of a reload.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// `PAYMENTS` with the payment route's replay header renamed and a refund route added.
fn v2() -> String {
    let renamed = PAYMENTS.replace(
        "    require_key: true\n    fingerprint:",
        "    require_key: true\n    replayed_header: X-Replayed\n    fingerprint:",
    );
    assert_ne!(renamed, PAYMENTS);
    format!(
        "{renamed}  - name: refund\n    methods: [POST]\n    path: /refunds\n    require_key: true\n"
    )
}

fn hangup(proxy: &ProxyProcess) {
    let pid = proxy.child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Writes a configuration as `ProxyProcess` does, over the file the proxy was started with.
fn rewrite(proxy: &ProxyProcess, upstream: &Upstream, db: &Backend, yaml: &str) {
    let path = proxy.dir().join("config.yaml");
    let running = std::fs::read_to_string(&path).unwrap();
    // The admin line `ProxyProcess` put first is kept as it was.
    let admin = running.lines().next().unwrap();
    let text = format!(
        "{admin}\n{}",
        yaml.replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url())
    );
    std::fs::write(&path, text).unwrap();
}

async fn logged(proxy: &ProxyProcess, needle: &str, times: usize) -> bool {
    eventually(Duration::from_secs(10), || async {
        (proxy.log_text().matches(needle).count() >= times).then_some(())
    })
    .await
    .is_some()
}

async fn reload_under_load(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let client = client_for(proxy.addr);

    // Load: four clients sending new keys back to back for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for worker in 0..4 {
        let (client, stop, sent) = (client.clone(), Arc::clone(&stop), Arc::clone(&sent));
        load.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("load-{worker}-{i}");
                statuses.push(client.post("/payments", "shop-1", &key, BODY).await.status);
                sent.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            statuses
        }));
    }
    // Before: /refunds is no route (passed through, key or not).
    let before = client
        .send("POST", "/refunds", &[("x-client-id", "shop-1")], BODY)
        .await;
    assert_eq!(before.status, 201, "{before:?}");

    // A request in flight across the reload keeps the policy it started with.
    let executed = upstream.executions();
    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "in-flight", BODY).await })
    };
    let started = eventually(Duration::from_secs(10), || async {
        (upstream.executions() > executed).then_some(())
    })
    .await;
    assert!(started.is_some());
    rewrite(&proxy, &upstream, &db, &v2());
    hangup(&proxy);
    assert!(
        logged(&proxy, "configuration reloaded", 1).await,
        "{}",
        proxy.log_text()
    );
    let old = in_flight.await.unwrap();
    assert_eq!(old.status, 201);
    assert_eq!(old.headers["idempotent-replayed"], "false", "{old:?}");
    assert!(old.headers.get("x-replayed").is_none(), "{old:?}");

    // After: the new route protects, the changed policy applies.
    let refund = client
        .send("POST", "/refunds", &[("x-client-id", "shop-1")], BODY)
        .await;
    assert_eq!(
        refund.status, 400,
        "the new route requires a key: {refund:?}"
    );
    let new = client.post("/payments", "shop-1", "after", BODY).await;
    assert_eq!(new.headers["x-replayed"], "false", "{new:?}");
    let replay = client.post("/payments", "shop-1", "after", BODY).await;
    assert_eq!(replay.headers["x-replayed"], "true", "{replay:?}");

    // An invalid file changes nothing, and says why.
    rewrite(
        &proxy,
        &upstream,
        &db,
        &v2().replace("lease: 30s", "lease: soon"),
    );
    hangup(&proxy);
    assert!(
        logged(&proxy, "NOT reloaded", 1).await,
        "{}",
        proxy.log_text()
    );
    assert!(
        proxy.log_text().contains("defaults.lease"),
        "{}",
        proxy.log_text()
    );
    let still = client
        .send("POST", "/refunds", &[("x-client-id", "shop-1")], BODY)
        .await;
    assert_eq!(
        still.status, 400,
        "the running configuration stays: {still:?}"
    );

    // A setting only a restart changes is named, and the rest still applies.
    rewrite(
        &proxy,
        &upstream,
        &db,
        &format!(
            "shutdown_grace: 45s\n{}",
            v2().replace("path: /refunds", "path: /refunds/*")
        ),
    );
    hangup(&proxy);
    assert!(
        logged(&proxy, "configuration reloaded", 2).await,
        "{}",
        proxy.log_text()
    );
    assert!(
        proxy
            .log_text()
            .lines()
            .any(|l| l.contains("only at a restart") && l.contains("shutdown_grace")),
        "{}",
        proxy.log_text()
    );
    let deeper = client
        .send("POST", "/refunds/7", &[("x-client-id", "shop-1")], BODY)
        .await;
    assert_eq!(deeper.status, 400, "{deeper:?}");

    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for worker in load {
        let statuses = worker.await.unwrap();
        total += statuses.len();
        assert!(
            statuses.iter().all(|s| *s == 201),
            "a request failed during the reloads: {statuses:?}"
        );
    }
    assert!(total >= 8, "the load ran throughout ({total} requests)");
    assert_eq!(sent.load(Ordering::SeqCst), total);
    // Each load request, the in-flight one, the unprotected refund and one "after".
    assert_eq!(upstream.executions(), total + 3);
}

on_both_stores!(reload_under_load);
