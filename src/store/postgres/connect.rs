//! Making the store's connections: each host of a multi-host URL tried in turn, each
//! attempt (TCP, TLS, start-up, `target_session_attrs` check) bounded as a whole, the host
//! that answered last tried first.
//!
//! tokio-postgres would try the hosts itself, but in a fixed order and with only the TCP
//! connect bounded: a primary that vanished behind a live address (a frozen VM, a proxy
//! that accepts and never answers) would hold every new connection until the store call
//! gives up, and the service would not come back after a promotion.
//!
//! Statements are also bounded on the server, by `statement_timeout` equal to the store
//! timeout, so that a statement the proxy gave up on does not go on waiting for (or
//! holding) row locks. A direct connection gets it as a start-up option, once. A
//! transaction pooler (PgBouncer) refuses that option and would leak a session `SET` to
//! other clients, so a connection through one sends each statement inside
//! `BEGIN; SET LOCAL statement_timeout …; …; COMMIT`, pipelined: still one round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use tokio_postgres::Client;

use tokio_postgres::config::SslMode;

use super::conn::PgConn;
use super::tls::PgTlsConnect;
use crate::store::describe;
use crate::store::error::chain_has_handshake;

/// One host's connection settings, and how to name it in errors.
struct Host {
    settings: Settings,
    /// Under `sslmode=prefer`: the same without TLS, for a server whose handshake fails
    /// (libpq then connects in plain).
    plain: Option<Settings>,
    label: String,
    /// The host refused the start-up option: a transaction pooler (see the module doc).
    pooler: AtomicBool,
}

/// A host's settings as they are sent.
struct Settings {
    config: tokio_postgres::Config,
    /// `config` with `statement_timeout` as a start-up option.
    bounded: tokio_postgres::Config,
}

impl Settings {
    fn new(config: tokio_postgres::Config, option: &str) -> Self {
        let mut bounded = config.clone();
        match config.get_options() {
            Some(own) => bounded.options(format!("{own} {option}")),
            None => bounded.options(option),
        };
        Settings { config, bounded }
    }
}

/// The pool's connection maker.
pub struct PgManager {
    hosts: Vec<Host>,
    /// The host that answered last: tried first next time.
    preferred: AtomicUsize,
    tls: PgTlsConnect,
    /// Bound on one host's whole attempt.
    per_host: Duration,
    /// What each statement is prefixed with behind a pooler.
    begin: Arc<str>,
}

impl PgManager {
    /// `hosts` are single-host configurations (see `config::libpq::split_hosts`);
    /// statements are bounded on the server by `statement_timeout`.
    pub fn new(
        hosts: Vec<tokio_postgres::Config>,
        tls: PgTlsConnect,
        per_host: Duration,
        statement_timeout: Duration,
    ) -> Self {
        let ms = statement_timeout.as_millis();
        let hosts = hosts
            .into_iter()
            .map(|config| {
                let option = format!("-c statement_timeout={ms}");
                let plain = (config.get_ssl_mode() == SslMode::Prefer).then(|| {
                    let mut plain = config.clone();
                    plain.ssl_mode(SslMode::Disable);
                    Settings::new(plain, &option)
                });
                Host {
                    label: label(&config),
                    settings: Settings::new(config, &option),
                    plain,
                    pooler: AtomicBool::new(false),
                }
            })
            .collect();
        Self {
            hosts,
            preferred: AtomicUsize::new(0),
            tls,
            per_host,
            begin: format!("BEGIN; SET LOCAL statement_timeout = {ms}").into(),
        }
    }

    /// Whether a host turned out to be a transaction pooler.
    pub fn behind_pooler(&self) -> bool {
        self.hosts.iter().any(|h| h.pooler.load(Ordering::Relaxed))
    }

    /// One host's attempt; under `sslmode=prefer`, again without TLS when the handshake
    /// fails, as libpq does (a certificate rustls cannot read, a TLS version it refuses).
    async fn connect_host(
        &self,
        host: &Host,
    ) -> Result<(Client, Option<Arc<str>>), tokio_postgres::Error> {
        match (self.connect_with(host, &host.settings).await, &host.plain) {
            (Err(e), Some(plain)) if chain_has_handshake(&e) => {
                tracing::warn!(host = %host.label, cause = %describe(&e), "sslmode=prefer: the TLS handshake failed, connecting without TLS");
                self.connect_with(host, plain).await
            }
            (result, _) => result,
        }
    }

    /// An attempt with `settings`: with the start-up option, or (a pooler) without it.
    async fn connect_with(
        &self,
        host: &Host,
        settings: &Settings,
    ) -> Result<(Client, Option<Arc<str>>), tokio_postgres::Error> {
        if !host.pooler.load(Ordering::Relaxed) {
            match settings.bounded.connect(self.tls.clone()).await {
                Ok((client, connection)) => {
                    drive(connection);
                    return Ok((client, None));
                }
                // PgBouncer: "unsupported startup parameter: options".
                Err(e)
                    if e.as_db_error().is_some_and(|db| {
                        db.message().contains("unsupported startup parameter")
                    }) =>
                {
                    tracing::info!(host = %host.label, "a transaction pooler: statement_timeout is set per statement");
                    host.pooler.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let (client, connection) = settings.config.connect(self.tls.clone()).await?;
        drive(connection);
        Ok((client, Some(Arc::clone(&self.begin))))
    }

    /// A connection to the first host (starting with the preferred one) that takes it.
    pub async fn connect(&self) -> Result<PgConn, ConnectError> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut attempts = Vec::new();
        for i in (0..self.hosts.len()).map(|n| (first + n) % self.hosts.len()) {
            let host = &self.hosts[i];
            match tokio::time::timeout(self.per_host, self.connect_host(host)).await {
                Ok(Ok((client, begin))) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(PgConn::new(client, begin));
                }
                Ok(Err(e)) => attempts.push((host.label.clone(), Failure::Postgres(e))),
                Err(_) => attempts.push((host.label.clone(), Failure::TimedOut(self.per_host))),
            }
        }
        Err(ConnectError { attempts })
    }
}

/// Runs a connection's I/O until it ends.
fn drive<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(cause = %describe(&e), "store connection ended");
        }
    });
}

impl managed::Manager for PgManager {
    type Type = PgConn;
    type Error = ConnectError;

    async fn create(&self) -> Result<PgConn, ConnectError> {
        self.connect().await
    }

    async fn recycle(&self, conn: &mut PgConn, _: &Metrics) -> RecycleResult<ConnectError> {
        if conn.client.is_closed() {
            return Err(RecycleError::message("the connection is closed"));
        }
        if conn.spoiled.load(Ordering::Relaxed) {
            return Err(RecycleError::message(
                "a call on this connection was given up",
            ));
        }
        Ok(())
    }
}

fn label(config: &tokio_postgres::Config) -> String {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => format!("{h}:{port}"),
        Some(tokio_postgres::config::Host::Unix(dir)) => format!("{}:{port}", dir.display()),
        None => format!("localhost:{port}"),
    }
}

/// Why one host's attempt failed.
#[derive(Debug)]
pub enum Failure {
    Postgres(tokio_postgres::Error),
    TimedOut(Duration),
}

/// No host took the connection: what each one said.
#[derive(Debug)]
pub struct ConnectError {
    pub attempts: Vec<(String, Failure)>,
}

impl ConnectError {
    /// The PostgreSQL errors among the attempts.
    pub fn errors(&self) -> impl Iterator<Item = &tokio_postgres::Error> {
        self.attempts.iter().filter_map(|(_, f)| match f {
            Failure::Postgres(e) => Some(e),
            Failure::TimedOut(_) => None,
        })
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (host, failure)) in self.attempts.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match failure {
                Failure::Postgres(e) => write!(f, "{host}: {}", describe(e))?,
                Failure::TimedOut(d) => write!(f, "{host}: no answer within {d:?}")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConnectError {}

/// The tokio-postgres settings for a connection string (its TLS parameters already taken
/// out by the configuration): TLS as `sslmode` says, the connect timeout per host, and an
/// application name for `pg_stat_activity`.
pub(super) fn connection_config(
    url: &str,
    config: &crate::config::PostgresConfig,
) -> Result<tokio_postgres::Config, crate::store::StoreError> {
    use crate::config::PgSslMode;
    use tokio_postgres::config::SslMode;
    let mut pg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        crate::store::StoreError::Config(format!("database URL: {e}"))
    })?;
    pg.connect_timeout(config.connect_timeout);
    pg.ssl_mode(match config.tls.mode {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::Prefer => SslMode::Prefer,
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => SslMode::Require,
    });
    if pg.get_application_name().is_none() {
        pg.application_name("idemproxy");
    }
    // TCP keepalives after 10 s idle instead of libpq's and the kernel's 2 h, unless the
    // URL says otherwise: a host that vanished is noticed on an idle connection (the
    // notification connection is idle most of the time).
    if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        pg.keepalives_idle(Duration::from_secs(10));
    }
    Ok(pg)
}
