//! Series for the admission of detached work (see `proxy::admission`): how much the proxy
//! owns, and what it refused, so that a bound that bites is seen before clients complain.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::KindLabel;

/// Why a request was refused admission.
const REASONS: [&str; 3] = ["proxy", "client", "connection"];

/// The admission series.
#[derive(Default)]
pub struct AdmissionSeries {
    /// Detached executions (reservation to stored answer) in progress.
    pub in_use: Gauge,
    /// Protected requests refused with `503` before reserving, by the bound that refused
    /// them: `proxy`, `client`, `connection`.
    pub refused: Family<KindLabel, Counter>,
}

impl AdmissionSeries {
    /// Registers the series, each reason at zero.
    pub(super) fn register(&self, registry: &mut Registry) {
        for kind in REASONS {
            let _ = self.refused.get_or_create(&KindLabel { kind });
        }
        registry.register(
            "detached_executions",
            "Protected requests owned by the proxy (reservation to stored answer), in progress",
            self.in_use.clone(),
        );
        registry.register(
            "admission_refused",
            "Protected requests refused with 503 before reserving, by the bound that refused them",
            self.refused.clone(),
        );
    }
}
