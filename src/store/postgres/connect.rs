//! Making one store connection: each host of a multi-host URL tried in turn, its name
//! resolved at every attempt and each address tried, each address's attempt (TCP, TLS,
//! start-up, `target_session_attrs` check) bounded as a whole by `connect_timeout`; a host
//! that failed or timed out goes to the back of the order until it answers again.
//!
//! tokio-postgres would try the hosts itself, but in a fixed order, resolving once, with
//! only the TCP connect bounded: a primary that vanished behind a live address (a frozen
//! VM, a proxy that accepts and never answers) would hold every new connection, and a
//! managed database's DNS failover would not be followed. Attempts outlive the call that
//! started them ([`super::manager`]), so the next host is reached even when the store
//! timeout is shorter than a host's `connect_timeout`.
//!
//! Statements are also bounded on the server, by `statement_timeout` equal to the store
//! timeout, so that a statement the proxy gave up on does not go on waiting for (or
//! holding) row locks. A direct connection gets it as a start-up option, once. A
//! transaction pooler (PgBouncer) refuses that option and would leak a session `SET` to
//! other clients, so a connection through one sends each statement inside
//! `BEGIN; SET LOCAL statement_timeout …; …; COMMIT`, pipelined: still one round trip.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::config::{Host as PgHost, SslMode};

use super::conn::PgConn;
use super::tls::{PgTlsConnect, PgTlsStream};
use crate::store::connect_error::{ConnectError, Failure};
use crate::store::describe;
use crate::store::error::chain_has_handshake;

/// A connection just made: the client, its I/O to drive, and (behind a pooler) what each
/// statement is prefixed with.
pub type Opened = (
    Client,
    tokio_postgres::Connection<tokio_postgres::Socket, PgTlsStream>,
    Option<Arc<str>>,
);

/// One host of the URL, and how to name it in errors.
struct Host {
    config: tokio_postgres::Config,
    label: String,
    /// The host refused the start-up option: a transaction pooler (see the module doc).
    pooler: AtomicBool,
    /// Its last attempt timed out (it accepts and never answers, or cannot be reached):
    /// tried after hosts that at least answer, until it answers again.
    silent: AtomicBool,
}

/// Makes connections to the hosts of one URL.
pub struct Connector {
    hosts: Vec<Host>,
    /// Indexes into `hosts`, in the order to try them.
    order: Mutex<Vec<usize>>,
    tls: PgTlsConnect,
    /// Bound on one address's whole attempt (`connect_timeout`).
    pub(super) per_address: Duration,
    /// The start-up option that sets `statement_timeout`.
    option: String,
    /// What each statement is prefixed with behind a pooler.
    begin: Arc<str>,
    /// The host and address of the last connection made, for the log and `/readyz`.
    in_use: Mutex<Option<String>>,
    /// Which connections these are, in the log: the pool's, or the `LISTEN` connection.
    role: &'static str,
}

impl Connector {
    /// `hosts` are single-host configurations (see `config::libpq::split_hosts`);
    /// statements are bounded on the server by `statement_timeout`.
    pub fn new(
        role: &'static str,
        hosts: Vec<tokio_postgres::Config>,
        tls: PgTlsConnect,
        per_address: Duration,
        statement_timeout: Duration,
    ) -> Self {
        let ms = statement_timeout.as_millis();
        let hosts: Vec<Host> = hosts
            .into_iter()
            .map(|config| Host {
                label: label(&config),
                config,
                pooler: AtomicBool::new(false),
                silent: AtomicBool::new(false),
            })
            .collect();
        Self {
            order: Mutex::new((0..hosts.len()).collect()),
            hosts,
            tls,
            per_address,
            option: format!("-c statement_timeout={ms}"),
            begin: format!("BEGIN; SET LOCAL statement_timeout = {ms}").into(),
            in_use: Mutex::default(),
            role,
        }
    }

    /// Whether the URL asks for the primary (`target_session_attrs=read-write`).
    pub fn wants_primary(&self) -> bool {
        self.hosts.iter().any(|h| {
            h.config.get_target_session_attrs()
                == tokio_postgres::config::TargetSessionAttrs::ReadWrite
        })
    }

    /// Whether a host turned out to be a transaction pooler.
    pub fn behind_pooler(&self) -> bool {
        self.hosts.iter().any(|h| h.pooler.load(Ordering::Relaxed))
    }

    /// The host and address of the last connection made (`host:port (address)`).
    pub fn in_use(&self) -> Option<String> {
        self.in_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A pooled connection to the first host, in the current order, that takes it.
    pub async fn connect(&self) -> Result<PgConn, ConnectError> {
        let (client, connection, begin) = self.open().await?;
        drive(connection);
        Ok(PgConn::new(client, begin))
    }

    /// A connection to the first host, in the current order, that takes it, with its
    /// I/O left to the caller (the `LISTEN` connection reads notifications off it), and
    /// the statement prefix when it goes through a pooler.
    pub async fn open(&self) -> Result<Opened, ConnectError> {
        let order = self
            .order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut attempts = Vec::new();
        for i in order {
            let host = &self.hosts[i];
            let mut silent = true;
            for address in self.addresses(host).await {
                let shown = match address {
                    Some(ip) => format!("{} ({ip})", host.label),
                    None => host.label.clone(),
                };
                match tokio::time::timeout(self.per_address, self.connect_host(host, address)).await
                {
                    Ok(Ok(opened)) => {
                        host.silent.store(false, Ordering::Relaxed);
                        self.answered(shown);
                        return Ok(opened);
                    }
                    Ok(Err(e)) => {
                        silent &= pg_unreachable_io(&e);
                        attempts.push((shown, Failure::Postgres(e)));
                    }
                    Err(_) => attempts.push((shown, Failure::TimedOut(self.per_address))),
                }
            }
            host.silent.store(silent, Ordering::Relaxed);
            self.to_back(i);
        }
        Err(ConnectError { attempts })
    }

    /// The addresses to try for `host`, resolved now (a name a managed failover moved is
    /// followed); `None` to let tokio-postgres connect by itself (an IP address, a Unix
    /// socket, or a name that does not resolve, whose error it then reports).
    async fn addresses(&self, host: &Host) -> Vec<Option<IpAddr>> {
        let port = host.config.get_ports().first().copied().unwrap_or(5432);
        let (Some(PgHost::Tcp(name)), []) =
            (host.config.get_hosts().first(), host.config.get_hostaddrs())
        else {
            return vec![None];
        };
        if name.parse::<IpAddr>().is_ok() {
            return vec![None];
        }
        let resolved = tokio::time::timeout(
            self.per_address,
            tokio::net::lookup_host((name.as_str(), port)),
        )
        .await;
        let mut ips: Vec<IpAddr> = match resolved {
            Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
            _ => return vec![None],
        };
        ips.dedup();
        if ips.is_empty() {
            return vec![None];
        }
        ips.into_iter().map(Some).collect()
    }

    /// Records the connection just made; logs when it goes somewhere new.
    fn answered(&self, shown: String) {
        let mut in_use = self.in_use.lock().unwrap_or_else(PoisonError::into_inner);
        if in_use.as_deref() != Some(shown.as_str()) {
            tracing::info!(connections = self.role, host = %shown, "store {} connections go to {shown}", self.role);
            *in_use = Some(shown);
        }
    }

    /// Moves host `i`, which failed or did not answer, behind the others: behind every
    /// host when it is silent, else before the silent ones (a standby that refuses writes
    /// answers at once; a vanished primary costs `connect_timeout`). Logged when it changes.
    fn to_back(&self, i: usize) {
        let mut order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        let silent = |h: &usize| self.hosts[*h].silent.load(Ordering::Relaxed);
        let before: Vec<usize> = order.clone();
        order.retain(|h| *h != i);
        let at = if silent(&i) {
            order.len()
        } else {
            order.iter().position(silent).unwrap_or(order.len())
        };
        order.insert(at, i);
        if *order != before {
            let shown: Vec<&str> = order
                .iter()
                .map(|h| self.hosts[*h].label.as_str())
                .collect();
            tracing::warn!(connections = self.role, host = %self.hosts[i].label, order = %shown.join(", "), "store host failed or did not answer; hosts are tried in a new order");
        }
    }

    /// One address's attempt; under `sslmode=prefer`, again without TLS when the handshake
    /// fails, as libpq does (a certificate rustls cannot read, a TLS version it refuses).
    async fn connect_host(
        &self,
        host: &Host,
        address: Option<IpAddr>,
    ) -> Result<Opened, tokio_postgres::Error> {
        let mut config = host.config.clone();
        if let Some(ip) = address {
            config.hostaddr(ip);
        }
        match self.connect_with(host, &config).await {
            Err(e) if config.get_ssl_mode() == SslMode::Prefer && chain_has_handshake(&e) => {
                tracing::warn!(host = %host.label, cause = %describe(&e), "sslmode=prefer: the TLS handshake failed, connecting without TLS");
                config.ssl_mode(SslMode::Disable);
                self.connect_with(host, &config).await
            }
            result => result,
        }
    }

    /// An attempt with `config`: with the start-up option, or (a pooler) without it.
    async fn connect_with(
        &self,
        host: &Host,
        config: &tokio_postgres::Config,
    ) -> Result<Opened, tokio_postgres::Error> {
        if !host.pooler.load(Ordering::Relaxed) {
            let mut bounded = config.clone();
            match config.get_options() {
                Some(own) => bounded.options(format!("{own} {}", self.option)),
                None => bounded.options(&self.option),
            };
            match bounded.connect(self.tls.clone()).await {
                Ok((client, connection)) => return Ok((client, connection, None)),
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
        let (client, connection) = config.connect(self.tls.clone()).await?;
        Ok((client, connection, Some(Arc::clone(&self.begin))))
    }
}

/// Runs a connection's I/O until it ends, on the runtime it was opened on (the batches'
/// connections are opened on the store's thread, see [`super::io_thread`]).
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

fn label(config: &tokio_postgres::Config) -> String {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => format!("{h}:{port}"),
        Some(tokio_postgres::config::Host::Unix(dir)) => format!("{}:{port}", dir.display()),
        None => format!("localhost:{port}"),
    }
}

/// Whether an attempt's error means nothing answered (refused, unreachable, reset) rather
/// than a server that answered (read-only, a wrong password, a TLS handshake).
fn pg_unreachable_io(e: &tokio_postgres::Error) -> bool {
    use std::io::ErrorKind as K;
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| {
        matches!(
            io.kind(),
            K::TimedOut
                | K::ConnectionRefused
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::HostUnreachable
                | K::NetworkUnreachable
                | K::NotConnected
                | K::UnexpectedEof
                | K::BrokenPipe
        )
    }) && !chain_has_handshake(e)
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
