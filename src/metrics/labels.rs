//! The label sets of the proxy's series: small, `'static` or shared values, so labelling
//! a request costs no allocation.

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// A route name as a label value: shared, so labelling a request costs no allocation.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteName(pub Arc<str>);

impl EncodeLabelValue for RouteName {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

/// `route`, `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcome {
    pub route: RouteName,
    pub outcome: &'static str,
}

/// `route`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: RouteName,
}

/// `op` (reserve, renew, complete, release, sweep, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

/// `kind` (not_sent, timeout, failed).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// `route`, `outcome`, `status_class` (`2xx` … `5xx`): an executed `500` is not a `201`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcomeClass {
    pub route: RouteName,
    pub outcome: &'static str,
    pub status_class: &'static str,
}

/// `version`: which build is running (`idemproxy_build_info`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

/// The class of an HTTP status, as a label value.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The label values known in advance, so that every series an alert rule names exists
/// from the start (at zero) rather than from its first event.
pub mod known {
    /// Store operations (`store_errors_total{op}`, `store_duration_seconds{op}`).
    pub const STORE_OPS: [&str; 4] = ["reserve", "renew", "complete", "release"];
    /// `upstream_errors_total{kind}`.
    pub const UPSTREAM_ERRORS: [&str; 3] = ["not_sent", "timeout", "failed"];
    /// `connection_errors_total{kind}`.
    pub const CONNECTION_ERRORS: [&str; 7] = [
        "header_timeout",
        "send_timeout",
        "head_too_large",
        "malformed",
        "closed_early",
        "tls_handshake",
        "other",
    ];
    /// `reconciled_total{outcome}`.
    pub const RECONCILED: [&str; 3] = ["found", "not_found", "inconclusive"];
    /// Outcomes of a protected request whose status class is fixed, as `requests_total`
    /// is primed with them (`executed` and `replayed` carry the upstream's status; they are
    /// primed at `2xx`).
    pub const REQUEST_OUTCOMES: [(&str, &str); 12] = [
        ("executed", "2xx"),
        ("replayed", "2xx"),
        ("conflict", "4xx"),
        ("mismatch", "4xx"),
        ("rejected", "4xx"),
        ("not_replayable", "4xx"),
        ("outcome_unknown", "4xx"),
        ("store_error", "5xx"),
        ("upstream_error", "5xx"),
        ("failed", "5xx"),
        ("unreadable", "5xx"),
        ("overloaded", "5xx"),
    ];
}

/// Latency buckets: 0.25 ms, doubling, until past `reach` (at least 8 s) — so that a
/// request held for the whole upstream timeout lands in a bucket of its own, not `+Inf`.
#[derive(Clone, Debug)]
pub struct Buckets(Arc<[f64]>);

impl Buckets {
    pub fn reaching(reach: std::time::Duration) -> Self {
        let reach = reach.as_secs_f64().max(8.0);
        let mut bounds = vec![0.000_25];
        while let Some(&last) = bounds.last()
            && last < reach
        {
            bounds.push(last * 2.0);
        }
        Buckets(bounds.into())
    }
}

impl
    prometheus_client::metrics::family::MetricConstructor<
        prometheus_client::metrics::histogram::Histogram,
    > for Buckets
{
    fn new_metric(&self) -> prometheus_client::metrics::histogram::Histogram {
        prometheus_client::metrics::histogram::Histogram::new(self.0.iter().copied())
    }
}
