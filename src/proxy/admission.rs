//! Admission of work the proxy owns: a protected request, from its reservation to its
//! stored answer, runs detached from its client (so that a client leaving changes
//! nothing) — and so a client that sends keyed requests and leaves at once could pile up
//! unbounded work: memory, upstream calls, store writes. Each detached execution takes a
//! slot, globally, for its client id and for its connection, **before** anything is
//! reserved; past a bound the request gets `503` with `Retry-After` and nothing was
//! reserved or forwarded. On HTTP/2 a reset stream's work keeps its connection's slot
//! until it finishes, so resetting streams does not make room for more.
//!
//! The references: Envoy's overload manager (a resource monitor triggering an action) and
//! Go's fix for CVE-2023-44487 (a reset stream's handler still counts against the
//! connection's concurrency).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::config::Detached;
use crate::metrics::{KindLabel, Metrics};

/// Shards of the per-client counts: requests of different clients rarely share a lock.
const SHARDS: usize = 16;

/// The slots in use, and their bounds.
pub(crate) struct Admission {
    bounds: Detached,
    in_use: AtomicUsize,
    /// Slots in use per client id, only for clients that hold one.
    clients: [Mutex<HashMap<String, usize>>; SHARDS],
    hasher: RandomState,
    metrics: Arc<Metrics>,
    /// When the refusals were last logged (seconds since `started`, plus one; 0: never):
    /// they come in floods, so one line per [`LOG_EVERY`] says what goes on.
    logged: AtomicU64,
    started: Instant,
}

/// How often a refusal is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The detached executions of one client connection (HTTP/2: its streams' work, reset or
/// not). Carried in the request's extensions.
#[derive(Debug, Default)]
pub struct ConnectionWork(AtomicUsize);

/// Which bound refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The whole process's.
    Proxy,
    /// Its client id's.
    Client,
    /// Its connection's.
    Connection,
}

impl Refused {
    /// Stable label, for metrics and the problem's detail.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Proxy => "proxy",
            Refused::Client => "client",
            Refused::Connection => "connection",
        }
    }
}

/// A slot, given back when the detached execution ends (dropped).
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    client: String,
    connection: Option<Arc<ConnectionWork>>,
}

impl Admission {
    pub fn new(bounds: Detached, metrics: Arc<Metrics>) -> Self {
        Self {
            bounds,
            in_use: AtomicUsize::new(0),
            clients: std::array::from_fn(|_| Mutex::default()),
            hasher: RandomState::new(),
            metrics,
            logged: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// A slot for a detached execution of `client`'s on `connection`, or which bound
    /// refused it.
    pub fn admit(
        self: &Arc<Self>,
        client: &str,
        connection: Option<&Arc<ConnectionWork>>,
    ) -> Result<Admitted, Refused> {
        if let Some(conn) = connection
            && !take(&conn.0, self.bounds.per_connection)
        {
            return Err(self.refused(Refused::Connection));
        }
        let give_back_connection = || {
            if let Some(conn) = connection {
                conn.0.fetch_sub(1, Ordering::AcqRel);
            }
        };
        if !take(&self.in_use, self.bounds.max) {
            give_back_connection();
            return Err(self.refused(Refused::Proxy));
        }
        let taken = {
            let mut clients = self.shard(client);
            let held = clients.entry(client.to_owned()).or_insert(0);
            if *held < self.bounds.per_client {
                *held += 1;
                true
            } else {
                false
            }
        };
        if !taken {
            self.in_use.fetch_sub(1, Ordering::AcqRel);
            give_back_connection();
            return Err(self.refused(Refused::Client));
        }
        self.metrics.admission.in_use.inc();
        Ok(Admitted {
            admission: Arc::clone(self),
            client: client.to_owned(),
            connection: connection.cloned(),
        })
    }

    fn refused(&self, why: Refused) -> Refused {
        self.metrics
            .admission
            .refused
            .get_or_create(&KindLabel { kind: why.as_str() })
            .inc();
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.logged.load(Ordering::Acquire);
        if (last == 0 || now >= last + LOG_EVERY.as_secs())
            && self
                .logged
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::warn!(
                bound = why.as_str(),
                in_flight = self.in_use.load(Ordering::Acquire),
                max = self.bounds.max,
                per_client = self.bounds.per_client,
                per_connection = self.bounds.per_connection,
                "refusing protected requests with 503: detached work is at its bound (limits.detached; idemproxy_admission_refused_total counts them)"
            );
        }
        why
    }

    fn shard(&self, client: &str) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        let i = (self.hasher.hash_one(client) as usize) % SHARDS;
        // Counts stay consistent even if a holder panicked: each change is one step.
        self.clients[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Slots in use in the whole process.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }
}

/// Takes one of `bound` slots from `count`; false when none is left.
fn take(count: &AtomicUsize, bound: usize) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < bound).then_some(n + 1)
        })
        .is_ok()
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let admission = &self.admission;
        {
            let mut clients = admission.shard(&self.client);
            if let Some(held) = clients.get_mut(&self.client) {
                *held -= 1;
                if *held == 0 {
                    clients.remove(&self.client);
                }
            }
        }
        admission.in_use.fetch_sub(1, Ordering::AcqRel);
        if let Some(conn) = &self.connection {
            conn.0.fetch_sub(1, Ordering::AcqRel);
        }
        admission.metrics.admission.in_use.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max: usize, per_client: usize, per_connection: usize) -> Arc<Admission> {
        Arc::new(Admission::new(
            Detached {
                max,
                per_client,
                per_connection,
            },
            Arc::new(Metrics::new()),
        ))
    }

    /// One client cannot take every slot; another still gets one; a slot given back is
    /// free again.
    #[test]
    fn a_client_is_bounded_and_others_still_served() {
        let a = admission(4, 2, 10);
        let first = a.admit("attacker", None).unwrap();
        let _second = a.admit("attacker", None).unwrap();
        assert_eq!(a.admit("attacker", None).err(), Some(Refused::Client));
        let _bystander = a.admit("shop-1", None).unwrap();
        drop(first);
        let _third = a.admit("attacker", None).unwrap();
        assert_eq!(a.in_use(), 3, "the refused ones took nothing");
    }

    /// The whole process's bound holds across clients.
    #[test]
    fn the_process_is_bounded() {
        let a = admission(2, 2, 10);
        let _x = a.admit("a", None).unwrap();
        let _y = a.admit("b", None).unwrap();
        assert_eq!(a.admit("c", None).err(), Some(Refused::Proxy));
    }

    /// A connection's work counts until it ends, whatever became of its streams.
    #[test]
    fn a_connection_is_bounded_until_its_work_ends() {
        let a = admission(10, 10, 1);
        let conn = Arc::new(ConnectionWork::default());
        let held = a.admit("a", Some(&conn)).unwrap();
        assert_eq!(a.admit("a", Some(&conn)).err(), Some(Refused::Connection));
        assert_eq!(a.in_use(), 1);
        drop(held);
        let _again = a.admit("a", Some(&conn)).unwrap();
    }
}
