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
