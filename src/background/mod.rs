//! What a running proxy does besides answering requests: the retention sweep ([`sweep`]),
//! the reconciler's loop and the unresolved-keys gauge ([`unresolved`]); and the rekey pass
//! ([`rekey`]) that an operator starts. Each job has one shape: `once` is a pass (what the
//! one-shot commands, the admin API and the tests run), `run` repeats it for as long as it
//! is polled.
//!
//! [`Background::start`] is the one place the loops are started, for the binary and the
//! test harness alike, so that a test proxy does what a deployed one does.

pub mod rekey;
pub mod sweep;
pub mod unresolved;

use tokio::task::JoinHandle;

use crate::proxy::Proxy;
use crate::store::{Health, KeyStore, Maintenance};

/// The background loops of one proxy, started together and stopped together (also when
/// dropped).
pub struct Background {
    tasks: Vec<JoinHandle<()>>,
}

impl Background {
    /// Starts the loops `proxy`'s configuration asks for: the sweep and the unresolved-keys
    /// gauge always, the reconciler when `reconcile:` turns it on.
    pub fn start<S: KeyStore + Maintenance + Health + Clone>(proxy: &Proxy<S>) -> Self {
        let config = proxy.config();
        let mut tasks = vec![
            tokio::spawn(sweep::run(
                proxy.store().clone(),
                config.sweep_interval,
                config.sweep_batch,
                config.unresolved_retention,
                std::sync::Arc::clone(proxy.metrics()),
            )),
            tokio::spawn(unresolved::run_count(
                proxy.clone(),
                unresolved::UNRESOLVED_COUNT_INTERVAL,
            )),
        ];
        if let Some(r) = config.reconcile {
            tracing::info!(
                interval = %crate::config::units::format_duration(r.interval),
                batch = r.batch,
                "reconciler on: unresolved keys of routes with a recovery_probe are settled by asking it"
            );
            tasks.push(tokio::spawn(unresolved::reconcile(proxy.clone(), r)));
        }
        Background { tasks }
    }

    /// Stops every loop (a pass in progress is abandoned: each is safe to cut anywhere).
    pub fn stop(mut self) {
        self.abort_all();
    }

    fn abort_all(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.abort_all();
    }
}
