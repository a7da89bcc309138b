//! The PostgreSQL store through a real PgBouncer in `pool_mode = transaction`, with fewer
//! server connections than clients (two, shared by two replicas' pools of eight), so that
//! consecutive statements of one client run on different server connections — the
//! deployment where named prepared statements and session state break.

use crate::support;

use std::time::Duration;

use support::cluster::{Cluster, PgBouncer};
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

fn cluster_with_db() -> Cluster {
    let cluster = Cluster::start_new("bouncer", "", "host all all 127.0.0.1/32 trust\n");
    cluster.psql("postgres", "CREATE DATABASE pay");
    cluster
}

/// The usual payments configuration on `store`, the payments route with `route_extra`.
fn yaml(store: &str, route_extra: &str) -> String {
    PAYMENTS.replace("{store}", store).replace(
        "    require_key: true\n",
        &format!("    require_key: true\n{route_extra}"),
    )
}

fn store(url: &str, extra: &str) -> String {
    format!("store:\n  postgres:\n    url: \"{url}\"\n    timeout: 3s\n    pool_size: 8\n{extra}")
}

/// Migrating through the pooler works (one transaction, no named statements).
async fn migrate_through(url: &str) {
    migrate_store(&store(url, "")).await;
}

/// Ten concurrent duplicates of each of twenty keys, spread over two replicas behind one
/// pooler: every request is answered (201 or 409, never a store error), each key executes
/// once, and every retry afterwards is a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_through_a_transaction_pooler_execute_once() {
    let cluster = cluster_with_db();
    let bouncer = PgBouncer::start(&cluster, "pay", 2);
    migrate_through(&bouncer.url("pay")).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let dummy = Backend::embedded();
    let config = yaml(&store(&bouncer.url("pay"), ""), "");
    let replicas = [
        TestProxy::spawn(&config, &upstream, &dummy).await,
        TestProxy::spawn(&config, &upstream, &dummy).await,
    ];
    let clients: Vec<TestClient> = replicas.iter().map(TestClient::new).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for key in 0..20 {
        for dup in 0..10 {
            let client = clients[dup % 2].clone();
            tasks.spawn(async move {
                client
                    .post("/payments", "shop-1", &format!("k{key}"), BODY)
                    .await
                    .status
                    .as_u16()
            });
        }
    }
    let statuses = tasks.join_all().await;
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}\n{}",
        bouncer.log()
    );
    assert_eq!(upstream.executions(), 20);
    for key in 0..20 {
        let reply = clients[key % 2]
            .post_until_settled("/payments", "shop-1", &format!("k{key}"), BODY)
            .await;
        assert!(reply.replayed(), "k{key}: {reply:?}");
    }
    assert_eq!(upstream.executions(), 20);
    // Evictions are announced by NOTIFY, which does not pass a transaction pooler: with no
    // `listen_url`, the replay cache stays unused, and every replay asks the store.
    for key in 0..20 {
        let reply = clients[key % 2]
            .post("/payments", "shop-1", &format!("k{key}"), BODY)
            .await;
        assert!(reply.replayed(), "k{key}: {reply:?}");
    }
    for proxy in &replicas {
        assert_eq!(cache_hits(proxy).await, 0);
    }
    assert_eq!(
        cluster
            .psql(
                "pay",
                "SELECT count(*) FROM idempotency_keys WHERE status = 'done'"
            )
            .trim(),
        "20"
    );
    for proxy in replicas {
        proxy.stop().await;
    }
}

/// Wait mode behind the pooler: `LISTEN` goes to `listen_url`, straight to PostgreSQL, so
/// the duplicates waiting on one replica are woken by a completion through the pooler
/// and all get the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_through_a_pooler_delivers_the_first_answer() {
    let cluster = cluster_with_db();
    let bouncer = PgBouncer::start(&cluster, "pay", 2);
    migrate_through(&bouncer.url("pay")).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    let dummy = Backend::embedded();
    let direct = cluster.url("postgres", "pay", "");
    let config = yaml(
        &store(
            &bouncer.url("pay"),
            &format!("    listen_url: \"{direct}\"\n"),
        ),
        "    on_conflict: { wait: 8s }\n",
    );
    let proxy = TestProxy::spawn(&config, &upstream, &dummy).await;
    let client = TestClient::new(&proxy);
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "w", BODY).await })
    };
    upstream.wait_executions(1).await;
    let started = std::time::Instant::now();
    let waiting: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.post("/payments", "shop-1", "w", BODY).await })
        })
        .collect();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    for reply in waiting {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 201, "{reply:?}");
        assert_eq!(reply.body, first.body, "the first answer");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the notification, not after the wait bound"
    );
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Behind the pooler too, a statement the proxy gave up on ends on the server (each
/// statement carries its own `SET LOCAL statement_timeout`: the pooler refuses the
/// start-up option and would leak a session `SET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_given_up_on_end_on_the_server_behind_the_pooler() {
    let cluster = cluster_with_db();
    let bouncer = PgBouncer::start(&cluster, "pay", 2);
    migrate_through(&bouncer.url("pay")).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    let config = yaml(&store(&bouncer.url("pay"), ""), "");
    let proxy = TestProxy::spawn(&config, &upstream, &dummy).await;
    let (mut locker, connection) =
        tokio_postgres::connect(&cluster.url("postgres", "pay", ""), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "blocked", BODY)
        .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    let blocked = || {
        cluster.psql(
            "pay",
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idempotency_reserve%'",
        )
    };
    let ended = eventually(Duration::from_secs(30), || async {
        (blocked().trim() == "0").then_some(())
    })
    .await;
    assert!(ended.is_some(), "the reservation still waits on the server");
    assert_eq!(upstream.executions(), 0);
    lock.rollback().await.unwrap();
    proxy.stop().await;
}
