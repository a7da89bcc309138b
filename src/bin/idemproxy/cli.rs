//! The command line: what each subcommand takes.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idemproxy::config;

/// An HTTP reverse proxy that makes retried requests safe with Idempotency-Key semantics.
#[derive(Parser)]
#[command(name = "idemproxy", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct Common {
    /// YAML configuration file.
    #[arg(long, global = true, env = "IDEMPROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long, global = true)]
    pub listen: Option<String>,
    /// Upstream URL (overrides `upstream.url`).
    #[arg(long, global = true)]
    pub upstream: Option<String>,
    /// PostgreSQL URL (overrides `store`; selects the PostgreSQL store).
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Apply database migrations before serving.
    #[arg(long, global = true)]
    pub migrate: bool,
    /// Log format; the level comes from RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Subcommand)]
pub enum Command {
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
pub enum LogFormat {
    Text,
    Json,
}
