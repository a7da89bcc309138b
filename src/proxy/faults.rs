//! The store's faults as the request path meets them: said once when they begin (which
//! store, where, the server's SQLSTATE and reason, what to do), reminded at a slow pace
//! while they last, said once when they end — and shown in a metric and in readiness.
//!
//! Why: a full disk refuses every new key; one WARN line per refusal buries the cause
//! and never reaches ERROR, and a `/readyz` that stays `200` keeps a load balancer
//! sending traffic to a replica that cannot take it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::metrics::{KindLabel, Metrics};
use crate::store::{StoreError, describe};

pub use crate::store::Fault as FaultKind;

/// How often a fault that goes on is logged again.
const REMIND_EVERY: Duration = Duration::from_secs(60);
/// A fault is over once a write succeeds this long after the fault was last met (a full
/// disk lets some writes through — an update that fits its page — while new keys fail).
const SETTLE: Duration = Duration::from_secs(2);
/// Readiness says "not ready" while a write fault was met this recently: a replica that
/// no traffic reaches any more is tried again after this long.
const NOT_READY_FOR: Duration = Duration::from_secs(5);

/// A fault in progress, as readiness and the admin API show it.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// `postgres` or `embedded`.
    pub store: &'static str,
    /// Where the store is (host, or file), when known.
    pub at: Option<String>,
    /// The server's SQLSTATE, when PostgreSQL gave one.
    pub sqlstate: Option<String>,
    /// The store's own words, each cause once.
    pub reason: String,
    /// When it began (wall clock, for the log and readiness).
    pub since: SystemTime,
    /// Calls it refused since it began.
    pub refused: u64,
    began: Instant,
    last_met: Instant,
    last_logged: Instant,
}

impl Fault {
    /// How long ago it began.
    pub fn lasted(&self) -> Duration {
        self.began.elapsed()
    }

    /// Whether new keys cannot be written (as opposed to a server that is away, which
    /// readiness already finds by asking it).
    fn blocks_writes(&self) -> bool {
        matches!(
            self.kind,
            FaultKind::DiskFull | FaultKind::OutOfMemory | FaultKind::Unwritable
        )
    }
}

/// The fault in progress, if any.
#[derive(Default)]
pub struct StoreFaults {
    /// Whether `current` holds a fault: read without the lock on every store call.
    active: AtomicBool,
    current: Mutex<Option<Fault>>,
    /// Where the store is configured to be (the embedded store's file, PostgreSQL's
    /// hosts), when its error does not say which it tried.
    configured_at: Option<String>,
}

impl StoreFaults {
    /// Faults of a store configured at `at` (the embedded store's file, PostgreSQL's
    /// hosts).
    pub fn new(at: Option<String>) -> Self {
        Self {
            configured_at: at,
            ..Self::default()
        }
    }

    /// A store call failed with `e`; `at` says where the store is.
    pub fn met(&self, e: &StoreError, metrics: &Metrics) {
        let Some(kind) = e.fault() else {
            return;
        };
        let Ok(mut current) = self.current.lock() else {
            return;
        };
        let now = Instant::now();
        if let Some(fault) = current.as_mut().filter(|f| f.kind == kind) {
            fault.refused += 1;
            fault.last_met = now;
            if now.duration_since(fault.last_logged) >= REMIND_EVERY {
                fault.last_logged = now;
                tracing::error!(
                    store = fault.store,
                    at = fault.at.as_deref().unwrap_or("-"),
                    fault = kind.as_str(),
                    sqlstate = fault.sqlstate.as_deref().unwrap_or("-"),
                    lasted_s = fault.lasted().as_secs(),
                    refused = fault.refused,
                    reason = %fault.reason,
                    "store fault goes on: {}",
                    kind.advice()
                );
            }
            return;
        }
        if let Some(old) = current.take() {
            ended(&old, metrics, "another fault took its place");
        }
        let fault = Fault {
            kind,
            store: e.backend().unwrap_or("store"),
            at: e.target().or_else(|| self.configured_at.clone()),
            sqlstate: e.sqlstate().map(str::to_owned),
            reason: describe(e),
            since: SystemTime::now(),
            refused: 1,
            began: now,
            last_met: now,
            last_logged: now,
        };
        tracing::error!(
            store = fault.store,
            at = fault.at.as_deref().unwrap_or("-"),
            fault = kind.as_str(),
            sqlstate = fault.sqlstate.as_deref().unwrap_or("-"),
            since = %httpdate::fmt_http_date(fault.since),
            reason = %fault.reason,
            "store fault: {}",
            kind.advice()
        );
        let label = KindLabel {
            kind: kind.as_str(),
        };
        metrics.faults.store_fault.get_or_create(&label).set(1);
        metrics.faults.store_faults.get_or_create(&label).inc();
        *current = Some(fault);
        self.active.store(true, Ordering::Release);
    }

    /// A store call succeeded (`wrote`: it wrote). Returns whether the store takes writes
    /// as far as is known: no write fault is in progress, or this write ended it.
    pub fn answered(&self, wrote: bool, metrics: &Metrics) -> bool {
        if !self.active.load(Ordering::Acquire) {
            return true;
        }
        let Ok(mut current) = self.current.lock() else {
            return true;
        };
        let Some(fault) = current.as_ref() else {
            return true;
        };
        let over = if fault.blocks_writes() {
            wrote && fault.last_met.elapsed() >= SETTLE
        } else {
            true
        };
        if over {
            ended(fault, metrics, "the store answers again");
            *current = None;
            self.active.store(false, Ordering::Release);
            return true;
        }
        !fault.blocks_writes()
    }

    /// The fault that makes this replica unfit for new keys now, if any.
    pub fn not_ready(&self) -> Option<Fault> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let current = self.current.lock().ok()?;
        current
            .as_ref()
            .filter(|f| f.blocks_writes() && f.last_met.elapsed() < NOT_READY_FOR)
            .cloned()
    }
}

/// Says that `fault` is over, and why.
fn ended(fault: &Fault, metrics: &Metrics, why: &str) {
    tracing::warn!(
        store = fault.store,
        fault = fault.kind.as_str(),
        lasted_s = fault.lasted().as_secs(),
        refused = fault.refused,
        "store fault over: {why}"
    );
    metrics
        .faults
        .store_fault
        .get_or_create(&KindLabel {
            kind: fault.kind.as_str(),
        })
        .set(0);
}
