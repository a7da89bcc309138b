//! The `idemproxy` binary: parse the command line, set up logging, load the configuration,
//! build the store, bind, and hand over to the library.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use idemproxy::config::{self, Config, Overrides, StoreConfig};
use idemproxy::metrics::Metrics;
use idemproxy::proxy::Proxy;
use idemproxy::store::{AnyStore, KeyStore, PgStore, StoreError, migrate};
use idemproxy::sweep;
use tokio::net::TcpListener;

/// An HTTP reverse proxy that makes retried requests safe with Idempotency-Key semantics.
#[derive(Parser)]
#[command(name = "idemproxy", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct Common {
    /// YAML configuration file.
    #[arg(long, global = true, env = "IDEMPROXY_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Upstream URL (overrides `upstream.url`).
    #[arg(long, global = true)]
    upstream: Option<String>,
    /// PostgreSQL URL (overrides `store`; selects the PostgreSQL store).
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Apply database migrations before serving.
    #[arg(long, global = true)]
    migrate: bool,
    /// Log format; the level comes from RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Serve,
    /// Apply the database migrations and exit.
    Migrate,
    /// Print the effective configuration and route table, or the errors.
    CheckConfig,
    /// Run one retention pass (delete expired keys) and exit.
    Sweep,
    /// Play the seed article's scenarios against the demo provider and print them.
    Demo,
    /// GET a URL and exit 0 on a 2xx answer: a health check for images without a shell.
    Probe {
        /// e.g. http://127.0.0.1:9090/readyz
        url: String,
    },
    /// Run the demo payment provider (300 ms charges, deduplicating by key).
    DemoProvider {
        /// Address to listen on.
        #[arg(long = "provider-listen", default_value = "127.0.0.1:3000")]
        provider_listen: String,
        /// How long a charge takes.
        #[arg(long, default_value = "300ms", value_parser = config::units::parse_duration)]
        charge_time: std::time::Duration,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.common.log_format);
    // `serve` runs one single-threaded runtime per server thread (server::run_threaded);
    // this thread is the first of them. Every other command gets a work-stealing runtime.
    let mut builder = match cli.command {
        None | Some(Command::Serve) => tokio::runtime::Builder::new_current_thread(),
        Some(_) => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemproxy: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idemproxy: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let common = cli.common;
    let overrides = Overrides {
        listen: common.listen.clone(),
        upstream: common.upstream.clone(),
        database_url: common.database_url.clone(),
        admin_token: std::env::var("IDEMPROXY_ADMIN_TOKEN").ok(),
    };
    let path = common.config.as_deref();
    match cli.command.unwrap_or(Command::Serve) {
        Command::CheckConfig => {
            let config = config::load(path, &overrides)?;
            write_stdout(&config.to_string())?;
            for warning in &config.warnings {
                eprintln!("idemproxy: warning: {warning}");
            }
            Ok(())
        }
        Command::Migrate => {
            // Migrating needs only the database, not an upstream.
            let store = postgres_store(&config::load_store(path, &overrides)?)?;
            apply_migrations(&store).await
        }
        Command::Sweep => {
            // Never creates a store: a sweep of the wrong path must not make an empty one.
            let store = AnyStore::open_for_process(&config::load_store(path, &overrides)?, false)
                .context("opening the store")?;
            let full = config::load(path, &overrides).ok();
            let batch = full
                .as_ref()
                .map_or(config::DEFAULT_SWEEP_BATCH, |c| c.sweep_batch);
            let unresolved = full.as_ref().and_then(|c| c.unresolved_retention);
            let deleted = sweep::sweep_once(&store, batch, unresolved, &Metrics::new())
                .await
                .context("sweeping")?;
            write_stdout(&format!("deleted {deleted} expired keys\n"))?;
            Ok(())
        }
        Command::Demo => idemproxy::demo::script::run().await,
        Command::Probe { url } => probe(&url).await,
        Command::DemoProvider {
            provider_listen,
            charge_time,
        } => {
            let listener = TcpListener::bind(&provider_listen)
                .await
                .with_context(|| format!("binding {provider_listen}"))?;
            tracing::info!(listen = %provider_listen, "demo provider listening");
            tokio::select! {
                () = idemproxy::demo::provider::run(listener, charge_time) => {}
                () = idemproxy::shutdown::signal() => {}
            }
            Ok(())
        }
        Command::Serve => serve(Arc::new(config::load(path, &overrides)?), common.migrate).await,
    }
}

async fn probe(url: &str) -> anyhow::Result<()> {
    use http_body_util::Empty;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("`{url}` is not a URL"))?;
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), client.get(uri))
        .await
        .context("timed out")?
        .with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    Ok(())
}

fn postgres_store(store: &StoreConfig) -> anyhow::Result<PgStore> {
    match store {
        StoreConfig::Postgres(pg) => Ok(PgStore::new(pg)?),
        StoreConfig::Embedded { .. } => {
            bail!(
                "no PostgreSQL URL configured: set store.postgres.url, DATABASE_URL or --database-url"
            )
        }
    }
}

/// Writes a command's output. A reader that went away (`check-config | head -1`) is not
/// an error: what it wanted, it got.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

async fn apply_migrations(store: &PgStore) -> anyhow::Result<()> {
    let mut client = store
        .pool()
        .get()
        .await
        .context("connecting to PostgreSQL")?;
    let applied = migrate(&mut client).await.context("applying migrations")?;
    if applied.is_empty() {
        tracing::info!("database schema is up to date");
    } else {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(())
}

async fn serve(config: Arc<Config>, run_migrations: bool) -> anyhow::Result<()> {
    let store = open_store(&config, run_migrations).await?;
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
    let (stop, stopped) = tokio::sync::watch::channel(());
    let admin = tokio::spawn(idemproxy::admin::run(
        admin_listener,
        proxy.clone(),
        config.admin_token.clone(),
        async move {
            let mut stopped = stopped;
            let _ = stopped.changed().await;
        },
    ));
    let sweeper = tokio::spawn(sweep::run(
        store,
        config.sweep_interval,
        config.sweep_batch,
        config.unresolved_retention,
        Arc::clone(proxy.metrics()),
    ));
    let counter = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            proxy
                .run_unresolved_count(idemproxy::proxy::UNRESOLVED_COUNT_INTERVAL)
                .await
        })
    };
    let reconciler = config.reconcile.map(|r| {
        tracing::info!(
            interval = %config::units::format_duration(r.interval),
            batch = r.batch,
            "reconciler on: unresolved keys of routes with a recovery_probe are settled by asking it"
        );
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.run_reconciler(r).await })
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
    sweeper.abort();
    counter.abort();
    if let Some(reconciler) = reconciler {
        reconciler.abort();
    }
    drop(stop);
    let _ = admin.await;
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
/// answers with errors. A database that cannot be reached yet is only a warning:
/// protected requests get `503` until it is back.
async fn open_store(config: &Config, run_migrations: bool) -> anyhow::Result<AnyStore> {
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
    match store.ping().await {
        Ok(()) => {
            if let (AnyStore::Postgres(pg), StoreConfig::Postgres(settings)) =
                (&store, &config.store)
            {
                log_postgres_connection(config, pg, settings);
            }
        }
        Err(e) if e.is_tls() => {
            return Err(e).context("the store cannot be reached securely");
        }
        Err(e @ StoreError::SchemaBehind { .. }) => bail!("the store is not ready: {e}"),
        Err(e) if e.is_unreachable() => {
            tracing::warn!(cause = %e, "store unreachable at start; protected requests get 503 until it is back");
        }
        Err(e) => return Err(e).context("the store answers with an error"),
    }
    Ok(store)
}

/// What the first store connection showed: TLS, a pooler, and how waiting duplicates
/// will be woken.
fn log_postgres_connection(config: &Config, pg: &PgStore, settings: &config::PostgresConfig) {
    let pooler = pg.behind_pooler();
    tracing::info!(
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

/// Server threads: `TOKIO_WORKER_THREADS` if set, else one per core the process may use.
fn server_threads() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}
