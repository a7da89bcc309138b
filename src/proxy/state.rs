//! [`Proxy`] and the state it shares with every connection, server thread and detached
//! execution: the configuration, the live route table, the store, the upstream pool, the
//! metrics, the tracer. In a module of its own so that the request path's stages can all
//! use it without depending on each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::task::TaskTracker;

use super::admission::Admission;
use super::faults::StoreFaults;
use super::held::HeldAnswers;
use super::live::{LiveRoutes, Reloaded, fixed_changes};
use super::observe::{KeyFormHold, Observed};
use crate::config::Config;
use crate::key::KeyForm;
use crate::metrics::Metrics;
use crate::otlp::Tracer;
use crate::store::KeyStore;
use crate::upstream::Forwarder;
use crate::vault::Vault;

/// State shared by every connection and every detached execution.
pub(crate) struct Shared<S> {
    /// Validated configuration as it was at start: everything but the routes is fixed
    /// for the life of the process.
    pub config: Arc<Config>,
    /// The routes and policies in force: replaced by a reload (see `live`), shared by
    /// every server thread.
    pub routes: Arc<LiveRoutes>,
    /// The key table.
    pub store: S,
    /// Pooled upstream client.
    pub forwarder: Forwarder,
    /// What the proxy counts; rendered on the admin listener.
    pub metrics: Arc<Metrics>,
    /// Where spans go, when `tracing:` is configured; `None`: nothing is recorded.
    pub tracer: Option<Arc<Tracer>>,
    /// The key ring sealing stored answers, when `encryption:` is configured.
    pub vault: Option<Arc<Vault>>,
    /// How idempotency keys are stored: as sent, or hashed (`encryption.hash_keys`).
    pub key_form: KeyForm,
    /// Why keyed requests cannot use the store yet, while the store's key form has not
    /// been agreed (see [`Proxy::hold_keys_until_agreed`]); empty: they can.
    pub key_form_hold: Arc<KeyFormHold>,
    /// Endings this process could not write yet, answered to retries from here (see
    /// [`super::held`]); shared by every server thread.
    pub held: Arc<HeldAnswers>,
    /// Slots for detached executions (see [`super::admission`]), shared by every server
    /// thread.
    pub admission: Arc<Admission>,
    /// The store's faults as the request path meets them; readiness reads them.
    pub faults: Arc<StoreFaults>,
    /// The route label of requests that match no route.
    pub unrouted: Arc<str>,
    /// Detached executions (upstream call + completion). They outlive the client's
    /// connection on purpose; shutdown waits for them so no answer is left unstored.
    pub tasks: TaskTracker,
    /// What this replica answered for recent keys (the console's key story).
    pub journal: Arc<super::journal::Journal>,
    /// Raised when shutdown starts, so that readiness turns false at once and load
    /// balancers stop sending; shared by every server thread.
    pub draining: Arc<AtomicBool>,
}

impl<S> Shared<S> {
    /// The store as the request path uses it for `route`: timed, counted, and sealing and
    /// opening answers with the key ring.
    pub fn observed<'a>(&'a self, route: &'a Arc<str>) -> Observed<'a, S> {
        Observed {
            store: &self.store,
            metrics: &self.metrics,
            route,
            vault: self.vault.as_deref(),
            hold: &self.key_form_hold,
            held: &self.held,
            faults: &self.faults,
        }
    }
}

/// The idempotency proxy. Cheap to clone: clones share one state.
pub struct Proxy<S> {
    pub(super) shared: Arc<Shared<S>>,
}

impl<S> Clone for Proxy<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: KeyStore> Proxy<S> {
    /// A proxy in front of `config.upstream`, keeping keys in `store`.
    pub fn new(config: Arc<Config>, store: S) -> Self {
        let forwarder = Forwarder::new(config.upstream.clone(), config.tls.is_some());
        let metrics = Metrics::with_timeouts(config.upstream.timeout, config.store.timeout());
        metrics.prime(&config.routes.names());
        let live = Arc::new(LiveRoutes::new(config.routes.clone()));
        // The exporter runs on the runtime the proxy is built on.
        let tracer = config
            .tracing
            .as_ref()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .map(Tracer::start);
        let vault = config.encryption.as_ref().map(|e| Arc::new(e.vault()));
        let key_form = config.key_form();
        let faults = Arc::new(StoreFaults::new(configured_at(&config)));
        let metrics = Arc::new(metrics);
        let admission = Arc::new(Admission::new(config.limits.detached, Arc::clone(&metrics)));
        Self {
            shared: Arc::new(Shared {
                config,
                routes: live,
                tracer,
                vault,
                key_form,
                key_form_hold: Arc::default(),
                held: Arc::default(),
                admission,
                faults,
                store,
                forwarder,
                metrics,
                unrouted: Arc::from("-"),
                tasks: TaskTracker::new(),
                journal: Arc::default(),
                draining: Arc::default(),
            }),
        }
    }

    /// The same proxy (configuration, store, metrics, detached executions) with an
    /// upstream pool of its own: for a server thread with its own runtime.
    pub fn sibling(&self) -> Self
    where
        S: Clone,
    {
        let shared = &self.shared;
        Self {
            shared: Arc::new(Shared {
                config: Arc::clone(&shared.config),
                routes: Arc::clone(&shared.routes),
                tracer: shared.tracer.clone(),
                vault: shared.vault.clone(),
                key_form: shared.key_form.clone(),
                key_form_hold: Arc::clone(&shared.key_form_hold),
                held: Arc::clone(&shared.held),
                admission: Arc::clone(&shared.admission),
                faults: Arc::clone(&shared.faults),
                store: shared.store.clone(),
                forwarder: shared.forwarder.sibling(),
                metrics: Arc::clone(&shared.metrics),
                unrouted: Arc::clone(&shared.unrouted),
                tasks: shared.tasks.clone(),
                journal: Arc::clone(&shared.journal),
                draining: Arc::clone(&shared.draining),
            }),
        }
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Arc<Config> {
        &self.shared.config
    }

    /// The route table new requests are routed by (the configuration's, or a reload's).
    pub fn routes(&self) -> Arc<crate::config::RouteTable> {
        self.shared.routes.current()
    }

    /// Puts a new configuration's routes and policies in force for new requests; requests
    /// in flight finish under the policy they started with. The caller has validated
    /// `new` whole (`config::load`): an invalid file never gets here. Sections that cannot
    /// change while running are named in the result when they differ, and not applied.
    pub fn reload(&self, new: &Config) -> Reloaded {
        let needs_restart = fixed_changes(&self.shared.config, new);
        self.shared.routes.replace(new.routes.clone());
        let names = new.routes.names();
        self.shared.metrics.prime(&names);
        Reloaded {
            routes: names.len(),
            needs_restart,
        }
    }

    /// The store fault that makes this replica unfit for new keys now, if any: readiness
    /// reports it.
    pub fn store_fault(&self) -> Option<super::Fault> {
        self.shared.faults.not_ready()
    }

    /// The store, for readiness checks.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The key ring stored answers are sealed with, when `encryption:` is configured.
    pub fn vault(&self) -> Option<&Vault> {
        self.shared.vault.as_deref()
    }

    /// How idempotency keys are stored; the admin API finds a row by the clear key
    /// through it.
    pub fn key_form(&self) -> &KeyForm {
        &self.shared.key_form
    }

    /// Keyed requests are answered `503` (a store error saying `why`) until
    /// [`Proxy::release_keys`]: for a start that could not yet agree the key form with the
    /// store.
    pub fn hold_keys_until_agreed(&self, why: String) {
        self.shared.key_form_hold.hold(why);
    }

    /// Lets keyed requests through once the store's key form is agreed.
    pub fn release_keys(&self) {
        self.shared.key_form_hold.release();
    }

    /// Detached executions still running; `server::run` waits for them on shutdown.
    pub fn tasks(&self) -> &TaskTracker {
        &self.shared.tasks
    }

    /// Marks the proxy as shutting down: `/readyz` answers `503` from now on.
    pub fn start_draining(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    /// Whether shutdown has started.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// What this replica answered for recent keys (the console's key story).
    pub fn journal(&self) -> &super::journal::Journal {
        &self.shared.journal
    }

    /// What the proxy has counted; the admin listener renders it.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }
}

/// Where the configured store is: the embedded store's file, or PostgreSQL's hosts.
fn configured_at(config: &Config) -> Option<String> {
    match &config.store {
        crate::config::StoreConfig::Embedded { path, .. } => Some(path.display().to_string()),
        crate::config::StoreConfig::Postgres(pg) => Some(pg.target()),
    }
}

/// The error and its sources, for the log.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
