//! Prometheus metrics: what the proxy did, how long it took, and what failed.
//!
//! Every metric lives in a registry owned by one [`Metrics`] (no process-global recorder),
//! so two proxies in one test process count separately. `/metrics` on the admin listener
//! renders it in the OpenMetrics text format, which Prometheus scrapes natively.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod admission;
mod exposition;
mod faults;
mod labels;
mod series;

pub use admission::AdmissionSeries;
pub use faults::FaultSeries;
pub use labels::*;

/// The proxy's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    /// Requests by route, outcome and status class (`passed_through` has route `-`).
    pub requests: Family<RouteOutcomeClass, Counter>,
    /// Whole-request latency as the client sees it.
    pub request_seconds: Family<RouteOutcome, Histogram, Buckets>,
    /// `1`, labelled with the running build's version.
    pub build_info: Family<BuildLabels, Gauge>,
    /// Reservations that took over an expired lease (re-executions).
    pub takeovers: Family<RouteLabel, Counter>,
    /// Completions refused by the fence: a stale worker lost its key to a takeover.
    pub fenced_off: Family<RouteLabel, Counter>,
    /// Leases found taken over while their worker was still running.
    pub leases_lost: Family<RouteLabel, Counter>,
    /// Stored answers that could not be opened (key not in the ring, or tampered): each a
    /// retry answered with a problem instead of its answer.
    pub unreadable: Family<RouteLabel, Counter>,
    /// Lease renewals that failed because the store could not be reached.
    pub renewal_errors: Counter,
    /// Completions given up after retrying for the whole retry window.
    pub completions_abandoned: Counter,
    /// The store's faults and the endings held because of them.
    pub faults: FaultSeries,
    /// Detached work admitted and refused.
    pub admission: AdmissionSeries,
    /// Store calls that failed, by operation.
    pub store_errors: Family<OpLabel, Counter>,
    /// Store call latency, by operation.
    pub store_seconds: Family<OpLabel, Histogram, Buckets>,
    /// Upstream calls that failed, by kind.
    pub upstream_errors: Family<KindLabel, Counter>,
    /// Upstream call latency (whole answer), by route.
    pub upstream_seconds: Family<RouteLabel, Histogram, Buckets>,
    /// Rows deleted by the retention sweep.
    pub swept_rows: Counter,
    /// Sweep passes that failed.
    pub sweep_errors: Counter,
    /// Unresolved keys deleted by `sweep.unresolved_retention`.
    pub unresolved_swept: Counter,
    /// Unresolved keys (in progress, lease run out) per route, as last counted.
    pub unresolved_keys: Family<RouteLabel, Gauge>,
    /// Routes `unresolved_keys` has shown, so that one whose keys were all resolved
    /// drops to 0 instead of keeping its last count.
    unresolved_routes: std::sync::Mutex<Vec<Arc<str>>>,
    /// What the reconciler's probes said, by route and outcome (`found`, `not_found`,
    /// `inconclusive`).
    pub reconciled: Family<RouteOutcome, Counter>,
    /// Client connections being served.
    pub connections_open: Gauge,
    /// Client connections that ended in an error, by kind (`header_timeout`,
    /// `head_too_large`, `malformed`, `closed_early`, `tls_handshake`, `other`).
    pub connection_errors: Family<KindLabel, Counter>,
    /// PostgreSQL pool: connections open, idle, and requests waiting for one.
    pub pool_size: Gauge,
    pub pool_available: Gauge,
    pub pool_waiting: Gauge,
    /// Replay cache: bytes held, and reservations answered from memory.
    pub replay_cache_bytes: Gauge,
    pub replay_cache_hits: Counter,
    /// The store's hit count at the last scrape (the counter moves by the difference).
    replay_cache_hits_seen: std::sync::atomic::AtomicU64,
    /// Group commit: batches sent and the writes in them (their ratio is the mean batch).
    pub store_batches: Counter,
    pub store_batched_writes: Counter,
    /// Batches the store refused, whose writes then ran one at a time.
    pub store_batch_fallbacks: Counter,
    /// The store's counts at the last scrape.
    store_batches_seen: std::sync::atomic::AtomicU64,
    store_batched_writes_seen: std::sync::atomic::AtomicU64,
    store_batch_fallbacks_seen: std::sync::atomic::AtomicU64,
    /// The series of `requests` and `request_seconds` already used.
    request_series: RwLock<Vec<RequestSeries>>,
}

/// Handles on one (route, outcome)'s series; they share their values with the families.
struct RequestSeries {
    route: Arc<str>,
    outcome: &'static str,
    class: &'static str,
    count: Counter,
    seconds: Histogram,
}

/// Most (route, outcome) pairs kept in `Metrics::request_series`.
const MAX_CACHED_SERIES: usize = 256;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics for the default timeouts (20 s upstream, 3 s store).
    pub fn new() -> Self {
        Self::with_timeouts(Duration::from_secs(20), Duration::from_secs(3))
    }

    /// Creates every metric and registers it under the `idemproxy_` prefix, with latency
    /// buckets that reach past the timeouts (a request may wait for a duplicate's answer
    /// and then for the upstream, so its buckets reach twice the upstream's).
    pub fn with_timeouts(upstream: Duration, store: Duration) -> Self {
        let m = Metrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(Buckets::reaching(upstream * 2)),
            build_info: Family::default(),
            request_series: RwLock::new(Vec::new()),
            takeovers: Family::default(),
            fenced_off: Family::default(),
            unreadable: Family::default(),
            leases_lost: Family::default(),
            renewal_errors: Counter::default(),
            completions_abandoned: Counter::default(),
            faults: FaultSeries::default(),
            admission: AdmissionSeries::default(),
            store_errors: Family::default(),
            store_seconds: Family::new_with_constructor(Buckets::reaching(store)),
            upstream_errors: Family::default(),
            upstream_seconds: Family::new_with_constructor(Buckets::reaching(upstream)),
            swept_rows: Counter::default(),
            sweep_errors: Counter::default(),
            unresolved_swept: Counter::default(),
            unresolved_keys: Family::default(),
            unresolved_routes: Default::default(),
            reconciled: Family::default(),
            connections_open: Gauge::default(),
            connection_errors: Family::default(),
            pool_size: Gauge::default(),
            pool_available: Gauge::default(),
            pool_waiting: Gauge::default(),
            replay_cache_bytes: Gauge::default(),
            replay_cache_hits: Counter::default(),
            replay_cache_hits_seen: Default::default(),
            store_batches: Counter::default(),
            store_batched_writes: Counter::default(),
            store_batches_seen: Default::default(),
            store_batched_writes_seen: Default::default(),
            store_batch_fallbacks: Counter::default(),
            store_batch_fallbacks_seen: Default::default(),
            registry: Registry::default(),
        };
        let mut registry = Registry::with_prefix("idemproxy");
        m.register(&mut registry);
        m.prime_fixed_series();
        Metrics { registry, ..m }
    }

    /// Registers every series under its name and help text.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Requests by route and outcome",
            self.requests.clone(),
        );
        registry.register(
            "build_info",
            "The running build: its version, as a label",
            self.build_info.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Whole-request latency",
            self.request_seconds.clone(),
        );
        registry.register(
            "takeovers",
            "Expired leases taken over (re-executions)",
            self.takeovers.clone(),
        );
        registry.register(
            "fenced_off_completions",
            "Stale completions refused by the fence",
            self.fenced_off.clone(),
        );
        registry.register(
            "stored_answers_unreadable",
            "Stored answers that could not be decrypted (key missing or data tampered)",
            self.unreadable.clone(),
        );
        registry.register(
            "leases_lost",
            "Leases taken over under a running worker",
            self.leases_lost.clone(),
        );
        registry.register(
            "lease_renewal_errors",
            "Lease renewals that could not reach the store",
            self.renewal_errors.clone(),
        );
        registry.register(
            "completions_abandoned",
            "Completions given up after the retry window",
            self.completions_abandoned.clone(),
        );
        self.faults.register(registry);
        self.admission.register(registry);
        registry.register(
            "store_errors",
            "Failed store calls by operation",
            self.store_errors.clone(),
        );
        registry.register(
            "store_duration_seconds",
            "Store call latency by operation",
            self.store_seconds.clone(),
        );
        registry.register(
            "upstream_errors",
            "Failed upstream calls by kind",
            self.upstream_errors.clone(),
        );
        registry.register(
            "upstream_duration_seconds",
            "Upstream call latency by route",
            self.upstream_seconds.clone(),
        );
        registry.register(
            "swept_rows",
            "Rows deleted by the retention sweep",
            self.swept_rows.clone(),
        );
        registry.register(
            "sweep_errors",
            "Retention sweep passes that failed",
            self.sweep_errors.clone(),
        );
        registry.register(
            "unresolved_swept",
            "Unresolved keys (outcome unknown) deleted by sweep.unresolved_retention",
            self.unresolved_swept.clone(),
        );
        registry.register(
            "unresolved_keys",
            "Keys whose outcome is unknown (in progress, lease run out), per route",
            self.unresolved_keys.clone(),
        );
        registry.register(
            "reconciled",
            "Unresolved keys the reconciler asked the recovery probe about, by what it said",
            self.reconciled.clone(),
        );
        registry.register(
            "connection_errors",
            "Client connections that ended in an error, by kind",
            self.connection_errors.clone(),
        );
        registry.register(
            "connections_open",
            "Client connections being served",
            self.connections_open.clone(),
        );
        registry.register(
            "pool_connections",
            "Store pool connections open",
            self.pool_size.clone(),
        );
        registry.register(
            "pool_available",
            "Store pool connections idle",
            self.pool_available.clone(),
        );
        registry.register(
            "pool_waiting",
            "Requests waiting for a store connection",
            self.pool_waiting.clone(),
        );
        registry.register(
            "replay_cache_bytes",
            "Bytes of completed answers held in memory for replays",
            self.replay_cache_bytes.clone(),
        );
        registry.register(
            "replay_cache_hits",
            "Replays answered from memory, without the store",
            self.replay_cache_hits.clone(),
        );
        registry.register(
            "store_batches",
            "Batches of writes sent to the store (group commit), each one commit",
            self.store_batches.clone(),
        );
        registry.register(
            "store_batched_writes",
            "Writes (reservations, completions, releases) sent in those batches",
            self.store_batched_writes.clone(),
        );
        registry.register(
            "store_batch_fallbacks",
            "Batches the store refused, whose writes then ran one at a time (a warning in the log says why)",
            self.store_batch_fallbacks.clone(),
        );
    }

    /// Series that exist before anything happens: the build, and each store operation's,
    /// upstream error kind's and connection error kind's counter at zero, so that rates and
    /// alerts see them from the first scrape.
    fn prime_fixed_series(&self) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        for op in known::STORE_OPS {
            let _ = self.store_errors.get_or_create(&OpLabel { op });
        }
        for kind in known::UPSTREAM_ERRORS {
            let _ = self.upstream_errors.get_or_create(&KindLabel { kind });
        }
        for kind in known::CONNECTION_ERRORS {
            let _ = self.connection_errors.get_or_create(&KindLabel { kind });
        }
    }

    /// Counts one request, by the class of the status it was answered, and its latency.
    ///
    /// It runs on every request, so the pair of series for a (route, outcome, class) is
    /// looked up once in the families (which hash the labels) and then found in a short
    /// list: there are only a handful of routes, outcomes and classes.
    pub fn observe_request(
        &self,
        route: &Arc<str>,
        outcome: &'static str,
        status: u16,
        elapsed: Duration,
    ) {
        let seconds = elapsed.as_secs_f64();
        let class = status_class(status);
        if let Ok(series) = self.request_series.read() {
            let known = series.iter().find(|s| {
                s.outcome == outcome
                    && s.class == class
                    && (Arc::ptr_eq(&s.route, route) || s.route == *route)
            });
            if let Some(s) = known {
                s.count.inc();
                s.seconds.observe(seconds);
                return;
            }
        }
        let count = self
            .requests
            .get_or_create(&RouteOutcomeClass {
                route: RouteName(Arc::clone(route)),
                outcome,
                status_class: class,
            })
            .clone();
        let seconds_series = self
            .request_seconds
            .get_or_create(&RouteOutcome {
                route: RouteName(Arc::clone(route)),
                outcome,
            })
            .clone();
        count.inc();
        seconds_series.observe(seconds);
        if let Ok(mut series) = self.request_series.write() {
            // Bounded: routes come from the configuration, outcomes and classes are
            // constants.
            if series.len() < MAX_CACHED_SERIES {
                series.push(RequestSeries {
                    route: Arc::clone(route),
                    outcome,
                    class,
                    count,
                    seconds: seconds_series,
                });
            }
        }
    }

    /// Records one store call.
    pub fn observe_store(&self, op: &'static str, elapsed: Duration, ok: bool) {
        let labels = OpLabel { op };
        self.store_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.store_errors.get_or_create(&labels).inc();
        }
    }

    /// Counts a per-route event.
    pub fn count_route(family: &Family<RouteLabel, Counter>, route: &Arc<str>) {
        family
            .get_or_create(&RouteLabel {
                route: RouteName(Arc::clone(route)),
            })
            .inc();
    }
}
