//! The validated, typed configuration everything below `main` works with.
//!
//! Nothing in here knows about files, flags or the environment; tests build a [`Config`]
//! from YAML text through [`super::load_str`] like the binary does.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::RouteTable;
use super::identity::ClientIdSource;
pub use super::limits::*;

/// Default proxy listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener (health, readiness).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// How long a TCP connect to the upstream may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the upstream may take to answer, body included.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(20);
/// Most requests in flight to the upstream at once.
pub const DEFAULT_UPSTREAM_MAX_CONNECTIONS: usize = 256;
/// How long one connection attempt to one PostgreSQL host may take: well under the store
/// timeout, so that a host that vanished (no answer, no reset) leaves time for the next.
pub const DEFAULT_PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections in the PostgreSQL pool.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long one store call (pool wait + statement) may take before the store counts as down.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(3);
/// Lease on a reserved key; renewed every third of it while the upstream call runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// How long completed keys are kept and replayed (published in the README).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Largest request body a protected route accepts.
pub const DEFAULT_MAX_BODY: u64 = 1 << 20;
/// Largest upstream answer stored for replay.
pub const DEFAULT_MAX_STORED_RESPONSE: u64 = 1 << 20;
/// Default client and upstream idempotency key header.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";
/// Default header marking replays (`true`) and first answers (`false`).
pub const DEFAULT_REPLAYED_HEADER: &str = "idempotent-replayed";
/// How long in-flight requests may take to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How often the retention sweep runs.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Rows per sweep statement.
pub const DEFAULT_SWEEP_BATCH: i64 = 500;
/// How often the reconciler looks for unresolved keys.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(30);
/// Unresolved keys the reconciler takes per pass, per replica.
pub const DEFAULT_RECONCILE_BATCH: i64 = 50;
/// Memory for replayed answers (`store.replay_cache`).
pub const DEFAULT_REPLAY_CACHE: u64 = 32 << 20;
/// Embedded store file when no PostgreSQL URL is configured.
pub const DEFAULT_EMBEDDED_PATH: &str = "./idemproxy.db";

/// The methods RFC 9110 registers, and PATCH (RFC 5789). Anything else is far more often a
/// typo (`PSOT`) than an extension, and a typo would leave every real `POST` unprotected.
pub const REGISTERED_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// Whether `method` is one of [`REGISTERED_METHODS`].
pub fn is_registered_method(method: &Method) -> bool {
    REGISTERED_METHODS.contains(method)
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub client_id: ClientIdSource,
    pub routes: RouteTable,
    pub shutdown_grace: Duration,
    /// Whether the route table was implied (no `routes:` in the file).
    pub implicit_routes: bool,
    /// The shape of the proxy's own errors where no route applies (`defaults.errors`):
    /// unrouted requests and heads refused before routing.
    pub errors: crate::dialect::Dialect,
    /// What is valid but almost certainly not meant (a route an earlier one shadows):
    /// printed by `check-config`, logged at start.
    pub warnings: Vec<String>,
    /// Bearer token for `/admin/*`; required when the admin listener is not loopback.
    pub admin_token: Option<String>,
    /// Named tokens for `/admin/*` and the console, by SHA-256 (`admin_tokens:`); the name
    /// is the operator in audit lines.
    pub admin_tokens: Vec<AdminToken>,
    /// How often the retention sweep runs.
    pub sweep_interval: Duration,
    /// Rows deleted per sweep statement (small batches: no long locks).
    pub sweep_batch: i64,
    /// Unresolved keys (in progress, lease run out) are deleted this long after their
    /// lease ran out; `None` (the default): never, they wait to be resolved.
    pub unresolved_retention: Option<std::time::Duration>,
    /// The reconciler of unresolved keys (`reconcile:`); `None`: off.
    pub reconcile: Option<Reconcile>,
    /// What one client may cost the proxy.
    pub limits: Limits,
    /// TLS on the listener, when configured.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Span export by OTLP (`tracing:`); `None`: off, and no span is recorded.
    pub tracing: Option<Tracing>,
    /// The key ring sealing stored answers (`encryption:`); `None`: answers are stored in
    /// clear.
    pub encryption: Option<Encryption>,
}

/// The key ring as configured: every key by id (read from the environment or a file at
/// start), and the one new answers are sealed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encryption {
    pub keys: Vec<RingKey>,
    pub active: String,
    /// `hash_keys: true`: the secret idempotency keys are hashed with (its id is
    /// `hash_key`); `None`: keys are stored as sent.
    pub hash_key: Option<RingKey>,
}

/// One key of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingKey {
    pub id: String,
    /// Where it was read from (`env NAME`, `file PATH`), for printing; never the bytes.
    pub source: String,
    pub material: crate::vault::KeyMaterial,
}

impl Config {
    /// How idempotency keys are stored: hashed with `encryption.hash_key`, or as sent.
    pub fn key_form(&self) -> crate::key::KeyForm {
        self.encryption
            .as_ref()
            .map(Encryption::key_form)
            .unwrap_or_default()
    }
}

impl Encryption {
    /// The ring the proxy seals and opens with.
    pub fn vault(&self) -> crate::vault::Vault {
        let keys = self.keys.iter().map(|k| (k.id.clone(), k.material.clone()));
        // The configuration only holds an active key that is in the ring.
        crate::vault::Vault::new(keys, &self.active)
            .unwrap_or_else(|| unreachable!("encryption.active is one of encryption.keys"))
    }

    /// How idempotency keys are stored.
    pub fn key_form(&self) -> crate::key::KeyForm {
        match &self.hash_key {
            Some(k) => crate::key::KeyForm::hashed(&k.material),
            None => crate::key::KeyForm::clear(),
        }
    }
}

/// Where spans go: an OTLP/HTTP endpoint (JSON encoding), and the service name they carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracing {
    /// The traces URL: the configured endpoint, with `/v1/traces` when it had no path.
    pub traces_url: http::Uri,
    pub service_name: String,
}

/// The reconciler: every `interval`, up to `batch` unresolved keys of routes with a
/// `recovery_probe` are taken over and the probe asked about each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconcile {
    pub interval: Duration,
    pub batch: i64,
}

/// Where and how requests are forwarded.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `scheme://authority` of the upstream.
    pub origin: http::Uri,
    /// A path prefix from the URL (`http://host/api` forwards `/x` to `/api/x`), without a trailing `/`.
    pub base_path: String,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// Most requests in flight to the upstream at once (and so its open connections).
    pub max_connections: usize,
    /// TLS towards `https://` upstreams (roots, private CA, client certificate).
    pub tls: Arc<rustls::ClientConfig>,
    /// What the upstream's trust comes from, for `check-config`.
    pub tls_summary: String,
}

/// Which store backs the key table.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    Postgres(PostgresConfig),
    Embedded {
        path: PathBuf,
        /// Bound on one store call (disk I/O on the blocking pool included).
        timeout: Duration,
        /// Bytes of the replay cache; 0: none.
        replay_cache: u64,
    },
}

/// PostgreSQL connection settings.
#[derive(Clone)]
pub struct PostgresConfig {
    /// The connection string without its TLS parameters (those are in `tls`).
    pub url: String,
    /// A direct connection for `LISTEN` (wait-mode wake-ups), when `url` goes through a
    /// transaction pooler that drops notifications; without its TLS parameters.
    pub listen_url: Option<String>,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    /// Bound on one store call; past it the store counts as unreachable.
    pub timeout: Duration,
    pub tls: PgTls,
    /// Bytes of the replay cache; 0: none.
    pub replay_cache: u64,
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgSslMode {
    /// Plain connections only.
    Disable,
    /// TLS when the server offers it, unverified; plain otherwise (libpq's default).
    Prefer,
    /// TLS always; the certificate is verified only against an `sslrootcert` if one is
    /// given (as libpq does), not its host name.
    Require,
    /// TLS, the certificate chain verified against `sslrootcert`.
    VerifyCa,
    /// TLS, the chain and the host name verified.
    VerifyFull,
}

impl PgSslMode {
    /// The spelling in a connection string.
    pub fn as_str(self) -> &'static str {
        match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Prefer => "prefer",
            PgSslMode::Require => "require",
            PgSslMode::VerifyCa => "verify-ca",
            PgSslMode::VerifyFull => "verify-full",
        }
    }
}

/// TLS towards PostgreSQL: the mode, and the rustls configuration that carries it out
/// (built at start, so a broken certificate file is a configuration error).
#[derive(Clone)]
pub struct PgTls {
    pub mode: PgSslMode,
    /// How much of the server's certificate is checked.
    pub verify: PgVerify,
    /// The parameters as configured (file paths, or `system` for the root certificates).
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
    pub client: Arc<rustls::ClientConfig>,
}

impl PgTls {
    /// One line for the start-up log: whether connections are encrypted and verified.
    pub fn summary(&self) -> String {
        let verified = match (self.mode, self.verify) {
            (PgSslMode::Disable, _) => "plain connections only, no TLS",
            (PgSslMode::Prefer, _) => {
                "TLS when the server offers it, certificate NOT verified; plain otherwise"
            }
            (_, PgVerify::Nothing) => "TLS, certificate NOT verified",
            (_, PgVerify::Chain) => "TLS, certificate chain verified (not the host name)",
            (_, PgVerify::Full) => "TLS, certificate and host name verified",
        };
        format!("sslmode={}: {verified}", self.mode.as_str())
    }
}

/// How much of the server's certificate is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgVerify {
    /// Nothing (encryption against passive eavesdropping only).
    Nothing,
    /// The chain, not the host name.
    Chain,
    /// The chain and the host name.
    Full,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact_url(&self.url))
            .field("listen_url", &self.listen_url.as_deref().map(redact_url))
            .field("tls", &self.tls.summary())
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl PostgresConfig {
    /// Where the URL points — hosts, database and user, never the password — for the
    /// start-up log.
    pub fn target(&self) -> String {
        let Ok(pg) = self.url.parse::<tokio_postgres::Config>() else {
            return "(unparsable URL)".to_owned();
        };
        let ports = pg.get_ports();
        let hosts: Vec<String> = pg
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                    tokio_postgres::config::Host::Unix(dir) => format!("{}:{port}", dir.display()),
                }
            })
            .collect();
        format!(
            "host={} dbname={} user={}",
            if hosts.is_empty() {
                "localhost:5432".to_owned()
            } else {
                hosts.join(",")
            },
            pg.get_dbname().or(pg.get_user()).unwrap_or("postgres"),
            pg.get_user().unwrap_or("(default)")
        )
    }
}

impl StoreConfig {
    /// Bound on one store call, used to check that leases can be renewed in time.
    pub fn timeout(&self) -> Duration {
        match self {
            StoreConfig::Postgres(pg) => pg.timeout,
            StoreConfig::Embedded { timeout, .. } => *timeout,
        }
    }
}

/// Hides the password of a `postgres://user:password@host/db` URL.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// An operator's admin token: the name audit lines give, and the SHA-256 of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminToken {
    pub name: String,
    pub sha256: [u8; 32],
}
