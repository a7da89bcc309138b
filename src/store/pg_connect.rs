//! Making the store's connections: each host of a multi-host URL tried in turn, each
//! attempt (TCP, TLS, start-up, `target_session_attrs` check) bounded as a whole, the host
//! that answered last tried first.
//!
//! tokio-postgres would try the hosts itself, but in a fixed order and with only the TCP
//! connect bounded: a primary that vanished behind a live address (a frozen VM, a proxy
//! that accepts and never answers) would hold every new connection until the store call
//! gives up, and the service would not come back after a promotion.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use tokio_postgres::Client;

use super::pg_tls::PgTlsConnect;
use crate::store::describe;

/// One host's connection settings, and how to name it in errors.
struct Host {
    config: tokio_postgres::Config,
    label: String,
}

/// The pool's connection maker.
pub struct PgManager {
    hosts: Vec<Host>,
    /// The host that answered last: tried first next time.
    preferred: AtomicUsize,
    tls: PgTlsConnect,
    /// Bound on one host's whole attempt.
    per_host: Duration,
}

impl PgManager {
    /// `hosts` are single-host configurations (see `config::libpq::split_hosts`).
    pub fn new(hosts: Vec<tokio_postgres::Config>, tls: PgTlsConnect, per_host: Duration) -> Self {
        let hosts = hosts
            .into_iter()
            .map(|config| Host {
                label: label(&config),
                config,
            })
            .collect();
        Self {
            hosts,
            preferred: AtomicUsize::new(0),
            tls,
            per_host,
        }
    }

    /// A connection to the first host (starting with the preferred one) that takes it.
    pub async fn connect(&self) -> Result<PgConn, ConnectError> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut attempts = Vec::new();
        for i in (0..self.hosts.len()).map(|n| (first + n) % self.hosts.len()) {
            let host = &self.hosts[i];
            let attempt =
                tokio::time::timeout(self.per_host, host.config.connect(self.tls.clone()));
            match attempt.await {
                Ok(Ok((client, connection))) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(cause = %describe(&e), "store connection ended");
                        }
                    });
                    return Ok(PgConn {
                        client,
                        spoiled: Arc::default(),
                    });
                }
                Ok(Err(e)) => attempts.push((host.label.clone(), Failure::Postgres(e))),
                Err(_) => attempts.push((host.label.clone(), Failure::TimedOut(self.per_host))),
            }
        }
        Err(ConnectError { attempts })
    }
}

/// A pooled connection.
pub struct PgConn {
    client: Client,
    /// Raised when a call on this connection was given up (its statement may still be
    /// running, or the server stopped answering): it is not lent again.
    spoiled: Arc<AtomicBool>,
}

impl PgConn {
    /// A handle that marks this connection unfit for reuse.
    pub fn spoiler(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.spoiled)
    }
}

impl std::ops::Deref for PgConn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::DerefMut for PgConn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
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
