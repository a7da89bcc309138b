//! `idemproxy serve`: open the store (the library's [`idemproxy::app::open_store`]), bind,
//! start the admin listener and the background work, serve until a stop signal, drain.

use std::sync::Arc;

use anyhow::{Context, bail};
use idemproxy::app::App;
use idemproxy::config::{self, Config};
use idemproxy::proxy::Proxy;
use tokio::net::TcpListener;

use crate::reload;

pub async fn run(
    config: Arc<Config>,
    run_migrations: bool,
    source: reload::Source,
) -> anyhow::Result<()> {
    // First: until a handler is installed, SIGHUP's default action ends the process.
    let hangups = reload::listen();
    let (store, agreed) = idemproxy::app::open_store(&config, run_migrations).await?;
    for warning in &config.warnings {
        tracing::warn!(%warning, "configuration");
    }
    if config.implicit_routes {
        tracing::info!(
            "no routes configured: every POST and PATCH carrying an idempotency key is protected"
        );
    }
    if matches!(config.client_id, config::ClientIdSource::Static(_)) {
        tracing::warn!(
            "client_id is static: all clients share one key namespace (right for a sidecar behind one caller)"
        );
    }
    let threads = server_threads();
    let listeners = idemproxy::server::bind(config.listen, threads)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let admin_listener = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener {}", config.admin_listen))?;
    tracing::info!(
        listen = %config.listen,
        admin = %config.admin_listen,
        upstream = %config.upstream.origin,
        threads,
        "idemproxy listening"
    );
    let proxy = Proxy::new(Arc::clone(&config), store.clone());
    let agreement = (!agreed).then(|| {
        proxy.hold_keys_until_agreed(
            "the store could not yet be asked which form its idempotency keys are in (encryption.hash_keys); keyed requests wait for it".to_owned(),
        );
        let proxy = proxy.clone();
        tokio::spawn(async move { idemproxy::app::agree_later(proxy).await })
    });
    let app = App::start(proxy.clone(), admin_listener);
    let reloader = hangups.map(|hangups| {
        let proxy = proxy.clone();
        tokio::spawn(async move { reload::on_hangup(proxy, source, hangups).await })
    });
    let tasks = proxy.tasks().clone();
    let shutdown = async move {
        idemproxy::shutdown::signal().await;
        // A second signal means "now": an operator who cannot wait for the drain.
        tokio::spawn(async move {
            idemproxy::shutdown::signal().await;
            tracing::error!(
                still_running = tasks.len(),
                "second stop signal: exiting at once; keys still in flight free up when their leases run out"
            );
            std::process::exit(2);
        });
    };
    let drained =
        idemproxy::server::run_threaded(listeners, proxy, shutdown, config.shutdown_grace)
            .await
            .context("starting the server threads");
    if let Some(agreement) = agreement {
        agreement.abort();
    }
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    app.stop().await;
    if !drained? {
        bail!(
            "the shutdown grace period ({}) ran out with requests still in flight",
            config::units::format_duration(config.shutdown_grace)
        );
    }
    Ok(())
}

/// Server threads: `TOKIO_WORKER_THREADS` if set, else one per core the process may use.
fn server_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}
