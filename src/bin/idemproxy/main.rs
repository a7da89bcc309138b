//! The `idemproxy` binary: parse the command line, set up logging, load the configuration,
//! and hand over to the subcommand (`serve` by default).

mod cli;
mod commands;
mod serve;

use anyhow::Context;
use clap::Parser;
use idemproxy::config::{self, Overrides};
use idemproxy::metrics::Metrics;
use idemproxy::store::AnyStore;
use idemproxy::sweep;
use tokio::net::TcpListener;

use cli::{Cli, Command, LogFormat};
use commands::{apply_migrations, postgres_store, probe, write_stdout};

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
        Command::Serve => {
            serve::serve(
                std::sync::Arc::new(config::load(path, &overrides)?),
                common.migrate,
            )
            .await
        }
    }
}
