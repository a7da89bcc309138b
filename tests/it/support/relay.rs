//! A TCP relay in front of a database that a test can cut and restore, for outages shorter
//! and longer than a lease.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::*;
use tokio::net::TcpListener;

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
    /// Lowered by `stop_accepting`: the listener stays bound but nothing accepts (the
    /// kernel's backlog fills, then connection attempts hang).
    accepting: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Relay {
    pub async fn spawn(target: SocketAddr) -> Self {
        Self::spawn_on("127.0.0.1:0".parse().unwrap(), target).await
    }

    /// A relay listening on `bind` (any loopback address: names in a test's hosts file
    /// point at them).
    pub async fn spawn_on(bind: SocketAddr, target: SocketAddr) -> Self {
        let listener = TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = Relay {
            addr,
            up: Arc::default(),
            conns: Arc::default(),
            frozen: Arc::new(tokio::sync::watch::channel(false).0),
            accepting: Arc::new(tokio::sync::watch::channel(true).0),
        };
        relay.up.store(true, Ordering::SeqCst);
        let r = relay.clone();
        tokio::spawn(async move {
            let mut accepting = r.accepting.subscribe();
            loop {
                if accepting.wait_for(|a| *a).await.is_err() {
                    return;
                }
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

    /// A host gone from the network: open connections go silent (as `freeze`) and new
    /// ones are no longer accepted.
    pub fn stop_accepting(&self) {
        self.accepting.send_replace(false);
        self.freeze();
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
