//! The loops that settle unresolved keys and count them: the reconciler asks each route's
//! `recovery_probe` about keys whose outcome is unknown ([`Proxy::reconcile_once`], which
//! the request path's own machinery carries out), and the gauge of unresolved keys is kept
//! up to date for the alert that says someone must look.

use std::time::Duration;

use crate::config::Reconcile;
use crate::proxy::{Proxy, Reconciled};
use crate::store::{KeyStore, Maintenance};

/// How often the unresolved-keys gauge is brought up to date.
pub const UNRESOLVED_COUNT_INTERVAL: Duration = Duration::from_secs(15);

/// Reconciles every `reconcile.interval` for as long as it is polled, then brings the
/// unresolved-keys gauge up to date.
pub async fn reconcile<S: KeyStore + Maintenance>(proxy: Proxy<S>, reconcile: Reconcile) {
    loop {
        tokio::time::sleep(reconcile.interval).await;
        match proxy.reconcile_once(reconcile).await {
            Ok(r) if r == Reconciled::default() => {}
            Ok(r) => tracing::info!(
                found = r.found,
                not_found = r.not_found,
                inconclusive = r.inconclusive,
                "reconciler pass"
            ),
            Err(e) => tracing::warn!(cause = %e, "reconciler pass failed; will try again"),
        }
        proxy.count_unresolved().await;
    }
}

/// Counts unresolved keys every `every`, for as long as it is polled.
pub async fn run_count<S: KeyStore + Maintenance>(proxy: Proxy<S>, every: Duration) {
    loop {
        proxy.count_unresolved().await;
        tokio::time::sleep(every).await;
    }
}
