//! The `idemproxy` binary: parse the command line, set up logging, load the configuration,
//! and hand over to the subcommand (`serve` by default).

mod cli;
mod commands;
mod logging;
mod reload;
mod serve;

use anyhow::Context;
use clap::Parser;
use idemproxy::background::sweep;
use idemproxy::config;
use idemproxy::metrics::Metrics;
use idemproxy::store::AnyStore;
use tokio::net::TcpListener;

use cli::{Cli, Command};
use commands::{apply_migrations, postgres_store, probe, write_stdout};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve(cli.serve));
    let format = command.log_format();
    logging::init(format);
    // `serve` runs one single-threaded runtime per server thread (server::run_threaded);
    // this thread is the first of them. Every other command gets a work-stealing runtime.
    let mut builder = match command {
        Command::Serve(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let result = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")
        .and_then(|runtime| runtime.block_on(run(command)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal(format, &e);
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::CheckConfig(args) => {
            let overrides = cli::overrides(Some(&args.proxy), &args.database);
            let config = config::load(args.file.config.as_deref(), &overrides)?;
            write_stdout(&config.to_string())?;
            write_stdout(&idemproxy::problem::rendered_templates(&config))?;
            for warning in &config.warnings {
                eprintln!("idemproxy: warning: {warning}");
            }
            Ok(())
        }
        Command::Migrate(args) => {
            // Migrating needs only the database, not an upstream.
            let overrides = cli::overrides(None, &args.database);
            let store = postgres_store(&config::load_store(
                args.file.config.as_deref(),
                &overrides,
            )?)?;
            apply_migrations(&store).await
        }
        Command::Sweep(args) => {
            let overrides = cli::overrides(None, &args.database);
            let path = args.file.config.as_deref();
            // Never creates a store: a sweep of the wrong path must not make an empty one.
            let store = AnyStore::open_for_process(&config::load_store(path, &overrides)?, false)
                .context("opening the store")?;
            let full = config::load(path, &overrides).ok();
            let batch = full
                .as_ref()
                .map_or(config::DEFAULT_SWEEP_BATCH, |c| c.sweep_batch);
            let unresolved = full.as_ref().and_then(|c| c.unresolved_retention);
            let deleted = sweep::once(&store, batch, unresolved, &Metrics::new())
                .await
                .context("sweeping")?;
            write_stdout(&format!("deleted {deleted} expired keys\n"))?;
            Ok(())
        }
        Command::Rekey(args) => rekey(&args).await,
        Command::RehashKeys(args) => rehash_keys(&args).await,
        Command::Demo => idemproxy::demo::script::run().await,
        Command::Probe { url } => probe(&url).await,
        Command::DemoProvider(args) => {
            let listener = TcpListener::bind(&args.listen)
                .await
                .with_context(|| format!("binding {}", args.listen))?;
            tracing::info!(listen = %args.listen, "demo provider listening");
            tokio::select! {
                () = idemproxy::demo::provider::run(listener, args.charge_time) => {}
                () = idemproxy::shutdown::signal() => {}
            }
            Ok(())
        }
        Command::Serve(args) => {
            let target = &args.target;
            let overrides = cli::overrides(Some(&target.proxy), &target.database);
            let config = config::load(target.file.config.as_deref(), &overrides)?;
            let source = reload::Source {
                path: target.file.config.clone(),
                overrides,
            };
            serve::run(std::sync::Arc::new(config), args.migrate, source).await
        }
    }
}

/// `idemproxy rehash-keys`: the store's clear keys moved to the configured hashed form, all
/// at once or not at all; refused while a lease is held (a replica is still serving).
async fn rehash_keys(args: &cli::StoreArgs) -> anyhow::Result<()> {
    use idemproxy::store::RehashKeys;
    let overrides = cli::overrides(None, &args.database);
    let config = config::load(args.file.config.as_deref(), &overrides)?;
    let Some(encryption) = config.encryption.as_ref().filter(|e| e.hash_key.is_some()) else {
        anyhow::bail!(
            "encryption.hash_keys: the configuration does not hash keys: give it `hash_keys: true` and a `hash_key`, as the replicas will run"
        );
    };
    let store = AnyStore::open_for_process(&config.store, false)
        .context("opening the store (stop the proxy that serves it first)")?;
    idemproxy::store::Health::ping(&store)
        .await
        .context("checking the store")?;
    let vault = encryption.vault();
    let done = store
        .rehash_keys(&encryption.key_form(), Some(&vault))
        .await
        .context("rehashing keys (nothing was changed)")?;
    let summary = if done.already {
        "the store's keys are hashed with this hash_key already; nothing to do".to_owned()
    } else {
        format!(
            "hashed {} keys ({} stored answers sealed again with key `{}`); start the replicas with this configuration",
            done.keys,
            done.resealed,
            vault.active()
        )
    };
    write_stdout(&format!("{summary}\n"))?;
    Ok(())
}

/// `idemproxy rekey`: one pass over the table with the configured ring; exits non-zero when
/// some answers could not be opened (their key is no longer in the ring), since removing
/// a key is only safe once nothing needs it.
async fn rekey(args: &cli::RekeyArgs) -> anyhow::Result<()> {
    let overrides = cli::overrides(None, &args.store.database);
    let config = config::load(args.store.file.config.as_deref(), &overrides)?;
    let Some(encryption) = &config.encryption else {
        anyhow::bail!(
            "encryption: is not configured, so there is no key to seal with: add `encryption.keys` and `encryption.active` to the configuration"
        );
    };
    // Never creates a store; an embedded store a running proxy serves is locked by it.
    let store = AnyStore::open_for_process(&config.store, false).context(
        "opening the store (an embedded store that a running proxy serves is locked by it: ask that proxy instead, POST /admin/rekey on its admin listener)",
    )?;
    idemproxy::store::Health::ping(&store)
        .await
        .context("checking the store")?;
    let report = idemproxy::background::rekey::once(&store, &encryption.vault(), args.batch)
        .await
        .context("rekeying")?;
    write_stdout(&format!("{}\n", report.summary()))?;
    if !report.unreadable.is_empty() {
        anyhow::bail!(
            "some stored answers are sealed with keys not in encryption.keys; keep those keys (or let the answers expire) before removing any"
        );
    }
    Ok(())
}
