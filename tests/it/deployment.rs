//! What a deploy can get wrong, and how the proxy says so instead of serving wrongly: an
//! un-migrated schema, a store the environment overrides, two processes on one embedded
//! file, a stop signal (readiness, the grace period, a second signal). And the tests'
//! own manners on the shared database.

use crate::support;

use std::time::Duration;

use idemproxy::store::SettleKeyForm;
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Runs the binary with `args` (a config file written from `yaml` is passed with
/// `--config`) and `env`, expecting it to exit by itself within 20 s.
async fn run_to_exit(yaml: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let dir = TempDir::new("deploy");
    let config = dir.join("config.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"));
    command
        .args(args)
        .arg("--config")
        .arg(&config)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .expect("the process should have exited by itself")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits up to 20 s for a child process to exit.
async fn exit_status(proxy: &mut ProxyProcess) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(20), proxy.child.wait())
        .await
        .expect("the process should have exited")
        .unwrap()
}

fn serve_yaml(db: &Backend, upstream: &Upstream, listen_port: u16) -> String {
    format!(
        "listen: 127.0.0.1:{listen_port}\nadmin_listen: 127.0.0.1:{}\n{}",
        free_port(),
        PAYMENTS
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url())
    )
}

/// On a PostgreSQL schema that was never migrated, `serve` refuses to start and says to
/// run `idemproxy migrate`; with `--migrate` it migrates and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmigrated_postgres_is_refused_at_start() {
    let db = Backend::Postgres(TestDb::empty().await);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let (ok, stderr) = run_to_exit(&serve_yaml(&db, &upstream, free_port()), &["serve"], &[]).await;
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("idemproxy migrate") && stderr.contains("version 0"),
        "{stderr}"
    );

    let proxy = ProxyProcess::spawn_with(PAYMENTS, &upstream, &db, &["--migrate"]).await;
    let reply = client_for(proxy.addr)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 201, "{}", proxy.log_text());
}

/// A schema older than the binary needs (a migration not yet applied) is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_refused_at_start() {
    let db = Backend::postgres().await;
    let latest = idemproxy::store::MIGRATIONS.last().unwrap().version;
    db.client()
        .await
        .execute(
            "DELETE FROM idemproxy_migrations WHERE version = $1",
            &[&latest],
        )
        .await
        .unwrap();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let (ok, stderr) = run_to_exit(&serve_yaml(&db, &upstream, free_port()), &["serve"], &[]).await;
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&format!("version {}", latest - 1))
            && stderr.contains(&format!("needs version {latest}"))
            && stderr.contains("idemproxy migrate"),
        "{stderr}"
    );
}

/// A store that answers with errors (here: no schema) is not "unreachable": clients get
/// a `store-failed` problem, and readiness says the schema is not migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_are_not_called_unreachable() {
    let db = Backend::Postgres(TestDb::empty().await);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("store-failed"),
        "{reply:?}"
    );
    assert!(!reply.detail().contains("cannot be reached"), "{reply:?}");
    assert_eq!(upstream.executions(), 0, "fail closed");

    let ready = TestClient::at(proxy.admin)
        .send("GET", "/readyz", &[], "")
        .await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("store-not-migrated"),
        "{ready:?}"
    );
    assert!(ready.detail().contains("idemproxy migrate"), "{ready:?}");
    proxy.stop().await;
}

/// A file that chooses the embedded store and an environment that names PostgreSQL is a
/// deploy slip: refused at start and by `check-config`, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_url_does_not_replace_an_embedded_store() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = serve_yaml(&db, &upstream, free_port());
    let env = [(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    )];
    for command in ["serve", "check-config"] {
        let (ok, stderr) = run_to_exit(&yaml, &[command], &env).await;
        assert!(!ok, "{command}: {stderr}");
        assert!(
            stderr.contains("store.embedded") && stderr.contains("DATABASE_URL"),
            "{command}: {stderr}"
        );
    }
    assert!(
        !matches!(&db, Backend::Embedded(path) if path.exists()),
        "no store was opened"
    );
}

/// The start-up log names the store: for PostgreSQL the host and database, never the
/// password; for the embedded store its absolute path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_log_names_the_store() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    // The test server trusts every connection, so a password is accepted and ignored.
    let url = db
        .pg()
        .url
        .replacen("postgres://postgres@", "postgres://postgres:hunter2@", 1);
    let yaml = PAYMENTS.replace("{store}", &pg_store_yaml(&url));
    let proxy = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let log = proxy.log_text();
    assert!(log.contains("host=127.0.0.1:5432"), "{log}");
    assert!(log.contains(&format!("dbname={}", test_db())), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
    drop(proxy);

    let db = Backend::embedded();
    let proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let Backend::Embedded(path) = &db else {
        unreachable!()
    };
    let log = proxy.log_text();
    assert!(path.is_absolute());
    assert!(log.contains(&path.display().to_string()), "{log}");
}

/// One process per embedded file: a second `serve` on it is refused, saying why, and so
/// is `sweep` while it serves; once the first is gone, both work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_per_embedded_file() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let mut first = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let yaml = serve_yaml(&db, &upstream, free_port());
    let (ok, stderr) = run_to_exit(&yaml, &["serve"], &[]).await;
    assert!(!ok);
    assert!(
        stderr.contains("in use by another idemproxy process"),
        "{stderr}"
    );
    let (ok, stderr) = run_to_exit(&yaml, &["sweep"], &[]).await;
    assert!(!ok);
    assert!(
        stderr.contains("in use by another idemproxy process"),
        "{stderr}"
    );
    let reply = client_for(first.addr)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 201, "the first one still serves");

    first.kill().await;
    let (ok, stderr) = run_to_exit(&yaml, &["sweep"], &[]).await;
    assert!(ok, "{stderr}");
    let second = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let replay = client_for(second.addr)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert!(replay.replayed(), "the key survived in the file");
}

/// `sweep` on a path where no store exists fails and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_never_creates_a_store() {
    let dir = TempDir::new("no-store");
    let path = dir.join("missing.db");
    let yaml = format!("store:\n  embedded:\n    path: \"{}\"\n", path.display());
    let (ok, stderr) = run_to_exit(&yaml, &["sweep"], &[]).await;
    assert!(!ok);
    assert!(stderr.contains("there is no embedded store"), "{stderr}");
    assert!(!path.exists(), "an empty store was created");
}

/// SIGTERM: `/readyz` turns not-ready at once while the request in flight still
/// finishes; the process then exits 0.
async fn sigterm_turns_readiness_off_at_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(2000),
        ..Default::default()
    })
    .await;
    let mut proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let admin = client_for(proxy.admin);
    assert_eq!(admin.send("GET", "/readyz", &[], "").await.status, 200);
    let in_flight = {
        let client = client_for(proxy.addr);
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    upstream.wait_executions(1).await;
    proxy.terminate();
    let not_ready = eventually(Duration::from_millis(500), || async {
        let reply = admin.try_send("GET", "/readyz", &[], "").await.ok()?;
        (reply.status == 503).then_some(reply)
    })
    .await
    .expect("readiness turned false while the request was still in flight");
    assert!(
        not_ready.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("shutting-down")
    );
    assert_eq!(upstream.finished(), 0, "the request was still in flight");
    assert_eq!(in_flight.await.unwrap().status, 201);
    assert!(
        exit_status(&mut proxy).await.success(),
        "{}",
        proxy.log_text()
    );
}

/// A payment the upstream is working on (its connection may be cut by the test).
async fn payment_in_flight(
    proxy: &ProxyProcess,
    upstream: &Upstream,
) -> tokio::task::JoinHandle<Result<Reply, String>> {
    let client = client_for(proxy.addr);
    let task = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "k"),
            ("x-client-id", "c"),
            ("content-type", "application/json"),
        ];
        client.try_send("POST", "/payments", &headers, BODY).await
    });
    upstream.wait_executions(1).await;
    task
}

/// A grace period that runs out with work in flight is a failed stop: exit non-zero.
async fn grace_running_out_exits_non_zero(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(8000),
        ..Default::default()
    })
    .await;
    let yaml = format!("shutdown_grace: 1s\n{PAYMENTS}");
    let mut proxy = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let _in_flight = payment_in_flight(&proxy, &upstream).await;
    proxy.terminate();
    let status = exit_status(&mut proxy).await;
    assert!(!status.success(), "{status:?}");
    assert!(
        proxy.log_text().contains("grace period"),
        "{}",
        proxy.log_text()
    );
}

/// A second stop signal during the drain exits at once, and says so.
async fn second_signal_exits_at_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(15_000),
        ..Default::default()
    })
    .await;
    let mut proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let _in_flight = payment_in_flight(&proxy, &upstream).await;
    proxy.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = std::time::Instant::now();
    proxy.terminate();
    let status = exit_status(&mut proxy).await;
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "took {:?}",
        signalled.elapsed()
    );
    assert!(!status.success(), "{status:?}");
    assert!(
        proxy.log_text().contains("second stop signal"),
        "{}",
        proxy.log_text()
    );
}

on_both_stores!(
    sigterm_turns_readiness_off_at_once,
    grace_running_out_exits_non_zero,
    second_signal_exits_at_once,
);

/// A test's schema is dropped when the test is done with it, and test stores keep to
/// small pools: the shared server allows 100 connections to every run together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_schemas_are_dropped_and_pools_small() {
    let db = TestDb::new().await;
    let schema = db.schema.clone();
    assert_eq!(db.store().max_connections(), TEST_POOL_SIZE);
    assert!(pg_store_yaml(&db.url).contains(&format!("pool_size: {TEST_POOL_SIZE}")));
    let other = TestDb::new().await;
    drop(db);
    let count: i64 = other
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "schema {schema} was left behind");
}

/// Migrations only add, so replicas can be rolled after `migrate`: a replica still on the
/// previous release (migrations 1–2), its reservation statement prepared before the
/// migration ran, keeps reserving on the migrated schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_releases_statements_survive_the_migration() {
    let db = TestDb::empty().await;
    let replica = db.client().await;
    let mut migrator = db.client().await;
    for m in &idemproxy::store::MIGRATIONS[..2] {
        replica.batch_execute(m.sql).await.unwrap();
    }
    // Recorded as `migrate` would have, so that it now applies only the rest.
    migrator
        .batch_execute(
            "CREATE TABLE idemproxy_migrations (version integer PRIMARY KEY, name text NOT NULL, \
               applied_at timestamptz NOT NULL DEFAULT now()); \
             INSERT INTO idemproxy_migrations (version, name) VALUES (1, 'a'), (2, 'b')",
        )
        .await
        .unwrap();
    // The previous release's reservation, prepared as it prepares it.
    let reserve = replica
        .prepare(
            "SELECT o_outcome, o_lease_token, o_attempts, o_lease_remaining_ms, \
             o_response_status, o_response_headers, o_response_body, o_replayable \
             FROM idempotency_reserve($1, $2, $3, $4, $5, $6)",
        )
        .await
        .unwrap();
    let outcome = |key: &'static str| {
        let (replica, reserve) = (&replica, &reserve);
        async move {
            let fp: &[u8] = &[1; 32];
            let row = replica
                .query_one(
                    reserve,
                    &[&"client", &key, &fp, &"route", &30_000i64, &86_400_000i64],
                )
                .await
                .unwrap();
            row.get::<_, String>(0)
        }
    };
    assert_eq!(outcome("before").await, "reserved");
    let applied = idemproxy::store::migrate(&mut migrator).await.unwrap();
    let rest: Vec<i32> = idemproxy::store::MIGRATIONS[2..]
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(applied, rest);
    assert_eq!(outcome("after").await, "reserved");
    assert_eq!(outcome("before").await, "in_progress");
}

/// The index build runs `CONCURRENTLY`, outside a transaction, and is safe when several
/// migrators start at once and when an earlier build died half way: an invalid index
/// nobody builds is dropped and built again, and the version is recorded once, only when
/// the index is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_builds_survive_concurrent_migrators_and_a_failed_build() {
    async fn index_valid(client: &tokio_postgres::Client) -> bool {
        client
            .query_one(
                "SELECT indisvalid FROM pg_index \
                 WHERE indexrelid = to_regclass('idempotency_keys_unresolved')",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }
    let db = TestDb::empty().await;
    let (mut a, mut b) = (db.client().await, db.client().await);
    let (ra, rb) = tokio::join!(
        idemproxy::store::migrate(&mut a),
        idemproxy::store::migrate(&mut b)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut all: Vec<i32> = ra.iter().chain(&rb).copied().collect();
    all.sort();
    let every: Vec<i32> = idemproxy::store::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(all, every, "each applied once: {ra:?} {rb:?}");
    assert!(index_valid(&a).await);
    // What a build killed half way leaves: the index present but invalid, the version
    // not recorded.
    a.batch_execute(
        "DELETE FROM idemproxy_migrations WHERE version = 5; \
         UPDATE pg_index SET indisvalid = false \
         WHERE indexrelid = to_regclass('idempotency_keys_unresolved')",
    )
    .await
    .unwrap();
    assert!(!index_valid(&a).await);
    assert_eq!(idemproxy::store::migrate(&mut a).await.unwrap(), [5]);
    assert!(index_valid(&a).await);
    assert!(idemproxy::store::migrate(&mut b).await.unwrap().is_empty());
}

/// An embedded file the previous release wrote (schema version 1) is brought up to date
/// when opened: its keys keep replaying and stay unresolved as they were, and the
/// reconciler's columns start empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_file_of_the_previous_release_is_upgraded() {
    use idemproxy::store::{EmbeddedStore, Inspect, Maintenance};
    let dir = TempDir::new("upgrade");
    let path = dir.0.join("keys.db");
    {
        // The previous release's schema, as it wrote it.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE idempotency_keys (
                 client_id TEXT NOT NULL, key TEXT NOT NULL, route TEXT NOT NULL,
                 fingerprint BLOB NOT NULL,
                 status TEXT NOT NULL CHECK (status IN ('in_progress', 'done')),
                 lease_token INTEGER NOT NULL, locked_until_ms INTEGER,
                 attempts INTEGER NOT NULL DEFAULT 1, response_status INTEGER,
                 response_headers BLOB, response_body BLOB, replayable INTEGER,
                 created_ms INTEGER NOT NULL, completed_ms INTEGER, expires_ms INTEGER NOT NULL,
                 PRIMARY KEY (client_id, key));
             CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_ms);
             CREATE TABLE idempotency_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT INTO idempotency_counters VALUES ('lease_token', 2);
             INSERT INTO idempotency_keys VALUES
               ('c', 'unresolved', 'pay', x'01', 'in_progress', 1, 1000, 1, NULL, NULL, NULL,
                NULL, 500, NULL, 9999999999999),
               ('c', 'done', 'pay', x'01', 'done', 2, NULL, 1, 201, x'', x'7b7d', 1, 500, 600,
                9999999999999);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let store = EmbeddedStore::open(&path, Duration::from_secs(5)).unwrap();
    let row = store.lookup("c", "done").await.unwrap().unwrap();
    assert_eq!(
        (row.state.status(), row.response_status),
        ("done", Some(201))
    );
    assert_eq!(
        row.sealed_with, None,
        "the previous release's answers are in clear"
    );
    assert_eq!(
        store.unresolved_counts().await.unwrap(),
        [("pay".into(), 1)]
    );
    let claims = store
        .claim_unresolved(&["pay"], Duration::from_secs(30), 10)
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(
        (claims[0].record.probes, claims[0].unresolved_since_ms),
        (0, 1000)
    );
    assert_eq!(
        claims[0].record.lease_token, 3,
        "tokens go on from the file's"
    );
    assert_eq!(
        store
            .settle_key_form("hmac-sha256:0011223344556677")
            .await
            .unwrap(),
        idemproxy::store::KeyFormAgreement::Differs {
            stored: "clear".into()
        },
        "the previous release's keys are kept as sent: a proxy hashing them would not find them"
    );
    drop(store);
    let version: i32 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 6);
    // Opened again: nothing to do, nothing lost.
    let store = EmbeddedStore::open(&path, Duration::from_secs(5)).unwrap();
    assert!(store.lookup("c", "unresolved").await.unwrap().is_some());
}

/// A reader that goes away before the output is written (`check-config | head -1`) is no
/// failure: the command exits 0 instead of panicking on the broken pipe.
#[test]
fn check_config_survives_a_closed_stdout() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["check-config", "--upstream", "http://127.0.0.1:3000"])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the child has loaded its configuration.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
