//! A throwaway PostgreSQL whose disk fills up under the proxy: its data files' volume
//! (the key table in a tablespace on a small tmpfs: the server stays up, `53100`), and its
//! WAL's volume (the server PANICs and stays down until restarted). Upstream executions
//! are counted: answers the proxy holds are never executed again.

use crate::support;

use std::time::Duration;

use support::cluster::{Cluster, give_to_server};
use support::volume::Volume;
use support::*;

const BODY: &str = PAYMENT_BODY;
const KEYS: usize = 6;

/// The proxy in front of `cluster`'s database `idem`, migrated, with a 3 s lease.
async fn proxy_on(cluster: &Cluster, upstream: &Upstream) -> TestProxy {
    cluster.psql("postgres", "CREATE DATABASE idem");
    let store = pg_store_yaml(&cluster.url("postgres", "idem", ""));
    migrate_store(&store).await;
    let yaml = PAYMENTS
        .replace("{store}", &store)
        .replace("  lease: 30s\n", "  lease: 3s\n");
    TestProxy::spawn(&yaml, upstream, &Backend::embedded()).await
}

/// Keys in `idem` stored as done.
fn done(cluster: &Cluster) -> usize {
    cluster
        .psql(
            "idem",
            "SELECT count(*) FROM idempotency_keys WHERE status = 'done' AND key LIKE 'k%'",
        )
        .trim()
        .parse()
        .unwrap()
}

/// Each key's retry replays one of the first answers.
async fn assert_replays(client: &TestClient, first: &[Reply], when: &str) {
    let bodies: Vec<_> = first.iter().map(|r| r.body.clone()).collect();
    for i in 0..first.len() {
        let retry = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(
            retry.status,
            201,
            "{when}: k{i}: {}",
            String::from_utf8_lossy(&retry.body)
        );
        assert!(retry.replayed(), "{when}: k{i} is a replay");
        assert!(bodies.contains(&retry.body), "{when}: k{i}: a first answer");
    }
}

/// Six slow payments in flight, then `break_store`: the clients get their answers.
async fn payments_in_flight(
    client: &TestClient,
    upstream: &Upstream,
    break_store: impl FnOnce(),
) -> Vec<Reply> {
    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .post_each_key_at_once(KEYS, "/payments", "shop-1", "k", BODY)
                .await
        })
    };
    upstream.wait_executions(KEYS + 1).await;
    break_store();
    let first = first.await.unwrap();
    for reply in &first {
        assert_eq!(reply.status, 201, "the clients get the upstream's answers");
    }
    first
}

/// The key table's volume fills up: completions fail with `53100`, the server stays up.
/// The answers are held and replayed, readiness and the metric say the disk is full, and
/// once space returns the answers are written — nothing executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_data_volume_full() {
    let Some(volume) = Volume::mount("4m") else {
        return;
    };
    give_to_server(&volume.join(""));
    let cluster = Cluster::start_new("data-full", "", "host all all 127.0.0.1/32 trust\n");
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(800),
        pad_to: 200 * 1024,
        ..Default::default()
    })
    .await;
    let proxy = proxy_on(&cluster, &upstream).await;
    let tablespace = volume.join("ts");
    std::fs::create_dir(&tablespace).unwrap();
    give_to_server(&tablespace);
    cluster.psql(
        "idem",
        &format!(
            "CREATE TABLESPACE small LOCATION '{}'",
            tablespace.display()
        ),
    );
    cluster.psql(
        "idem",
        "ALTER TABLE idempotency_keys SET TABLESPACE small; \
         DO $$ DECLARE r record; BEGIN \
           FOR r IN SELECT indexname FROM pg_indexes WHERE tablename = 'idempotency_keys' LOOP \
             EXECUTE format('ALTER INDEX %I SET TABLESPACE small', r.indexname); \
           END LOOP; END $$",
    );
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "w", BODY).await.status,
        201
    );

    let first = payments_in_flight(&client, &upstream, || volume.fill()).await;
    assert_replays(&client, &first, "disk full").await;
    let fault = eventually(Duration::from_secs(10), || async {
        (metric(proxy.admin, "idemproxy_store_fault{kind=\"disk_full\"}").await == 1.0)
            .then_some(())
    })
    .await;
    assert!(fault.is_some(), "the disk-full fault is in the metrics");
    let ready = TestClient::at(proxy.admin)
        .send("GET", "/readyz", &[], "")
        .await;
    assert_eq!(ready.status, 503, "not ready: {}", ready.detail());
    assert!(ready.detail().contains("53100"), "{}", ready.detail());

    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_replays(&client, &first, "disk full, leases run out").await;
    volume.free();
    assert_replays(&client, &first, "space back").await;
    let written = eventually(Duration::from_secs(20), || async {
        (done(&cluster) == KEYS).then_some(())
    })
    .await;
    assert!(written.is_some(), "the held answers were written");
    assert_replays(&client, &first, "written").await;
    assert_eq!(upstream.executions(), KEYS + 1, "nothing executed twice");
    assert_eq!(
        client
            .post("/payments", "shop-1", "after", BODY)
            .await
            .status,
        201
    );
    proxy.stop().await;
}

/// The WAL's volume fills up: the server PANICs and stays down. The answers of the
/// payments in flight are held and replayed while it is down; once space returns and the
/// server is restarted they are written, and nothing was executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wal_volume_full() {
    let Some(volume) = Volume::mount("48m") else {
        return;
    };
    let cluster = Cluster::init(
        "wal-full",
        "min_wal_size = 32MB\nmax_wal_size = 32MB\nrestart_after_crash = off\n",
        "host all all 127.0.0.1/32 trust\n",
    );
    let wal = volume.join("wal");
    std::fs::create_dir(&wal).unwrap();
    cluster.move_wal_to(&wal);
    cluster.start();
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let proxy = proxy_on(&cluster, &upstream).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "w", BODY).await.status,
        201
    );

    let first = payments_in_flight(&client, &upstream, || {
        volume.fill();
        // A new WAL segment must be made: there is no room for it.
        let said = cluster.psql_unchecked("idem", "SELECT pg_switch_wal(); CHECKPOINT");
        let down = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            cluster.log().contains("PANIC")
        });
        assert!(down, "the server PANICs: {said}\n{}", cluster.log());
    })
    .await;
    assert_replays(&client, &first, "server down").await;
    let refused = client.post("/payments", "shop-1", "new", BODY).await;
    assert_eq!(refused.status, 503, "a new key while the server is down");
    assert_eq!(upstream.executions(), KEYS + 1, "nothing forwarded");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_replays(&client, &first, "server down, leases run out").await;

    volume.free();
    cluster.stop_if_running();
    cluster.start();
    assert_replays(&client, &first, "server back").await;
    let written = eventually(Duration::from_secs(20), || async {
        (done(&cluster) == KEYS).then_some(())
    })
    .await;
    assert!(written.is_some(), "the held answers were written");
    assert_replays(&client, &first, "written").await;
    assert_eq!(upstream.executions(), KEYS + 1, "nothing executed twice");
    let fresh = client
        .post_until_settled("/payments", "shop-1", "new", BODY)
        .await;
    assert_eq!(fresh.status, 201, "new keys work again");
    proxy.stop().await;
}
