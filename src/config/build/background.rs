//! `sweep:`, `reconcile:` and `tracing:` — the background tasks.

use std::time::Duration;

use super::Problems;
use crate::config::file::{FileReconcile, FileSweep, FileTracing};
use crate::config::model::*;
use crate::config::policy::*;

/// The sweep's interval, batch and bound on unresolved keys.
pub(super) fn build_sweep(
    problems: &mut Problems,
    sweep: Option<&FileSweep>,
) -> (Duration, i64, Option<Duration>) {
    let interval = sweep
        .and_then(|s| s.interval)
        .map_or(DEFAULT_SWEEP_INTERVAL, |d| d.0);
    if interval.is_zero() {
        problems.push("sweep.interval", "must be more than 0s");
    }
    let batch = sweep.and_then(|s| s.batch).unwrap_or(DEFAULT_SWEEP_BATCH);
    if !(1..=100_000).contains(&batch) {
        problems.push("sweep.batch", "must be between 1 and 100000");
    }
    let unresolved_retention = sweep.and_then(|s| s.unresolved_retention).map(|d| d.0);
    if unresolved_retention.is_some_and(|d| d.is_zero()) {
        problems.push(
            "sweep.unresolved_retention",
            "must be more than 0s (leave it out to keep unresolved keys until they are resolved)",
        );
    }
    (interval, batch, unresolved_retention)
}

/// The reconciler, when configured. It can only ask a `recovery_probe`, so a
/// configuration that turns it on with no route that has one is refused: it would
/// silently do nothing.
pub(super) fn build_reconcile(
    problems: &mut Problems,
    reconcile: Option<&FileReconcile>,
    routes: &[Route],
) -> Option<Reconcile> {
    let file = reconcile?;
    let interval = file.interval.map_or(DEFAULT_RECONCILE_INTERVAL, |d| d.0);
    if interval.is_zero() {
        problems.push("reconcile.interval", "must be more than 0s");
    }
    let batch = file.batch.unwrap_or(DEFAULT_RECONCILE_BATCH);
    if !(1..=10_000).contains(&batch) {
        problems.push("reconcile.batch", "must be between 1 and 10000");
    }
    if !routes.is_empty() && routes.iter().all(|r| r.policy.recovery_probe.is_none()) {
        problems.push(
            "reconcile",
            "no route has a recovery_probe, so the reconciler could never ask whether an operation happened; configure one (defaults.recovery_probe or routes[].recovery_probe) or leave reconcile out",
        );
    }
    Some(Reconcile { interval, batch })
}

/// Span export, when `tracing.otlp_endpoint` is set: an `http://` or `https://` URL of an
/// OTLP/HTTP receiver (a collector's `:4318`); a bare endpoint gets OTLP's `/v1/traces`.
pub(super) fn build_tracing(
    problems: &mut Problems,
    file: Option<&FileTracing>,
) -> Option<Tracing> {
    let file = file?;
    let Some(endpoint) = file.otlp_endpoint.as_deref() else {
        problems.push(
            "tracing.otlp_endpoint",
            "required in a tracing section: the OTLP/HTTP receiver, e.g. http://127.0.0.1:4318",
        );
        return None;
    };
    let uri: http::Uri = match endpoint.parse() {
        Ok(uri) => uri,
        Err(e) => {
            problems.push(
                "tracing.otlp_endpoint",
                format!("`{endpoint}` is not a URL: {e}"),
            );
            return None;
        }
    };
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.authority().is_none() {
        problems.push(
            "tracing.otlp_endpoint",
            format!("`{endpoint}`: use http://host:port or https://host:port (OTLP over HTTP)"),
        );
        return None;
    }
    let traces_url = if matches!(uri.path(), "" | "/") {
        let base = endpoint.trim_end_matches('/');
        match format!("{base}/v1/traces").parse() {
            Ok(u) => u,
            Err(_) => uri,
        }
    } else {
        uri
    };
    let service_name = file
        .service_name
        .clone()
        .unwrap_or_else(|| "idemproxy".to_owned());
    if service_name.is_empty() {
        problems.push("tracing.service_name", "must not be empty");
    }
    Some(Tracing {
        traces_url,
        service_name,
    })
}
