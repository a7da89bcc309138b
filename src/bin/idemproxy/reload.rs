//! SIGHUP: read the configuration file again, validate it whole, and put its routes and
//! policies in force for new requests. An invalid file changes nothing (the running
//! configuration stays, and the log says why); settings that only a restart can change
//! (listeners, the store, the upstream, limits, the background work) are named.

use std::path::PathBuf;

use idemproxy::config::{self, Overrides};
use idemproxy::proxy::Proxy;
use idemproxy::store::KeyStore;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Where the running configuration came from, to read it the same way again.
pub struct Source {
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// Listens for SIGHUP from now on (its default action would end the process).
pub fn listen() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(e) => {
            tracing::warn!(cause = %e, "cannot listen for SIGHUP: the configuration cannot be reloaded");
            None
        }
    }
}

/// Reloads on every SIGHUP, for as long as the proxy serves.
pub async fn on_hangup<S: KeyStore>(proxy: Proxy<S>, source: Source, mut hangups: Signal) {
    while hangups.recv().await.is_some() {
        reload(&proxy, &source);
    }
}

fn reload<S: KeyStore>(proxy: &Proxy<S>, source: &Source) {
    let Some(path) = &source.path else {
        tracing::warn!(
            "SIGHUP: there is no configuration file (--config) to read again; nothing changed"
        );
        return;
    };
    let file = path.display().to_string();
    let new = match config::load(Some(path), &source.overrides) {
        Ok(new) => new,
        Err(e) => {
            tracing::error!(%file, error = %e, "SIGHUP: the configuration was NOT reloaded; the running one stays");
            return;
        }
    };
    for warning in &new.warnings {
        tracing::warn!(%warning, "configuration");
    }
    let done = proxy.reload(&new);
    if !done.needs_restart.is_empty() {
        tracing::warn!(
            %file,
            sections = done.needs_restart.join(", "),
            "SIGHUP: these settings changed in the file but take effect only at a restart; their running values stay"
        );
    }
    tracing::info!(
        %file,
        routes = done.routes,
        "SIGHUP: configuration reloaded: its routes and policies apply to new requests"
    );
}
