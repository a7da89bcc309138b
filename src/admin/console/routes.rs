//! What the console reads of a key's route: the header that marks its replays, and whether
//! its stored bodies may be shown. A route no longer configured reads as the defaults.

use crate::proxy::Proxy;
use crate::store::KeyStore;

/// The header that marks a replay on `route` (`replayed_header`; the default for a route no
/// longer configured).
pub(super) fn replayed_header<S: KeyStore>(proxy: &Proxy<S>, route: &str) -> String {
    proxy.routes().named(route).map_or_else(
        || "Idempotent-Replayed".to_owned(),
        |r| r.policy.replayed_header.as_str().to_owned(),
    )
}

/// Whether a route's stored bodies may be shown (`console_body`); routes no longer
/// configured are shown.
pub(super) fn body_shown<S: KeyStore>(proxy: &Proxy<S>, route: &str) -> bool {
    proxy
        .routes()
        .named(route)
        .is_none_or(|r| r.policy.console_body)
}
