//! Series for the store's faults and the endings held because of them: what an alert on
//! a full disk or a crashed server reads.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::KindLabel;

/// The store-fault series.
#[derive(Default)]
pub struct FaultSeries {
    /// `1` while the store shows a fault of this kind (`disk_full`, `out_of_memory`,
    /// `starting_up`, `down`, `unwritable`), else `0`.
    pub store_fault: Family<KindLabel, Gauge>,
    /// Faults begun, by kind.
    pub store_faults: Family<KindLabel, Counter>,
    /// Endings (answers or releases) this process holds because the store refused them:
    /// retries reaching this process are answered from them until they are written.
    pub held_answers: Gauge,
}

impl FaultSeries {
    /// Registers the series, each kind at zero so that alerts see it from the first scrape.
    pub(super) fn register(&self, registry: &mut Registry) {
        for kind in crate::store::Fault::ALL {
            let label = KindLabel {
                kind: kind.as_str(),
            };
            let _ = self.store_fault.get_or_create(&label);
            let _ = self.store_faults.get_or_create(&label);
        }
        registry.register(
            "store_fault",
            "1 while the store shows a fault of this kind (disk full, down, ...)",
            self.store_fault.clone(),
        );
        registry.register(
            "store_faults",
            "Store faults begun, by kind",
            self.store_faults.clone(),
        );
        registry.register(
            "held_answers",
            "Answers held in this process because the store refused to write them",
            self.held_answers.clone(),
        );
    }
}
