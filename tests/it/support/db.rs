//! The databases a test runs on: a fresh PostgreSQL schema or an embedded file per test,
//! cleaned up after it (and after test processes that died before cleaning up).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use idemproxy::config::{Overrides, StoreConfig};
use idemproxy::store::{AnyStore, Inspect, KeyRecord, KeyStore, PgStore, migrate};

/// The server that holds the test databases; `DATABASE_URL` overrides it.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The database the tests make their schemas in: `IDEMPROXY_TEST_DB` (`.ci/run` gives
/// each run its own), else `idemproxy_test`. Never dropped by the tests: another run may
/// be using it.
pub fn test_db() -> String {
    std::env::var("IDEMPROXY_TEST_DB").unwrap_or_else(|_| "idemproxy_test".into())
}

/// Connections each test store may open: tests run many proxies at once on a server
/// that allows 100 connections in all.
pub const TEST_POOL_SIZE: usize = 4;

/// A fresh schema in the test database with the migrations applied; dropped again when
/// this is dropped.
pub struct TestDb {
    pub url: String,
    pub schema: String,
    /// The server and database the schema is in (the shared server's test database, or a
    /// Citus coordinator's `postgres`).
    home: String,
    /// A Citus cluster of this test's own, when no shared one was given.
    _cluster: Option<std::sync::Arc<super::citus::Citus>>,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let schema = self.schema.clone();
        let home = self.home.clone();
        // Drop runs inside the test's runtime, which cannot block on itself: a thread with
        // a runtime of its own does the work, and a lock timeout bounds it.
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(drop_schemas(&home, &[schema]));
        });
        let _ = done.join();
    }
}

/// The shared server's test database.
fn test_db_url() -> String {
    let admin = admin_url();
    let base = admin.split('?').next().unwrap_or(&admin);
    let (prefix, _) = base.rsplit_once('/').expect("database URL has a path");
    format!("{prefix}/{}", test_db())
}

/// Connects to `home`, a database URL.
async fn connect_to(home: &str) -> Option<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(home, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(client)
}

async fn drop_schemas(home: &str, schemas: &[String]) {
    let Some(client) = connect_to(home).await else {
        return;
    };
    let _ = client.batch_execute("SET lock_timeout = '5s'").await;
    for schema in schemas {
        let _ = client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await;
    }
}

/// Drops schemas that test processes no longer running left behind (killed before their
/// `Drop` ran). A schema is named after its process, so a live run's are never touched.
async fn drop_abandoned_schemas(home: &str) {
    let Some(client) = connect_to(home).await else {
        return;
    };
    let Ok(rows) = client
        .query(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 't\\_%\\_%\\_%'",
            &[],
        )
        .await
    else {
        return;
    };
    let abandoned: Vec<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|name| {
            name.split('_')
                .nth(1)
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    drop_schemas(home, &abandoned).await;
}

impl TestDb {
    pub async fn new() -> Self {
        Self::empty().await.migrated().await
    }

    /// A fresh schema on a Citus coordinator, migrated: `idemproxy migrate` distributes the
    /// key table there. On the cluster `IDEMPROXY_CITUS_URL` names (tests/run starts one
    /// for the run), else on a cluster of this test's own.
    pub async fn citus() -> Self {
        Self::citus_empty().await.migrated().await
    }

    /// Like [`TestDb::citus`], without the migrations applied.
    pub async fn citus_empty() -> Self {
        match std::env::var("IDEMPROXY_CITUS_URL") {
            Ok(url) => Self::on_coordinator(url, None).await,
            Err(_) => {
                let cluster = std::sync::Arc::new(super::citus::Citus::start());
                Self::on_coordinator(cluster.url(), Some(cluster)).await
            }
        }
    }

    /// A fresh schema on `cluster`, migrated (a test that stops its nodes has its own).
    pub async fn on_citus(cluster: std::sync::Arc<super::citus::Citus>) -> Self {
        Self::on_coordinator(cluster.url(), Some(cluster))
            .await
            .migrated()
            .await
    }

    async fn on_coordinator(
        home: String,
        cluster: Option<std::sync::Arc<super::citus::Citus>>,
    ) -> Self {
        let schema = Self::new_schema(&home).await;
        let url = with_search_path_in(&home, &schema);
        TestDb {
            url,
            schema,
            home,
            _cluster: cluster,
        }
    }

    async fn migrated(self) -> Self {
        let store = self.store();
        let mut obj = store.pool().get().await.unwrap();
        migrate(&mut obj).await.unwrap();
        drop(obj);
        self
    }

    /// A fresh schema without the migrations applied.
    pub async fn empty() -> Self {
        let admin = admin_url();
        let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL must be running for the integration tests (see README)");
        tokio::spawn(conn);
        if let Err(e) = client
            .batch_execute(&format!("CREATE DATABASE {}", test_db()))
            .await
        {
            // Several test processes race to create it; losing the race is fine.
            let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
            assert!(
                code == "42P04" || code == "23505",
                "creating the test database: {e}"
            );
        }
        static SWEPT: std::sync::Once = std::sync::Once::new();
        let mut first = false;
        SWEPT.call_once(|| first = true);
        let home = test_db_url();
        if first {
            drop_abandoned_schemas(&home).await;
        }
        let schema = Self::new_schema(&home).await;
        let url = with_search_path(&admin, &schema);
        TestDb {
            url,
            schema,
            home,
            _cluster: None,
        }
    }

    /// A schema of its own in `home`, named after this process (see
    /// `drop_abandoned_schemas`).
    async fn new_schema(home: &str) -> String {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!(
            "t_{}_{}_{}",
            std::process::id(),
            nanos,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let client = connect_to(home)
            .await
            .expect("connecting to the test database");
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        schema
    }

    /// The store settings for this schema, as the configuration makes them.
    pub fn config(&self) -> idemproxy::config::PostgresConfig {
        let StoreConfig::Postgres(pg) = idemproxy::config::load_store(
            None,
            &Overrides {
                database_url: Some(self.url.clone()),
                ..Default::default()
            },
        )
        .unwrap() else {
            unreachable!()
        };
        idemproxy::config::PostgresConfig {
            pool_size: TEST_POOL_SIZE,
            ..pg
        }
    }

    /// A store on this schema.
    pub fn store(&self) -> PgStore {
        PgStore::new(&self.config()).unwrap()
    }

    /// A plain client on this schema, for looking at rows.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    }

    /// How many rows the key table holds.
    pub async fn rows(&self) -> i64 {
        self.client()
            .await
            .query_one("SELECT count(*) FROM idempotency_keys", &[])
            .await
            .unwrap()
            .get(0)
    }
}

/// Which store a test runs on: the same scenarios must hold on both.
pub enum Backend {
    Postgres(TestDb),
    Embedded(std::path::PathBuf),
}

impl Backend {
    /// A fresh PostgreSQL schema.
    pub async fn postgres() -> Self {
        Backend::Postgres(TestDb::new().await)
    }

    /// A fresh schema on a Citus cluster, the key table distributed.
    pub async fn citus() -> Self {
        Backend::Postgres(TestDb::citus().await)
    }

    /// A fresh embedded store file in a directory of its own.
    pub fn embedded() -> Self {
        let dir = TempDir::new("embedded");
        let path = dir.join("keys.db");
        // Removed by `Backend`'s own drop, with the store file in it.
        std::mem::forget(dir);
        Backend::Embedded(path)
    }

    /// The `store:` section of a configuration for this backend.
    pub fn store_yaml(&self) -> String {
        match self {
            Backend::Postgres(db) => pg_store_yaml(&db.url),
            Backend::Embedded(path) => {
                format!(
                    "store:\n  embedded:\n    path: \"{}\"\n    timeout: 1s\n",
                    path.display()
                )
            }
        }
    }

    /// `PAYMENTS` with a 10 s bound on a store call instead of the tests' usual 1 s: for
    /// tests that queue a thousand requests at once for the store's connections, where the
    /// point is exactly-once, and a slow moment of a shared 2-core machine must not turn
    /// into 503s.
    pub fn patient_payments(&self) -> String {
        PAYMENTS.replace(
            "{store}",
            &self.store_yaml().replace("timeout: 1s", "timeout: 10s"),
        )
    }

    /// A store on this backend (a second handle on the same data).
    pub fn store(&self) -> AnyStore {
        match self {
            Backend::Postgres(db) => AnyStore::Postgres(db.store()),
            Backend::Embedded(path) => AnyStore::Embedded(
                idemproxy::store::EmbeddedStore::open(path, Duration::from_secs(1)).unwrap(),
            ),
        }
    }

    /// The PostgreSQL database (for tests that only make sense there).
    pub fn pg(&self) -> &TestDb {
        match self {
            Backend::Postgres(db) => db,
            Backend::Embedded(_) => panic!("this test needs PostgreSQL"),
        }
    }

    /// A plain PostgreSQL client on the test schema.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.pg().client().await
    }

    /// How many keys the table holds.
    pub async fn rows(&self) -> i64 {
        match self {
            Backend::Postgres(db) => db.rows().await,
            Backend::Embedded(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row("SELECT count(*) FROM idempotency_keys", [], |r| r.get(0))
                    .unwrap()
            }
        }
    }

    /// The row for a key, as the admin API would show it.
    pub async fn lookup(&self, client_id: &str, key: &str) -> Option<KeyRecord> {
        self.store().lookup(client_id, key).await.unwrap()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Backend::Embedded(path) = self
            && let Some(dir) = path.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs each named `async fn(Backend)` as two tests: on PostgreSQL and on the embedded store.
#[allow(unused_macros)]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::postgres().await).await
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::embedded()).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_stores;

/// Like `on_both_stores!`, and a third time on Citus (the key table distributed): for the
/// scenarios whose statements take another shape there (writes, notifications, the sweep,
/// the reconciler, eviction).
#[allow(unused_macros)]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        on_both_stores!($($name),*);
        on_citus!($($name),*);
    };
}
#[allow(unused_imports)]
pub(crate) use on_every_store;

/// Runs each named `async fn(Backend)` on Citus only (beside an `on_both_stores!` that
/// names more).
#[allow(unused_macros)]
macro_rules! on_citus {
    ($($name:ident),* $(,)?) => {
        mod citus {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::citus().await).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_citus;

/// `url` on the test database with `search_path` set to `schema`.
pub fn with_search_path(admin: &str, schema: &str) -> String {
    let mut base = admin.to_owned();
    if let Some(q) = base.find('?') {
        base.truncate(q);
    }
    let (prefix, _) = base.rsplit_once('/').expect("database URL has a path");
    with_search_path_in(&format!("{prefix}/{}", test_db()), schema)
}

/// `url` (its own database) with `search_path` set to `schema`.
pub fn with_search_path_in(url: &str, schema: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    format!("{base}?options=-csearch_path%3D{schema}")
}

/// A PostgreSQL `store:` section for `url` (e.g. through a relay).
pub fn pg_store_yaml(url: &str) -> String {
    format!(
        "store:\n  postgres:\n    url: \"{url}\"\n    timeout: 1s\n    pool_size: {TEST_POOL_SIZE}\n"
    )
}

/// Applies the migrations through the store a `store:` section describes (TLS, poolers
/// and multi-host URLs included), as `idemproxy migrate` would.
pub async fn migrate_store(store_section: &str) {
    let text =
        format!("upstream:\n  url: http://127.0.0.1:1\ndefaults:\n  lease: 30s\n{store_section}");
    let config = idemproxy::config::load_str(&text, &Overrides::default()).unwrap();
    let StoreConfig::Postgres(pg) = &config.store else {
        panic!("not a PostgreSQL store section: {store_section}")
    };
    let store = PgStore::new(pg).unwrap();
    let mut client = store.pool().get().await.unwrap();
    migrate(&mut client).await.unwrap();
}

/// Simulates a crashed worker: the key is reserved with a lease that runs out at once.
pub async fn crashed_reservation(db: &Backend, client_id: &str, key: &str) {
    let fp = payment_fingerprint();
    let req = idemproxy::store::ReserveRequest {
        client_id,
        key,
        fingerprint: &fp,
        route: "create-payment",
        lease: Duration::from_millis(1),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    };
    assert!(matches!(
        db.store().reserve(&req).await.unwrap(),
        idemproxy::store::Reservation::Reserved(_)
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;
}
