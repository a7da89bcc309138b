//! `idemproxy serve`: open the store (refusing one that cannot work), bind, start the
//! admin listener and the background work, serve until a stop signal, drain.

use std::sync::Arc;

use anyhow::{Context, bail};
use idemproxy::app::App;
use idemproxy::config::{self, Config, StoreConfig};
use idemproxy::proxy::Proxy;
use idemproxy::store::{AnyStore, Health, KeyFormAgreement, PgStore, SettleKeyForm, StoreError};
use tokio::net::TcpListener;

use crate::commands::apply_migrations;
use crate::reload;

pub async fn run(
    config: Arc<Config>,
    run_migrations: bool,
    source: reload::Source,
) -> anyhow::Result<()> {
    // First: until a handler is installed, SIGHUP's default action ends the process.
    let hangups = reload::listen();
    let (store, agreed) = open_store(&config, run_migrations).await?;
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
        tokio::spawn(async move { agree_later(proxy).await })
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

/// Opens the configured store for this process, says which it is, and refuses to start
/// on one that cannot work: an embedded file another process holds, a PostgreSQL schema
/// that is missing or older than this binary (unless `--migrate`), a database that
/// answers with errors, keys stored in another form than this configuration's
/// (`encryption.hash_keys`). A database that cannot be reached yet is only a warning:
/// protected requests get `503` until it is back. Also says whether the key form was
/// agreed (it could not be with the store unreachable).
async fn open_store(config: &Config, run_migrations: bool) -> anyhow::Result<(AnyStore, bool)> {
    let store = AnyStore::open_for_process(&config.store, true).context("opening the store")?;
    match (&store, &config.store) {
        (AnyStore::Postgres(pg), StoreConfig::Postgres(settings)) => {
            tracing::info!(
                store = "postgres",
                target = %settings.target(),
                "using the PostgreSQL store (shared by every replica on this database)"
            );
            if run_migrations {
                apply_migrations(pg).await?;
            }
        }
        (AnyStore::Embedded(embedded), _) => tracing::warn!(
            store = "embedded",
            path = %embedded.path().display(),
            "using the embedded store: for ONE proxy instance only; instances with separate files do not share keys (use PostgreSQL for replicas)"
        ),
        (AnyStore::Postgres(_), StoreConfig::Embedded { .. }) => {}
    }
    let form = config.key_form();
    let agreed = match store.ping().await {
        Ok(()) => {
            if let (AnyStore::Postgres(pg), StoreConfig::Postgres(settings)) =
                (&store, &config.store)
            {
                log_postgres_connection(config, pg, settings);
                log_server_advice(pg).await;
            }
            match store.settle_key_form(form.marker()).await {
                Ok(KeyFormAgreement::Agreed) => true,
                Ok(KeyFormAgreement::Differs { stored }) => {
                    bail!("{}", form_differs(&stored, form.marker()))
                }
                Err(e) if e.is_unreachable() => false,
                Err(e) => return Err(e).context("asking the store which form its keys are in"),
            }
        }
        Err(e) if e.is_tls() => {
            return Err(e).context("the store cannot be reached securely");
        }
        Err(e @ StoreError::SchemaBehind { .. }) => bail!("the store is not ready: {e}"),
        Err(e) if e.is_unreachable() => {
            tracing::warn!(cause = %e, "store unreachable at start; protected requests get 503 until it is back");
            false
        }
        Err(e) => return Err(e).context("the store answers with an error"),
    };
    Ok((store, agreed))
}

/// Why a store whose keys are in `stored` cannot be served with this configuration's form.
fn form_differs(stored: &str, ours: &str) -> String {
    let describe = |marker: &str| match marker {
        "clear" => "as sent (encryption.hash_keys off)".to_owned(),
        other => format!("as keyed hashes (encryption.hash_keys: true; hash_key verifier {other})"),
    };
    format!(
        "encryption.hash_keys: the store's idempotency keys are kept {}, and this configuration would keep them {}: it would not find them, and every retry of a stored key would execute again. Configure encryption.hash_keys and encryption.hash_key as the replicas that wrote them do; the form can change only while the store holds no keys (docs/security.md)",
        describe(stored),
        describe(ours)
    )
}

/// Agrees the key form once the store answers, holding keyed requests back until then.
/// A store in another form keeps them held, said loudly: serving them would execute
/// retries again.
async fn agree_later(proxy: Proxy<AnyStore>) {
    let marker = proxy.key_form().marker().to_owned();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        match proxy.store().settle_key_form(&marker).await {
            Ok(KeyFormAgreement::Agreed) => {
                proxy.release_keys();
                tracing::info!("the store's key form is agreed; keyed requests are served");
                return;
            }
            Ok(KeyFormAgreement::Differs { stored }) => {
                let why = form_differs(&stored, &marker);
                tracing::error!(
                    "{why}; keyed requests are refused with 503 until the configuration is fixed"
                );
                proxy.hold_keys_until_agreed(why);
                return;
            }
            Err(_) => {}
        }
    }
}

/// What the first store connection showed: TLS, a pooler, and how waiting duplicates
/// will be woken.
fn log_postgres_connection(config: &Config, pg: &PgStore, settings: &config::PostgresConfig) {
    let pooler = pg.behind_pooler();
    tracing::info!(
        host = pg.connected_to().as_deref().unwrap_or("?"),
        tls = %settings.tls.summary(),
        encrypted = pg.tls_used(),
        transaction_pooler = pooler,
        "store connection made"
    );
    let waits = config
        .routes
        .routes()
        .iter()
        .any(|r| matches!(r.policy.on_conflict, config::OnConflict::Wait(_)));
    if !waits {
        return;
    }
    match (&settings.listen_url, pooler) {
        (Some(_), _) => {
            tracing::info!("waiting duplicates are woken by LISTEN on store.postgres.listen_url")
        }
        (None, false) => {
            tracing::info!("waiting duplicates are woken by LISTEN on the store's URL")
        }
        (None, true) => tracing::warn!(
            "the store's URL goes through a transaction pooler, which drops notifications: waiting duplicates fall back to a 1 s re-check; set store.postgres.listen_url to a direct connection"
        ),
    }
}

/// The server settings far from what the key table's churn needs (autovacuum, WAL
/// spacing, durable commits), one warning each; not a reason to refuse to start.
async fn log_server_advice(pg: &PgStore) {
    match pg.server_advice().await {
        Ok(advice) => {
            for line in &advice {
                tracing::warn!(advice = %line, "a database server setting is far off");
            }
            tracing::info!(
                far_off = advice.len(),
                "database server settings checked (docs/stores.md, \"Tuning the server\")"
            );
        }
        Err(e) => tracing::debug!(cause = %e, "could not read the database server's settings"),
    }
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
