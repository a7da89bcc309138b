//! Test harness: a real PostgreSQL schema per test, a real upstream on an ephemeral port
//! that counts executions, and the real proxy served through `server::run`.

pub mod at_rest;
pub mod cluster;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemproxy::background::Background;
use idemproxy::config::{Overrides, StoreConfig};
use idemproxy::proxy::Proxy;
use idemproxy::store::{AnyStore, KeyRecord, KeyStore, PgStore, migrate};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

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
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let schema = self.schema.clone();
        // Drop runs inside the test's runtime, which cannot block on itself: a thread with
        // a runtime of its own does the work, and a lock timeout bounds it.
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(drop_schemas(&[schema]));
        });
        let _ = done.join();
    }
}

/// Connects to the test database.
async fn test_db_client() -> Option<tokio_postgres::Client> {
    let mut cfg: tokio_postgres::Config = admin_url().parse().ok()?;
    cfg.dbname(test_db());
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(conn);
    Some(client)
}

async fn drop_schemas(schemas: &[String]) {
    let Some(client) = test_db_client().await else {
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
async fn drop_abandoned_schemas() {
    let Some(client) = test_db_client().await else {
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
    drop_schemas(&abandoned).await;
}

impl TestDb {
    pub async fn new() -> Self {
        let db = Self::empty().await;
        let store = db.store();
        let mut obj = store.pool().get().await.unwrap();
        migrate(&mut obj).await.unwrap();
        db
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
        if first {
            drop_abandoned_schemas().await;
        }
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
        let client = test_db_client()
            .await
            .expect("connecting to the test database");
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let url = with_search_path(&admin, &schema);
        TestDb { url, schema }
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

/// A directory of its own under the system's temporary directory, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "idemproxy-{label}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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

/// `url` on the test database with `search_path` set to `schema`.
pub fn with_search_path(admin: &str, schema: &str) -> String {
    let mut base = admin.to_owned();
    if let Some(q) = base.find('?') {
        base.truncate(q);
    }
    let (prefix, _) = base.rsplit_once('/').expect("database URL has a path");
    format!("{prefix}/{}?options=-csearch_path%3D{schema}", test_db())
}

/// How the fake upstream answers.
#[derive(Clone, Debug)]
pub struct Behavior {
    pub delay: Duration,
    pub status: u16,
    /// Deduplicate by the derived key like a provider that supports idempotency keys.
    pub dedupe: bool,
    /// Pad the answer to at least this many bytes.
    pub pad_to: usize,
    /// Close a keep-alive connection silently after it has been idle this long (read
    /// when the connection is accepted).
    pub idle_close: Option<Duration>,
    /// Answer recovery probes with this status instead of found (200) / not found (404):
    /// a provider whose lookup is down.
    pub probe_status: Option<u16>,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            status: 201,
            dedupe: false,
            pad_to: 0,
            idle_close: None,
            probe_status: None,
        }
    }
}

/// What the upstream saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Shown in assertion messages (through `Debug`), read by no test yet.
    #[allow(dead_code)]
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct UpstreamState {
    /// Every request that reached the handler ("executions").
    executions: AtomicUsize,
    /// Charges actually made (differs from executions when deduplicating).
    charges: AtomicUsize,
    by_key: Mutex<HashMap<String, String>>,
    seen: Mutex<Vec<Seen>>,
    behavior: Mutex<Behavior>,
    /// Requests whose answer has been fully produced (after the delay).
    finished: AtomicUsize,
    /// Recovery probes answered (`/probe/{key}`), not counted as executions.
    probes: AtomicUsize,
    /// Connections accepted, open now, and open at most at once.
    accepted: AtomicUsize,
    open: AtomicUsize,
    most_open: AtomicUsize,
}

/// A real HTTP upstream on 127.0.0.1 that counts executions.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
}

impl Upstream {
    pub async fn spawn(behavior: Behavior) -> Self {
        Self::spawn_at("127.0.0.1:0".parse().unwrap(), behavior).await
    }

    /// Starts the upstream on a given address (to bring a "down" upstream back up).
    pub async fn spawn_at(addr: SocketAddr, behavior: Behavior) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState {
            behavior: Mutex::new(behavior),
            ..Default::default()
        });
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                st.accepted.fetch_add(1, Ordering::SeqCst);
                let open = st.open.fetch_add(1, Ordering::SeqCst) + 1;
                st.most_open.fetch_max(open, Ordering::SeqCst);
                let idle_close = st.behavior.lock().unwrap().idle_close;
                tokio::spawn(async move {
                    let st2 = Arc::clone(&st);
                    let svc = service_fn(move |req| handle_upstream(Arc::clone(&st2), req));
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Some(idle) = idle_close {
                        // hyper's head timeout also bounds the wait for the next request.
                        builder
                            .http1()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(idle);
                    }
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    st.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Upstream { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn executions(&self) -> usize {
        self.state.executions.load(Ordering::SeqCst)
    }

    pub fn charges(&self) -> usize {
        self.state.charges.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests have reached the upstream. The budget is for a loaded
    /// machine (the whole suite on two cores), not a quiet one: the wait ends at the event.
    pub async fn wait_executions(&self, n: usize) {
        let reached = eventually(Duration::from_secs(60), || async {
            (self.executions() >= n).then_some(())
        })
        .await;
        assert!(
            reached.is_some(),
            "the upstream never reached {n} executions"
        );
    }

    pub fn probes(&self) -> usize {
        self.state.probes.load(Ordering::SeqCst)
    }

    pub fn finished(&self) -> usize {
        self.state.finished.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once.
    pub fn most_open_connections(&self) -> usize {
        self.state.most_open.load(Ordering::SeqCst)
    }

    pub fn set(&self, behavior: Behavior) {
        *self.state.behavior.lock().unwrap() = behavior;
    }
}

async fn handle_upstream(
    st: Arc<UpstreamState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if let Some(probed) = parts.uri.path().strip_prefix("/probe/") {
        // A provider's "did the operation with this key happen?" endpoint.
        st.probes.fetch_add(1, Ordering::SeqCst);
        let key = percent_decode(probed);
        let found = st.by_key.lock().unwrap().get(&key).cloned();
        let (status, body) = match (st.behavior.lock().unwrap().probe_status, found) {
            (Some(status), _) => (status, r#"{"error":"lookup unavailable"}"#.to_owned()),
            (None, Some(charge)) => (200, charge),
            (None, None) => (404, r#"{"error":"no such operation"}"#.to_owned()),
        };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        return Ok(resp);
    }
    let behavior = st.behavior.lock().unwrap().clone();
    st.executions.fetch_add(1, Ordering::SeqCst);
    st.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The "charge": made once per derived key when deduplicating, else every time.
    let charge = {
        let mut by_key = st.by_key.lock().unwrap();
        match (&key, behavior.dedupe) {
            (Some(k), true) if by_key.contains_key(k) => by_key[k].clone(),
            _ => {
                let n = st.charges.fetch_add(1, Ordering::SeqCst) + 1;
                let charge = format!(
                    r#"{{"charge_id":{n},"request":{}}}"#,
                    serde_json::to_string(&String::from_utf8_lossy(&body)).unwrap()
                );
                if let Some(k) = key {
                    by_key.insert(k, charge.clone());
                }
                charge
            }
        }
    };
    let mut charge = charge;
    if charge.len() < behavior.pad_to {
        charge = format!("{charge}{}", " ".repeat(behavior.pad_to - charge.len()));
    }
    tokio::time::sleep(behavior.delay).await;
    st.finished.fetch_add(1, Ordering::SeqCst);
    let resp = Response::builder()
        .status(behavior.status)
        .header("content-type", "application/json")
        .header("location", "/payments/1")
        .header("set-cookie", "session=secret")
        .header("x-upstream-only", "1")
        .body(Full::new(Bytes::from(charge)))
        .unwrap();
    Ok(resp)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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

/// A TCP relay that a test can cut (every connection dropped, new ones refused) and
/// restore: a database or upstream going away and coming back, for real.
#[derive(Clone)]
pub struct Relay {
    pub addr: SocketAddr,
    up: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Raised by `freeze`: every connection, open or new, stops carrying bytes but stays
    /// open — a host that vanished without a reset.
    frozen: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Relay {
    pub async fn spawn(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = Relay {
            addr,
            up: Arc::default(),
            conns: Arc::default(),
            frozen: Arc::new(tokio::sync::watch::channel(false).0),
        };
        relay.up.store(true, Ordering::SeqCst);
        let r = relay.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !r.up.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut frozen = r.frozen.subscribe();
                let task = tokio::spawn(async move {
                    let already = *frozen.borrow();
                    if already {
                        // Accepted, never answered; held open.
                        return std::future::pending::<()>().await;
                    }
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let froze = tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                            raised = frozen.wait_for(|f| *f) => raised.is_ok(),
                        };
                        if froze {
                            // Both sides held open, silent.
                            std::future::pending::<()>().await;
                        }
                    }
                });
                r.conns.lock().unwrap().push(task.abort_handle());
            }
        });
        relay
    }

    /// Drops every relayed connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// Stops every connection, open and new, from carrying bytes, without closing any:
    /// the other side sees silence, no reset.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// A relay in front of the test database's server, and the database URL through it.
    pub async fn for_db(db: &TestDb) -> (Relay, String) {
        // (the URL through the relay goes into a `store:` section with `store_yaml_for`)
        let cfg: tokio_postgres::Config = db.url.parse().unwrap();
        let host = match &cfg.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other @ tokio_postgres::config::Host::Unix(_) => {
                panic!("the relay needs a TCP database host, not {other:?}")
            }
        };
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let target = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        let relay = Relay::spawn(target).await;
        let url = db
            .url
            .replacen(&format!("{host}:{port}"), &relay.addr.to_string(), 1);
        assert_ne!(
            url, db.url,
            "the database URL must name host:port explicitly"
        );
        (relay, url)
    }
}

/// The `idemproxy` binary running as its own process, for SIGKILL and SIGTERM tests.
pub struct ProxyProcess {
    pub addr: SocketAddr,
    /// Its admin listener (health, readiness, metrics).
    pub admin: SocketAddr,
    pub child: tokio::process::Child,
    pub log: std::path::PathBuf,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    free_listener().local_addr().unwrap().port()
}

/// A listener on a free loopback port; dropping it frees the port again.
fn free_listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap()
}

impl ProxyProcess {
    /// Starts the binary on `yaml` (`{upstream}`, `{db}` substituted; `{listen}` and
    /// `{admin}` get free ports, and the admin listener is put on `{admin}` when `yaml`
    /// does not say where) and waits until it accepts connections.
    pub async fn spawn(yaml: &str, upstream: &Upstream, db: &Backend) -> Self {
        Self::spawn_with(yaml, upstream, db, &[]).await
    }

    /// Like `spawn`, with more arguments for `serve` (e.g. `--migrate`).
    pub async fn spawn_with(yaml: &str, upstream: &Upstream, db: &Backend, args: &[&str]) -> Self {
        // Both held open while choosing, so the two ports cannot be the same one (two
        // `free_port()` calls in a row can be handed the same port back).
        let held = [free_listener(), free_listener()];
        let [port, admin] = held.each_ref().map(|l| l.local_addr().unwrap().port());
        drop(held);
        // Not the default port: processes of tests running in parallel would share it.
        let yaml = if yaml.contains("admin_listen:") {
            yaml.to_owned()
        } else {
            format!("admin_listen: \"{{admin}}\"\n{yaml}")
        };
        let text = yaml
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url())
            .replace("{admin}", &format!("127.0.0.1:{admin}"));
        let dir =
            std::env::temp_dir().join(format!("idemproxy-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(&config, text).unwrap();
        let log = dir.join("stderr.log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "info")
            // Several server threads whatever the machine, so that connections (and the
            // drain on SIGTERM) are spread over threads as in production.
            .env("TOKIO_WORKER_THREADS", "3")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let up = eventually(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "the proxy process did not start; see {}",
            log.display()
        );
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        ProxyProcess {
            addr,
            admin,
            child,
            log,
        }
    }

    /// The configuration file it was started with.
    pub fn config_file(&self) -> std::path::PathBuf {
        self.log.with_file_name("config.yaml")
    }

    /// The process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The directory holding its configuration and log.
    pub fn dir(&self) -> &std::path::Path {
        self.log.parent().unwrap_or(&self.log)
    }

    /// SIGKILL: no cleanup, no drain — a crash.
    pub async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM: the orchestrator's polite stop.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("still running");
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(self.dir());
    }
}

/// A client for a proxy at `addr`.
pub fn client_for(addr: SocketAddr) -> TestClient {
    TestClient::at(addr)
}

/// A proxy served on 127.0.0.1 by the library's own `server::run`.
pub struct TestProxy {
    pub addr: SocketAddr,
    /// The admin listener (health, metrics, admin API).
    pub admin: SocketAddr,
    pub metrics: Arc<idemproxy::metrics::Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<bool>,
    admin_handle: tokio::task::JoinHandle<()>,
    /// The sweep, the unresolved-keys gauge and (when configured) the reconciler, started
    /// as `serve` starts them.
    background: Option<Background>,
}

impl TestProxy {
    /// Starts a proxy and its admin listener on `yaml` (`{store}` and `{upstream}` are
    /// substituted).
    pub async fn spawn(yaml: &str, upstream: &Upstream, db: &Backend) -> Self {
        let text = yaml
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url());
        let config = Arc::new(
            idemproxy::config::load_str(&text, &Overrides::default())
                .expect("test config is valid"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = admin_listener.local_addr().unwrap();
        let proxy = Proxy::new(Arc::clone(&config), AnyStore::open(&config.store).unwrap());
        let metrics = Arc::clone(proxy.metrics());
        let admin_handle = tokio::spawn(idemproxy::admin::run(
            admin_listener,
            proxy.clone(),
            config.admin_token.clone(),
            std::future::pending(),
        ));
        let background = Some(Background::start(&proxy));
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(idemproxy::server::run(
            listener,
            proxy,
            async {
                let _ = rx.await;
            },
            Duration::from_secs(10),
        ));
        TestProxy {
            addr,
            admin,
            metrics,
            shutdown: Some(tx),
            handle,
            admin_handle,
            background,
        }
    }

    /// Stops accepting, drains, and waits for the server to return.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(background) = self.background.take() {
            background.stop();
        }
        let _ = (&mut self.handle).await;
        self.admin_handle.abort();
    }
}

/// The value of one series on `/metrics` (`name{labels}` as rendered), 0 when absent.
pub async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let metrics = TestClient::at(admin).send("GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Replays this proxy answered from memory so far, as `/metrics` shows them.
pub async fn cache_hits(proxy: &TestProxy) -> u64 {
    let metrics = TestClient::at(proxy.admin)
        .send("GET", "/metrics", &[], "")
        .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("idemproxy_replay_cache_hits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no replay cache counter in {text}"))
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {:?}", self.body))
    }

    /// The problem document's `detail`.
    pub fn detail(&self) -> String {
        self.json()["detail"]
            .as_str()
            .unwrap_or_else(|| panic!("no detail: {self:?}"))
            .to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn is_problem(&self) -> bool {
        self.headers
            .get("content-type")
            .is_some_and(|v| v == "application/problem+json")
    }
}

/// A plain HTTP client for the tests.
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl TestClient {
    pub fn new(proxy: &TestProxy) -> Self {
        Self::at(proxy.addr)
    }

    pub fn at(addr: SocketAddr) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    /// Like `send`, but a failed connection is an `Err` instead of a panic.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        self.try_send(method, path, headers, body)
            .await
            .expect("proxy answers")
    }

    /// Sends `n` POSTs at once, each with its own key (`{prefix}{i}`), and returns their
    /// replies.
    pub async fn post_each_key_at_once(
        &self,
        n: usize,
        path: &str,
        client_id: &str,
        prefix: &str,
        body: &str,
    ) -> Vec<Reply> {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (this, path, client_id, key, body) = (
                self.clone(),
                path.to_owned(),
                client_id.to_owned(),
                format!("{prefix}{i}"),
                body.to_owned(),
            );
            tasks.spawn(async move { this.post(&path, &client_id, &key, &body).await });
        }
        tasks.join_all().await
    }

    /// Retries `post` while it answers 409 (a lease still held), for up to 20 s.
    pub async fn post_until_settled(
        &self,
        path: &str,
        client: &str,
        key: &str,
        body: &str,
    ) -> Reply {
        eventually(Duration::from_secs(20), || async {
            let reply = self.post(path, client, key, body).await;
            (reply.status != 409).then_some(reply)
        })
        .await
        .unwrap_or_else(|| panic!("{key} still answered 409 after 20 s"))
    }

    /// `POST path` with a JSON body, a key and a client id.
    pub async fn post(&self, path: &str, client: &str, key: &str, body: &str) -> Reply {
        self.send(
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("idempotency-key", key),
                ("x-client-id", client),
            ],
            body,
        )
        .await
    }
}

/// The usual configuration: one payments route with fingerprint fields, keys per client.
pub const PAYMENTS: &str = r#"
upstream:
  url: {upstream}
  timeout: 10s
{store}
client_id:
  header: X-Client-Id
defaults:
  lease: 30s
routes:
  - name: create-payment
    methods: [POST]
    path: /payments
    require_key: true
    fingerprint:
      fields: [/amount, /currency, /recipient, /purpose]
  - name: orders
    methods: [POST]
    path: /orders/*
    max_body: 1KiB
"#;

/// A payment body for `/payments` of [`PAYMENTS`].
pub const PAYMENT_BODY: &str =
    r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// The fingerprint `/payments` of [`PAYMENTS`] gives [`PAYMENT_BODY`].
pub fn payment_fingerprint() -> idemproxy::fingerprint::Fingerprint {
    let fields: Vec<String> = ["/amount", "/currency", "/recipient", "/purpose"]
        .map(String::from)
        .to_vec();
    idemproxy::fingerprint::fingerprint(&idemproxy::fingerprint::Request {
        method: "POST",
        path: "/payments",
        query: None,
        content_type: Some(b"application/json"),
        body: PAYMENT_BODY.as_bytes(),
        fields: Some(&fields),
    })
    .unwrap()
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

/// Polls `f` until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
