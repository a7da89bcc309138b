//! The pool's connection maker: connection attempts that outlive the call that started
//! them, and the checks a pooled connection passes before it is lent again.
//!
//! Why attempts are detached: a call is bounded by the store timeout, an attempt by
//! `connect_timeout` per address. When the first host vanished (accepts and never answers)
//! and `connect_timeout` is not well under the timeout, every call would give up while its
//! attempt still waited on that host, and the next host would never be tried: an outage
//! that never ends by itself. Here the attempt goes on through the hosts after its caller
//! gave up, and the connection it makes is kept for the next call; calls wait for the next
//! usable connection, not for one to the first host. At most `pool_size` attempts run at
//! once; a call that finds them all busy waits for one of them to end.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use tokio::sync::{Notify, Semaphore, oneshot};

use super::conn::PgConn;
use super::connect::Connector;
use crate::store::connect_error::ConnectError;

/// A pooled connection unused for this long is checked (an empty query, bounded by
/// `connect_timeout`) before it is lent: a host that went silent while the connection
/// sat idle is found out by that, not by the call that would wait on it.
const IDLE_CHECK_AFTER: Duration = Duration::from_secs(15);

/// The pool's connection maker.
pub struct PgManager {
    connector: Arc<Connector>,
    attempts: Arc<Attempts>,
    /// Whether its connections are opened (and so driven) on the store's thread, for
    /// group commit's batches (see [`super::io_thread`]), or on the runtime that asks.
    on_store_thread: bool,
}

/// Attempts in flight, and the connections made after their caller gave up.
struct Attempts {
    /// One permit per attempt in flight.
    slots: Arc<Semaphore>,
    /// Connections whose caller was gone when they were made, for the next calls.
    spare: Mutex<Vec<PgConn>>,
    /// Woken when an attempt ends.
    ended: Notify,
}

impl PgManager {
    pub fn new(connector: Arc<Connector>, pool_size: usize, on_store_thread: bool) -> Self {
        Self {
            on_store_thread,
            connector,
            attempts: Arc::new(Attempts {
                slots: Arc::new(Semaphore::new(pool_size.max(1))),
                spare: Mutex::default(),
                ended: Notify::new(),
            }),
        }
    }

    /// What makes the connections (hosts, order, the one in use).
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The next usable connection: a spare one, or one from an attempt started here, or
    /// (every attempt slot busy) whatever the next attempt to end leaves.
    async fn connection(&self) -> Result<PgConn, ConnectError> {
        loop {
            let ended = self.attempts.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(conn) = self.attempts.take_spare() {
                return Ok(conn);
            }
            if let Ok(slot) = Arc::clone(&self.attempts.slots).try_acquire_owned() {
                let (tx, rx) = oneshot::channel();
                let (connector, attempts) =
                    (Arc::clone(&self.connector), Arc::clone(&self.attempts));
                let attempt = async move {
                    let made = connector.connect().await;
                    if let Err(Ok(conn)) = tx.send(made) {
                        // The caller gave up meanwhile: the next call's.
                        attempts
                            .spare
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(conn);
                    }
                    drop(slot);
                    attempts.ended.notify_waiters();
                };
                // A connection is driven on the runtime it is opened on.
                if self.on_store_thread {
                    super::io_thread::spawn(attempt);
                } else {
                    tokio::spawn(attempt);
                }
                return rx.await.unwrap_or_else(|_| {
                    Err(ConnectError {
                        attempts: Vec::new(),
                    })
                });
            }
            ended.await;
        }
    }
}

impl Attempts {
    /// A spare connection that is still open.
    fn take_spare(&self) -> Option<PgConn> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(conn) = spare.pop() {
            if !conn.client.is_closed() {
                return Some(conn);
            }
        }
        None
    }
}

impl managed::Manager for PgManager {
    type Type = PgConn;
    type Error = ConnectError;

    async fn create(&self) -> Result<PgConn, ConnectError> {
        self.connection().await
    }

    async fn recycle(&self, conn: &mut PgConn, metrics: &Metrics) -> RecycleResult<ConnectError> {
        if conn.client.is_closed() {
            return Err(RecycleError::message("the connection is closed"));
        }
        if conn.is_spoiled() {
            return Err(RecycleError::message(
                "a call on this connection was given up",
            ));
        }
        if metrics.last_used() > IDLE_CHECK_AFTER {
            let check = conn.client.simple_query("");
            if !matches!(
                tokio::time::timeout(self.connector.per_address, check).await,
                Ok(Ok(_))
            ) {
                return Err(RecycleError::message(
                    "an idle connection did not answer its check",
                ));
            }
        }
        Ok(())
    }
}
