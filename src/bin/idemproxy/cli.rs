//! The command line. Each subcommand takes only the flags it uses — a flag that would be
//! accepted and ignored (`migrate --listen`) is a slip the operator never hears about —
//! and every environment variable the binary reads is listed in `--help`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idemproxy::config::{self, Overrides};

/// Every environment variable the binary reads, for `--help`.
const ENVIRONMENT: &str = "\
Environment:
  IDEMPROXY_CONFIG       the configuration file (as --config)
  DATABASE_URL           the PostgreSQL URL (as --database-url; selects PostgreSQL)
  IDEMPROXY_ADMIN_TOKEN  the bearer token for /admin/* (takes the place of admin_token)
  IDEMPROXY_LOG_FORMAT   text or json (as --log-format)
  RUST_LOG               log level and filters (default: info)
  TOKIO_WORKER_THREADS   server threads (default: one per core the process may use)";

/// An HTTP reverse proxy that makes retried requests safe with Idempotency-Key semantics.
///
/// With no command it runs the proxy (`serve`).
#[derive(Parser)]
#[command(
    name = "idemproxy",
    version,
    about,
    args_conflicts_with_subcommands = true,
    after_help = ENVIRONMENT
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the proxy (the default).
    #[command(after_help = ENVIRONMENT)]
    Serve(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(StoreArgs),
    /// Print the effective configuration and route table, or every error (exit 1).
    CheckConfig(ProxyArgs),
    /// Run one retention pass (delete expired keys) and exit.
    Sweep(StoreArgs),
    /// Seal every stored answer with the active encryption key (older keys, clear rows)
    /// and exit; safe while the proxy serves.
    Rekey(RekeyArgs),
    /// Move a store of clear idempotency keys to hashed ones (`encryption.hash_keys`) in
    /// one transaction and exit; with every replica stopped.
    RehashKeys(StoreArgs),
    /// Play the seed article's scenarios against the demo provider and print them.
    Demo,
    /// GET a URL and exit 0 on a 2xx answer: a health check for images without a shell.
    Probe {
        /// e.g. http://127.0.0.1:9090/readyz
        url: String,
    },
    /// Run the demo payment provider (300 ms charges, deduplicating by key).
    DemoProvider(ProviderArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub target: ProxyArgs,
    /// Apply database migrations before serving.
    #[arg(long)]
    pub migrate: bool,
    #[command(flatten)]
    pub logging: Logging,
}

/// `migrate` and `sweep`: they need the store, nothing else.
#[derive(Args)]
pub struct StoreArgs {
    #[command(flatten)]
    pub file: ConfigFile,
    #[command(flatten)]
    pub database: DatabaseUrl,
    #[command(flatten)]
    pub logging: Logging,
}

/// `rekey`: the store and the key ring, and how many rows per page.
#[derive(Args)]
pub struct RekeyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Rows read and resealed per page.
    #[arg(long, default_value_t = idemproxy::background::rekey::DEFAULT_BATCH, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch: i64,
}

/// What the proxy runs: the file and the overrides over it. `check-config` takes the same,
/// to check what `serve` would run.
#[derive(Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub file: ConfigFile,
    #[command(flatten)]
    pub proxy: ProxyFlags,
    #[command(flatten)]
    pub database: DatabaseUrl,
}

#[derive(Args)]
pub struct ProviderArgs {
    /// Address to listen on.
    #[arg(
        long,
        visible_alias = "provider-listen",
        default_value = "127.0.0.1:3000"
    )]
    pub listen: String,
    /// How long a charge takes.
    #[arg(long, default_value = "300ms", value_parser = config::units::parse_duration)]
    pub charge_time: std::time::Duration,
    #[command(flatten)]
    pub logging: Logging,
}

#[derive(Args)]
pub struct ConfigFile {
    /// YAML configuration file.
    #[arg(long, env = "IDEMPROXY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Args)]
pub struct ProxyFlags {
    /// Address to listen on (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin address: health, metrics, admin API (overrides `admin_listen`).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Upstream URL (overrides `upstream.url`).
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
}

#[derive(Args)]
pub struct DatabaseUrl {
    /// PostgreSQL URL (overrides `store.postgres.url`; selects the PostgreSQL store).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,
}

#[derive(Args)]
pub struct Logging {
    /// Log format; the level comes from RUST_LOG (default `info`).
    #[arg(long, env = "IDEMPROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Command {
    /// How this command logs (`check-config`, `demo` and `probe` write what they found).
    pub fn log_format(&self) -> LogFormat {
        match self {
            Command::Serve(a) => a.logging.log_format,
            Command::Migrate(a) | Command::Sweep(a) | Command::RehashKeys(a) => {
                a.logging.log_format
            }
            Command::Rekey(a) => a.store.logging.log_format,
            Command::DemoProvider(a) => a.logging.log_format,
            Command::CheckConfig(_) | Command::Demo | Command::Probe { .. } => LogFormat::Text,
        }
    }
}

/// The command line and environment over the file. The admin token comes only from the
/// environment: a secret on a command line is visible to every user of the machine.
pub fn overrides(proxy: Option<&ProxyFlags>, database: &DatabaseUrl) -> Overrides {
    Overrides {
        listen: proxy.and_then(|p| p.listen.clone()),
        admin_listen: proxy.and_then(|p| p.admin_listen.clone()),
        upstream: proxy.and_then(|p| p.upstream.clone()),
        database_url: database.database_url.clone(),
        admin_token: std::env::var("IDEMPROXY_ADMIN_TOKEN").ok(),
        // Key ring secrets are read from the process's own environment.
        env: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("idemproxy").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_is_serve_with_its_flags() {
        let cli = parse(&["--upstream", "http://u", "--admin-listen", "127.0.0.1:1"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.target.proxy.upstream.as_deref(), Some("http://u"));
        assert_eq!(
            cli.serve.target.proxy.admin_listen.as_deref(),
            Some("127.0.0.1:1")
        );
    }

    #[test]
    fn each_command_refuses_flags_it_would_ignore() {
        for args in [
            &["migrate", "--listen", "x"][..],
            &["migrate", "--upstream", "x"],
            &["sweep", "--admin-listen", "x"],
            &["check-config", "--migrate"],
            &["demo-provider", "--upstream", "x"],
            &["demo", "--config", "x"],
            &["probe", "--listen", "x", "http://u"],
            // A serve flag before a command would be ignored by it.
            &["--listen", "x", "migrate"],
        ] {
            let e = parse(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(
                matches!(
                    e.kind(),
                    clap::error::ErrorKind::UnknownArgument
                        | clap::error::ErrorKind::ArgumentConflict
                        | clap::error::ErrorKind::InvalidSubcommand
                ),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn the_demo_provider_listens_where_it_is_told() {
        for flag in ["--listen", "--provider-listen"] {
            let cli = parse(&["demo-provider", flag, "127.0.0.1:7"]).unwrap();
            let Some(Command::DemoProvider(a)) = cli.command else {
                panic!("not demo-provider")
            };
            assert_eq!(a.listen, "127.0.0.1:7");
        }
    }

    #[test]
    fn help_names_every_environment_variable_the_binary_reads() {
        let help = Cli::command().render_long_help().to_string();
        let serve = Cli::command()
            .find_subcommand_mut("serve")
            .map(|c| c.render_long_help().to_string())
            .unwrap_or_default();
        let sources = [
            include_str!("main.rs"),
            include_str!("cli.rs"),
            include_str!("serve.rs"),
            include_str!("commands.rs"),
        ];
        let mut read = Vec::new();
        for source in sources {
            for marker in ["env::var(\"", "env = \""] {
                for part in source.split(marker).skip(1) {
                    if let Some(name) = part.split('"').next()
                        && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    {
                        read.push(name.to_string());
                    }
                }
            }
        }
        read.push("RUST_LOG".into()); // read by tracing's EnvFilter
        assert!(read.len() >= 6, "{read:?}");
        for name in read {
            assert!(help.contains(&name), "--help lacks {name}:\n{help}");
            assert!(serve.contains(&name), "serve --help lacks {name}:\n{serve}");
        }
    }
}
