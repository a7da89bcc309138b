//! Failover under keyed load: a primary with a synchronous streaming standby, the proxy
//! (its own process) on a multi-host URL with `target_session_attrs=read-write`, clients
//! that retry each payment until it is settled, a provider that deduplicates by key. The
//! primary is stopped hard, or vanishes without a reset (a relay the test freezes), or
//! stays up read-only; then the standby is promoted. Nothing is forwarded while no
//! primary is reachable, the service comes back within seconds without a restart, every
//! answered key replays, and no key is charged twice.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

#[derive(Clone, Copy, Debug)]
enum Failure {
    StoppedHard,
    Vanished,
    ReadOnly,
}

fn addr(cluster: &Cluster) -> SocketAddr {
    format!("127.0.0.1:{}", cluster.port).parse().unwrap()
}

/// A primary and a standby it waits for on every commit.
fn sync_pair() -> (Cluster, Cluster) {
    let primary = Cluster::start_new(
        "primary",
        "wal_level = replica\nmax_wal_senders = 5\nsynchronous_commit = on\n",
        "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
    );
    primary.psql("postgres", "CREATE DATABASE pay");
    let standby = Cluster::standby_of(&primary, "standby", "standby1");
    primary.psql(
        "postgres",
        "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
    );
    primary.psql("postgres", "SELECT pg_reload_conf()");
    let deadline = Instant::now() + Duration::from_secs(30);
    while primary
        .psql("postgres", "SELECT sync_state FROM pg_stat_replication")
        .trim()
        != "sync"
    {
        assert!(
            Instant::now() < deadline,
            "the standby never became synchronous"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (primary, standby)
}

/// One payment per key, retried (as a client library would) until it is settled.
async fn settle(client: &TestClient, key: &str, give_up: Instant) -> Reply {
    loop {
        let reply = client.post("/payments", "shop-1", key, BODY).await;
        let retry = matches!(reply.status.as_u16(), 409 | 502 | 503 | 504);
        if !retry || Instant::now() > give_up {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn failover(failure: Failure) {
    let (primary, standby) = sync_pair();
    let to_primary = Relay::spawn(addr(&primary)).await;
    let to_standby = Relay::spawn(addr(&standby)).await;
    let url = format!(
        "postgres://postgres@{},{}/pay?target_session_attrs=read-write",
        to_primary.addr, to_standby.addr
    );
    let store =
        format!("store:\n  postgres:\n    url: \"{url}\"\n    timeout: 1s\n    pool_size: 4\n");
    migrate_store(&store).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(200),
        dedupe: true,
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS
        .replace("{store}", &store)
        .replace("  lease: 30s\n", "  lease: 3s\n");
    let proxy = ProxyProcess::spawn(&yaml, &upstream, &Backend::embedded()).await;

    // Clients paying one key after another, each until settled.
    let stop = Arc::new(AtomicBool::new(false));
    let settled: Arc<Mutex<Vec<(String, Reply, Instant)>>> = Arc::default();
    let mut load = Vec::new();
    for c in 0..4 {
        let (client, stop, settled) = (client_for(proxy.addr), stop.clone(), settled.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("c{c}-{i}");
                let reply = settle(&client, &key, Instant::now() + Duration::from_secs(40)).await;
                settled.lock().unwrap().push((key, reply, Instant::now()));
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let failed_at = Instant::now();
    match failure {
        Failure::StoppedHard => primary.stop_immediate(),
        Failure::Vanished => to_primary.freeze(),
        Failure::ReadOnly => {
            primary.psql(
                "postgres",
                "ALTER SYSTEM SET default_transaction_read_only = on",
            );
            primary.psql("postgres", "SELECT pg_reload_conf()");
        }
    }
    // No primary: nothing is forwarded, a new payment is refused with 503.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = upstream.executions();
    let refused = client_for(proxy.addr)
        .post("/payments", "shop-1", "during-the-outage", BODY)
        .await;
    assert_eq!(refused.status, 503, "{failure:?}: {refused:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        upstream.executions(),
        before,
        "{failure:?}: forwarded while no primary was reachable"
    );

    standby.promote();
    let promoted_at = Instant::now();
    let back = settle(
        &client_for(proxy.addr),
        "after-the-promotion",
        Instant::now() + Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        back.status,
        201,
        "{failure:?}: {back:?}\n{}",
        proxy.log_text()
    );
    let recovery = promoted_at.elapsed();
    assert!(
        recovery < Duration::from_secs(10),
        "{failure:?}: service back only after {recovery:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }

    let settled = settled.lock().unwrap().clone();
    let client = client_for(proxy.addr);
    let mut charge_of: HashMap<String, serde_json::Value> = HashMap::new();
    for (key, reply, at) in &settled {
        assert_eq!(reply.status, 201, "{failure:?}: {key} ended as {reply:?}");
        let charge = reply.json()["charge_id"].clone();
        charge_of.insert(key.clone(), charge.clone());
        if *at < failed_at {
            // Answered before the primary died: replayed from the promoted standby.
            let again = client.post("/payments", "shop-1", key, BODY).await;
            assert!(again.replayed(), "{failure:?}: {key} lost: {again:?}");
            assert_eq!(again.json()["charge_id"], charge, "{failure:?}: {key}");
        }
    }
    // One charge per key: every key's answer names a charge of its own.
    let mut charges: Vec<String> = charge_of.values().map(ToString::to_string).collect();
    charges.sort();
    charges.dedup();
    assert_eq!(
        charges.len(),
        charge_of.len(),
        "{failure:?}: a charge answered two keys"
    );
    assert_eq!(
        upstream.charges(),
        charge_of.len() + 1,
        "{failure:?}: charges beyond one per key (keys and the probe after the promotion)"
    );
    assert!(
        settled.iter().any(|(_, _, at)| *at > promoted_at),
        "{failure:?}: no payment settled after the promotion"
    );
    eprintln!(
        "{failure:?}: {} payments, service back {recovery:?} after the promotion",
        settled.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_stopped_hard_then_standby_promoted() {
    failover(Failure::StoppedHard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_vanished_without_a_reset_then_standby_promoted() {
    failover(Failure::Vanished).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_turned_read_only_then_standby_promoted() {
    failover(Failure::ReadOnly).await;
}
