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
    /// Accepts connections and never answers.
    Vanished,
    /// Open connections go silent and new ones are not accepted.
    StoppedAccepting,
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

/// How the proxy names the database servers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Naming {
    /// A two-host URL, primary first, with `target_session_attrs=read-write`.
    TwoHosts,
    /// One name, resolved through a hosts file the proxy alone sees (its own mount
    /// namespace), moved from the old primary's address to the new one's at the promotion,
    /// as a managed database's DNS failover does.
    OneName,
}

/// The name `Naming::OneName` uses.
const NAME: &str = "pg-primary.test";

/// `connect_timeout`: the store's, when set (the store `timeout` is 1 s).
async fn failover(failure: Failure, connect_timeout: Option<Duration>, naming: Naming) {
    let (primary, standby) = sync_pair();
    let hosts_dir = TempDir::new("failover-hosts");
    let hosts_file = hosts_dir.join("hosts");
    let (to_primary, to_standby, url) = match naming {
        Naming::TwoHosts => {
            let to_primary = Relay::spawn(addr(&primary)).await;
            let to_standby = Relay::spawn(addr(&standby)).await;
            let url = format!(
                "postgres://postgres@{},{}/pay?target_session_attrs=read-write",
                to_primary.addr, to_standby.addr
            );
            (to_primary, to_standby, url)
        }
        Naming::OneName => {
            // Two loopback addresses, one port: what the name points at is all that moves.
            let to_primary = Relay::spawn_on("127.0.0.2:0".parse().unwrap(), addr(&primary)).await;
            let port = to_primary.addr.port();
            let to_standby =
                Relay::spawn_on(format!("127.0.0.3:{port}").parse().unwrap(), addr(&standby)).await;
            std::fs::write(&hosts_file, format!("127.0.0.2 {NAME}\n")).unwrap();
            let url =
                format!("postgres://postgres@{NAME}:{port}/pay?target_session_attrs=read-write");
            (to_primary, to_standby, url)
        }
    };
    let section = |url: &str| {
        let mut store =
            format!("store:\n  postgres:\n    url: \"{url}\"\n    timeout: 1s\n    pool_size: 4\n");
        if let Some(ct) = connect_timeout {
            store.push_str(&format!("    connect_timeout: {}ms\n", ct.as_millis()));
        }
        store
    };
    let store = section(&url);
    // Migrated from here, where the name does not resolve: straight to the primary.
    migrate_store(&section(&format!(
        "postgres://postgres@{}/pay",
        addr(&primary)
    )))
    .await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(200),
        dedupe: true,
        ..Default::default()
    })
    .await;
    // `/orders/*` waits for duplicates (`on_conflict: wait`), woken over `LISTEN`.
    let yaml = PAYMENTS
        .replace("{store}", &store)
        .replace("  lease: 30s\n", "  lease: 3s\n")
        .replace(
            "    max_body: 1KiB\n",
            "    max_body: 1KiB\n    on_conflict: { wait: 10s }\n",
        );
    let mount = format!(
        "mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
        hosts_file.display()
    );
    let wrapper: &[&str] = match naming {
        Naming::TwoHosts => &[],
        Naming::OneName => &["unshare", "--mount", "sh", "-c", &mount],
    };
    let proxy =
        ProxyProcess::spawn_wrapped(&yaml, &upstream, &Backend::embedded(), &[], wrapper).await;

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
    // A wait-mode request starts the `LISTEN` connection, on the primary.
    let order = client_for(proxy.addr)
        .post("/orders/before", "shop-1", "order-before", "{}")
        .await;
    assert_eq!(order.status, 201, "{failure:?}: {order:?}");

    let failed_at = Instant::now();
    match failure {
        Failure::StoppedHard => primary.stop_immediate(),
        Failure::Vanished => to_primary.freeze(),
        Failure::StoppedAccepting => to_primary.stop_accepting(),
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
    if naming == Naming::OneName {
        // Rewritten in place: the bind mount shows the same file.
        std::fs::write(&hosts_file, format!("127.0.0.3 {NAME}\n")).unwrap();
    }
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
    // Within two connect timeouts of the promotion (a second's slack for the client's own
    // retry pace and a call that started just before).
    let bound = connect_timeout.unwrap_or(Duration::from_millis(500)) * 2 + Duration::from_secs(1);
    assert!(
        recovery < bound,
        "{failure:?}: service back only after {recovery:?} (bound {bound:?})\n{}",
        proxy.log_text()
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
        charge_of.len() + 2,
        "{failure:?}: charges beyond one per key (keys, the probe after the promotion, the order)"
    );
    // The `LISTEN` connection found the new primary too: duplicates waiting on it are
    // woken by the first one's completion there, and all get its answer.
    let client = client_for(proxy.addr);
    let (first, second) = tokio::join!(
        client.post("/orders/after", "shop-1", "order-after", "{}"),
        client.post("/orders/after", "shop-1", "order-after", "{}"),
    );
    assert_eq!(
        (first.status.as_u16(), second.status.as_u16()),
        (201, 201),
        "{failure:?}: {second:?}"
    );
    assert_eq!(first.body, second.body, "{failure:?}");
    let log = proxy.log_text();
    let standby_shown = match naming {
        Naming::TwoHosts => to_standby.addr.to_string(),
        Naming::OneName => format!(
            "{NAME}:{} ({})",
            to_standby.addr.port(),
            to_standby.addr.ip()
        ),
    };
    assert!(
        log.contains(&format!(
            "store notification connections go to {standby_shown}"
        )) && log.contains(&format!("store pool connections go to {standby_shown}")),
        "{failure:?}: the notification connection never reached the promoted standby\n{log}"
    );
    let ready = TestClient::at(proxy.admin)
        .send("GET", "/readyz", &[], "")
        .await;
    assert_eq!(
        String::from_utf8_lossy(&ready.body),
        format!("ready: store at {standby_shown}\n"),
        "{failure:?}"
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
    failover(Failure::StoppedHard, None, Naming::TwoHosts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_vanished_without_a_reset_then_standby_promoted() {
    failover(Failure::Vanished, None, Naming::TwoHosts).await;
}

/// The operator's settings from the issue: `connect_timeout` equal to the store timeout,
/// so no call lasts long enough to see its own attempt reach the standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_vanished_with_connect_timeout_equal_to_the_timeout() {
    failover(
        Failure::Vanished,
        Some(Duration::from_secs(1)),
        Naming::TwoHosts,
    )
    .await;
}

/// A primary gone from the network (nothing accepts), `connect_timeout` twice the store
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_stopped_accepting_with_connect_timeout_past_the_timeout() {
    failover(
        Failure::StoppedAccepting,
        Some(Duration::from_secs(2)),
        Naming::TwoHosts,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_turned_read_only_then_standby_promoted() {
    failover(Failure::ReadOnly, None, Naming::TwoHosts).await;
}

/// A managed database's failover by DNS: the one name moves from the vanished primary's
/// address to the promoted standby's, and is followed without a restart (the proxy
/// resolves it at every connection attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_moved_to_the_promoted_standby_is_followed() {
    failover(
        Failure::Vanished,
        Some(Duration::from_secs(1)),
        Naming::OneName,
    )
    .await;
}
