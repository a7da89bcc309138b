//! The key table on Citus under faults, through the proxy binary: a worker stopped under
//! load, the coordinator restarted, shards moved onto a new worker under load. Each test
//! runs a cluster of its own (`tests/citus`), a provider that counts what it executes, and
//! clients that retry; "exactly once" is the assertion.

use std::sync::Arc;
use std::time::Duration;

use crate::support::citus::Citus;
use crate::support::*;

const BODY: &str = PAYMENT_BODY;

/// A cluster, a schema on it with the key table distributed, a counting provider and a
/// proxy process on the coordinator.
async fn setup() -> (Arc<Citus>, Backend, Upstream, ProxyProcess) {
    let cluster = Arc::new(Citus::start());
    let db = Backend::Postgres(TestDb::on_citus(Arc::clone(&cluster)).await);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    (cluster, db, upstream, proxy)
}

/// Two client ids whose keys live on different workers: (on `worker1`, on `worker2`).
async fn clients_apart(db: &Backend, cluster: &Citus) -> (String, String) {
    let client = db.client().await;
    let mut found: [Option<String>; 2] = [None, None];
    for i in 0.. {
        let id = format!("shop-{i}");
        let row = client
            .query_one(
                "SELECT nodeport FROM citus_shards \
                 WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)",
                &[&id],
            )
            .await
            .unwrap();
        let port: i32 = row.get(0);
        for (slot, node) in found.iter_mut().zip(["worker1", "worker2"]) {
            if slot.is_none() && i64::from(port) == i64::from(cluster.port(node)) {
                *slot = Some(id.clone());
            }
        }
        if let [Some(a), Some(b)] = &found {
            return (a.clone(), b.clone());
        }
    }
    unreachable!()
}

/// A worker stopped under load: keys whose shard is on the other worker keep being served
/// (new ones executed once, old ones replayed), keys on the stopped one fail closed with a
/// 503 and nothing forwarded, on a pool the proxy keeps (the coordinator's connection
/// errors are about its own connections, not the proxy's); once the worker is back, their
/// retries execute once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_fails_only_its_keys_closed() {
    let (cluster, db, upstream, proxy) = setup().await;
    let (down, up) = clients_apart(&db, &cluster).await;
    let client = client_for(proxy.addr);
    for owner in [&down, &up] {
        for i in 0..5 {
            let reply = client
                .post("/payments", owner, &format!("before-{i}"), BODY)
                .await;
            assert_eq!(reply.status, 201, "{reply:?}");
        }
    }
    assert_eq!(upstream.executions(), 10);

    cluster.node("stop-node", "worker1");
    let mut refused = 0;
    for round in 0..10 {
        let reply = client
            .post("/payments", &down, &format!("during-{round}"), BODY)
            .await;
        assert_eq!(reply.status, 503, "{reply:?}");
        assert!(reply.is_problem(), "{reply:?}");
        refused += 1;
        let served = client
            .post("/payments", &up, &format!("during-{round}"), BODY)
            .await;
        assert_eq!(served.status, 201, "{served:?}");
        let replayed = client
            .post("/payments", &up, &format!("before-{}", round % 5), BODY)
            .await;
        assert_eq!(replayed.status, 201, "{replayed:?}");
        assert!(replayed.replayed(), "{replayed:?}");
    }
    assert_eq!(refused, 10);
    assert_eq!(
        upstream.executions(),
        20,
        "the live worker's 10 new keys executed; nothing forwarded for the stopped one's"
    );
    assert!(
        !proxy.log_text().contains("idle connections dropped"),
        "the proxy threw its coordinator connections away over a worker's outage:\n{}",
        proxy.log_text()
    );

    cluster.node("start-node", "worker1");
    for round in 0..10 {
        let key = format!("during-{round}");
        let reply = eventually(Duration::from_secs(30), || async {
            let reply = client.post("/payments", &down, &key, BODY).await;
            (reply.status == 201).then_some(reply)
        })
        .await
        .expect("the stopped worker's keys are served again once it is back");
        assert!(!reply.replayed(), "{reply:?}");
    }
    for round in 0..10 {
        let again = client
            .post("/payments", &down, &format!("during-{round}"), BODY)
            .await;
        assert!(again.replayed(), "{again:?}");
    }
    assert_eq!(upstream.executions(), 30, "each key executed once");
}

/// The coordinator restarted: requests meanwhile fail closed (503, nothing forwarded),
/// service comes back by itself, and what was answered before still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_restart_loses_nothing() {
    let (cluster, _db, upstream, proxy) = setup().await;
    let client = client_for(proxy.addr);
    for i in 0..10 {
        let reply = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    cluster.node("stop-node", "coordinator");
    let reply = client.post("/payments", "shop-1", "meanwhile", BODY).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    cluster.node("start-node", "coordinator");
    let reply = eventually(Duration::from_secs(30), || async {
        let reply = client.post("/payments", "shop-1", "meanwhile", BODY).await;
        (reply.status == 201).then_some(reply)
    })
    .await
    .expect("served again after the coordinator's restart");
    assert!(!reply.replayed());
    for i in 0..10 {
        let again = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert!(again.replayed(), "{again:?}");
    }
    assert_eq!(upstream.executions(), 11);
}

/// A third worker added and the shards rebalanced onto it while clients keep sending new
/// keys and retrying old ones: no key lost, none executed twice, every earlier answer
/// still replays — also from the shards that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_rebalanced_under_load_lose_nothing() {
    let (cluster, db, upstream, proxy) = setup().await;
    let client = client_for(proxy.addr);
    let owners: Vec<String> = (0..16).map(|i| format!("shop-{i}")).collect();
    for owner in &owners {
        let reply = client.post("/payments", owner, "before", BODY).await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    cluster.node("add-worker", "worker3");
    // Retrying clients, a new key per owner per round, until the rebalance is over.
    let moving = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let (client, owners, moving) = (client.clone(), owners.clone(), Arc::clone(&moving));
        tokio::spawn(async move {
            let mut rounds = 0;
            while moving.load(std::sync::atomic::Ordering::Relaxed) || rounds < 5 {
                for owner in &owners {
                    let key = format!("during-{rounds}");
                    // A 409 or 503 while a shard moves is retried, as a client would.
                    let reply = eventually(Duration::from_secs(60), || async {
                        let reply = client.post("/payments", owner, &key, BODY).await;
                        (reply.status == 201).then_some(reply)
                    })
                    .await
                    .unwrap_or_else(|| panic!("{owner}/{key} was never served"));
                    assert_eq!(reply.status, 201);
                }
                rounds += 1;
            }
            rounds
        })
    };
    // Each in a transaction of its own: the rebalance's job runs once its start commits.
    let coordinator = db.client().await;
    coordinator
        .batch_execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
        .await
        .unwrap();
    coordinator
        .batch_execute("SELECT citus_rebalance_wait()")
        .await
        .unwrap();
    moving.store(false, std::sync::atomic::Ordering::Relaxed);
    let moved: i64 = coordinator
        .query_one(
            &format!(
                "SELECT count(*) FROM citus_shards WHERE table_name = 'idempotency_keys'::regclass \
                 AND nodeport = {}",
                cluster.port("worker3")
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        moved > 0,
        "the rebalance moved no shard onto the new worker"
    );
    let rounds = load.await.unwrap();
    for owner in &owners {
        let again = client.post("/payments", owner, "before", BODY).await;
        assert!(again.replayed(), "{again:?}");
        for round in 0..rounds {
            let again = client
                .post("/payments", owner, &format!("during-{round}"), BODY)
                .await;
            assert!(again.replayed(), "{owner} during-{round}: {again:?}");
        }
    }
    // New keys after the move, reserved where their shards now are (worker3 among them):
    // a lease token never repeats, whichever node handed it out (each node's sequence has
    // a range of its own), so no two rows of the table carry the same one.
    for owner in &owners {
        let reply = client.post("/payments", owner, "after", BODY).await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    let (tokens, distinct): (i64, i64) = {
        let row = coordinator
            .query_one(
                "SELECT count(*), count(DISTINCT lease_token) FROM idempotency_keys",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(tokens, distinct, "a lease token was handed out twice");
    assert_eq!(
        upstream.executions(),
        owners.len() * (2 + rounds),
        "every key executed exactly once"
    );
}

/// Every migration after 0011 (which changes `client_id`'s collation, refused on a
/// distribution column) applies to a table already distributed — the ones of today and
/// every one added later: for each version from 0011 on, a schema migrated that far, then
/// distributed, then migrated to the end, is the schema a fresh `idemproxy migrate`
/// lays out, and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_migrations_apply_to_a_distributed_table() {
    use idemproxy::store::{KeyStore, MIGRATIONS, Reservation, migrate};
    let fresh = TestDb::citus().await;
    let want = crate::schema::shape(&fresh).await;
    let from = MIGRATIONS.iter().position(|m| m.version == 11).unwrap();
    for (at, m) in MIGRATIONS
        .iter()
        .enumerate()
        .take(MIGRATIONS.len() - 1)
        .skip(from)
    {
        let db = migrated_by_hand(at).await;
        db.client()
            .await
            .batch_execute("SELECT create_distributed_table('idempotency_keys', 'client_id')")
            .await
            .unwrap();
        let store = db.store();
        let mut conn = store.pool().get().await.unwrap();
        let applied = migrate(&mut conn).await.unwrap();
        drop(conn);
        assert_eq!(applied.len(), MIGRATIONS.len() - 1 - at);
        let version = m.version;
        assert_eq!(
            crate::schema::shape(&db).await,
            want,
            "distributed at version {version}"
        );
        let req = a_request("k");
        assert!(matches!(
            store.reserve(&req).await.unwrap(),
            Reservation::Reserved(_)
        ));
    }
}

/// A single-node table that already holds keys is distributed by `idemproxy migrate`
/// while it keeps its keys (`create_distributed_table_concurrently`): every stored answer
/// replays afterwards, and a second migrate changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_distributes_a_table_that_holds_keys() {
    use idemproxy::store::{MIGRATIONS, migrate};
    // As an idemproxy that did not distribute its table left it on a Citus coordinator.
    let db = migrated_by_hand(MIGRATIONS.len() - 1).await;
    let client = db.client().await;
    let distributed = || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_dist_partition \
                 WHERE logicalrelid = 'idempotency_keys'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(distributed().await, 0);
    let backend = Backend::Postgres(db);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &backend).await;
    let http = TestClient::new(&proxy);
    for i in 0..20 {
        let reply = http
            .post("/payments", &format!("shop-{i}"), "k", BODY)
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    proxy.stop().await;
    let store = backend.pg().store();
    let mut conn = store.pool().get().await.unwrap();
    migrate(&mut conn).await.unwrap();
    assert_eq!(distributed().await, 1);
    migrate(&mut conn).await.unwrap();
    drop(conn);
    assert_eq!(backend.rows().await, 20);
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &backend).await;
    let http = TestClient::new(&proxy);
    for i in 0..20 {
        let again = http
            .post("/payments", &format!("shop-{i}"), "k", BODY)
            .await;
        assert!(again.replayed(), "{again:?}");
    }
    assert_eq!(upstream.executions(), 20);
    proxy.stop().await;
}

/// A schema on the shared Citus cluster with the migrations up to `MIGRATIONS[at]`
/// applied statement by statement, as the versions of idemproxy before this one did:
/// nothing distributed.
async fn migrated_by_hand(at: usize) -> TestDb {
    let db = TestDb::citus_empty().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE idemproxy_migrations (version integer PRIMARY KEY, \
             name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    for m in &idemproxy::store::MIGRATIONS[..=at] {
        client.batch_execute(m.sql).await.unwrap();
        client
            .execute(
                "INSERT INTO idemproxy_migrations (version, name) VALUES ($1, $2)",
                &[&m.version, &m.name],
            )
            .await
            .unwrap();
    }
    db
}

/// A reservation of `key` for client `c`.
fn a_request(key: &str) -> idemproxy::store::ReserveRequest<'_> {
    idemproxy::store::ReserveRequest {
        client_id: "c",
        key,
        fingerprint: &[7; 32],
        route: "create-payment",
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    }
}

/// A table distributed while a proxy runs: the proxy's next batch is refused by Citus,
/// worked around one write at a time (each write still answered), counted, and the
/// layout looked up again — the batches after it go as distributed writes, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_distributed_under_a_running_store_is_noticed() {
    use idemproxy::store::{
        Completion, Fence, Fenced, Health, KeyStore, MIGRATIONS, Reservation, Reserve,
        StoredResponse, Write, WriteBatch, Written,
    };
    let db = migrated_by_hand(MIGRATIONS.len() - 1).await;
    let store = db.store();
    let reserve = |key: &str| {
        Write::Reserve(Reserve {
            client_id: format!("shop-{key}"),
            key: key.into(),
            fingerprint: [7; 32],
            route: "create-payment".into(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            takeover: true,
            derived_key: None,
        })
    };
    let batch_of = |keys: &[&str]| keys.iter().map(|k| reserve(k)).collect::<Vec<_>>();
    let fallbacks =
        |store: &idemproxy::store::PgStore| store.pool_status().unwrap().batch_fallbacks;
    // On one node: batches are batches.
    for answer in store.write_batch(batch_of(&["a", "b"])).await {
        assert!(matches!(
            answer,
            Ok(Written::Reservation(Reservation::Reserved(_), _))
        ));
    }
    assert_eq!(fallbacks(&store), 0);
    db.client()
        .await
        .batch_execute(
            "SELECT create_distributed_table_concurrently('idempotency_keys', 'client_id')",
        )
        .await
        .unwrap();
    // The next batch: refused, each write still answered, counted.
    let answers = store.write_batch(batch_of(&["c", "d"])).await;
    let leases: Vec<_> = answers
        .into_iter()
        .map(|a| match a {
            Ok(Written::Reservation(Reservation::Reserved(lease), _)) => lease,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(fallbacks(&store), 1, "the refused batch is counted");
    // From then on the store knows the table is distributed: no more refusals, and a
    // completion wakes and applies as on any distributed table.
    for answer in store.write_batch(batch_of(&["e", "f"])).await {
        assert!(matches!(
            answer,
            Ok(Written::Reservation(Reservation::Reserved(_), _))
        ));
    }
    let done = Completion::Stored(StoredResponse::clear(201, Default::default(), "x".into()));
    let fence = Fence {
        client_id: "shop-c".into(),
        key: "c".into(),
        token: leases[0].token,
        notify: true,
        retention: Duration::from_secs(3600),
    };
    assert_eq!(
        store.complete(&fence, &done).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        fallbacks(&store),
        1,
        "no batch refused after the layout was looked up again"
    );
    assert_eq!(db.rows().await, 6);
}
