//! `FileConfig` → `Config`: defaults, meaning and every cross-field check, with errors that
//! name the offending key (`routes[1].lease: ...`). One file per section: [`upstream`],
//! [`store`], [`routes`] (and their [`policy`]), the [`background`] tasks, [`limits`]; what is left is
//! here.

mod admin;
mod background;
mod client_id;
mod encryption;
mod errors;
mod keys;
mod limits;
mod policy;
mod routes;
mod store;
mod upstream;

use std::net::SocketAddr;

use http::{HeaderName, Method};

use super::file::FileConfig;
use super::identity::ClientIdSource;
use super::model::*;
use super::policy::*;
use crate::config::RouteTable;
use crate::route::PathPattern;
pub use admin::UNNAMED_TOKEN;
use admin::build_admin_tokens;
use background::{build_reconcile, build_sweep, build_tracing};
use client_id::{build_client_id, rotating_identity_warnings};
use encryption::build_encryption;
use limits::build_limits;
use policy::merge_policy;
use routes::build_routes;
use store::build_store;
use upstream::{build_listener_tls, build_upstream};

/// Values given on the command line or in the environment; they win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub upstream: Option<String>,
    pub database_url: Option<String>,
    /// `IDEMPROXY_ADMIN_TOKEN`: secrets belong in the environment, not the file.
    pub admin_token: Option<String>,
    /// The environment `{ env: NAME }` secrets (`encryption.keys`) are read from; `None`:
    /// the process's own. Given by tools that check a configuration for another
    /// environment (a Kubernetes manifest's).
    pub env: Option<std::collections::HashMap<String, String>>,
}

/// Collects every problem instead of stopping at the first, so one `check-config` run shows
/// them all.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, key: impl AsRef<str>, message: impl AsRef<str>) {
        self.0
            .push(format!("{}: {}", key.as_ref(), message.as_ref()));
    }
}

/// Headers a proxy must never store, replay or use as a key header.
pub(crate) const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Puts the command line and environment over the file. A PostgreSQL URL from there
/// replaces the file's URL, but never a store the file chose otherwise: a file that says
/// `store.embedded` and an environment that says PostgreSQL is a deploy slip, and either
/// guess would keep keys where the operator does not look.
fn apply_overrides(p: &mut Problems, file: &mut FileConfig, overrides: &Overrides) {
    if let Some(listen) = &overrides.listen {
        file.listen = Some(listen.clone());
    }
    if let Some(listen) = &overrides.admin_listen {
        file.admin_listen = Some(listen.clone());
    }
    if let Some(url) = &overrides.upstream {
        file.upstream.get_or_insert_with(Default::default).url = Some(url.clone());
    }
    if let Some(token) = &overrides.admin_token {
        file.admin_token = Some(token.clone());
    }
    if let Some(url) = &overrides.database_url {
        let store = file.store.get_or_insert_with(Default::default);
        if store.embedded.is_some() {
            p.push(
                "store",
                "the file chooses `store.embedded`, but DATABASE_URL (or --database-url) names a PostgreSQL store: remove one of them (`store.postgres` in the file takes the URL from the environment)",
            );
            return;
        }
        store.postgres.get_or_insert_with(Default::default).url = Some(url.clone());
    }
}

/// Only the store section, for commands that need nothing else (`migrate`).
pub(crate) fn build_store_only(
    mut file: FileConfig,
    overrides: &Overrides,
) -> Result<StoreConfig, Vec<String>> {
    let mut problems = Problems::default();
    apply_overrides(&mut problems, &mut file, overrides);
    match build_store(&mut problems, &file) {
        Some(store) if problems.0.is_empty() => Ok(store),
        _ => Err(problems.0),
    }
}

pub(crate) fn build(mut file: FileConfig, overrides: &Overrides) -> Result<Config, Vec<String>> {
    let mut problems = Problems::default();
    apply_overrides(&mut problems, &mut file, overrides);

    let listen = parse_addr(
        &mut problems,
        "listen",
        file.listen.as_deref(),
        DEFAULT_LISTEN,
    );
    let admin_listen = parse_addr(
        &mut problems,
        "admin_listen",
        file.admin_listen.as_deref(),
        DEFAULT_ADMIN_LISTEN,
    );
    let upstream = build_upstream(&mut problems, &file);
    let store = build_store(&mut problems, &file);
    let client_id = build_client_id(&mut problems, &file, overrides.env.as_ref());
    let shutdown_grace = file.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0);
    let admin_token = file.admin_token.clone().filter(|t| !t.is_empty());
    let admin_tokens = build_admin_tokens(
        &mut problems,
        admin_listen,
        admin_token.as_deref(),
        file.admin_tokens.as_deref(),
    );
    let (sweep_interval, sweep_batch, unresolved_retention) =
        build_sweep(&mut problems, file.sweep.as_ref());
    let limits = build_limits(
        &mut problems,
        file.limits.as_ref(),
        upstream
            .as_ref()
            .map_or(DEFAULT_UPSTREAM_MAX_CONNECTIONS, |u| u.max_connections),
        matches!(client_id, Some(ClientIdSource::Static(_))),
    );
    let tls = build_listener_tls(&mut problems, file.tls.as_ref());

    let store_timeout = store
        .as_ref()
        .map_or(DEFAULT_STORE_TIMEOUT, StoreConfig::timeout);
    let defaults = file.defaults.unwrap_or_default();
    let base = merge_policy(&mut problems, "defaults", None, &defaults, store_timeout);

    let implicit_routes = file.routes.is_none();
    let errors = base.as_ref().map(|b| b.errors.clone()).unwrap_or_default();
    let routes = match (&file.routes, &base) {
        (None, Some(base)) => vec![Route {
            name: "default".into(),
            methods: vec![Method::POST, Method::PATCH],
            pattern: PathPattern::parse("/*").expect("constant pattern is valid"),
            policy: base.clone(),
        }],
        (Some(routes), _) if routes.is_empty() => {
            problems.push(
                "routes",
                "an empty list protects nothing; leave `routes` out to protect every POST and PATCH that carries a key, or list at least one route",
            );
            Vec::new()
        }
        (Some(routes), Some(base)) => build_routes(&mut problems, routes, base, store_timeout),
        (_, None) => Vec::new(),
    };
    let warnings = routes::shadowed(&routes);
    let reconcile = build_reconcile(&mut problems, file.reconcile.as_ref(), &routes);
    let tracing = build_tracing(&mut problems, file.tracing.as_ref());
    let encryption = build_encryption(
        &mut problems,
        file.encryption.as_ref(),
        overrides.env.as_ref(),
    );
    if encryption.as_ref().is_some_and(|e| e.hash_key.is_some()) && reconcile.is_some() {
        problems.push(
            "encryption.hash_keys",
            "the reconciler (`reconcile:`) asks a recovery_probe about keys it reads back from the store, and a hashed key cannot be read back; leave hash_keys off or reconcile out (a client's retry still asks the probe before re-executing: it carries the clear key)",
        );
    }
    let mut warnings = warnings;
    if let Some(source) = &client_id {
        warnings.extend(rotating_identity_warnings(source, &routes));
    }
    if let Some(StoreConfig::Postgres(pg)) = &store {
        warnings.extend(store::failover_warning(pg));
    }
    if encryption.is_none() && matches!(store, Some(StoreConfig::Postgres(_))) {
        warnings.push(
            "encryption is off: stored answers (bodies and headers) are kept in clear in PostgreSQL, where backups, replicas and psql sessions see them; configure `encryption.keys` (see docs/security.md)".to_owned(),
        );
    }

    match (listen, admin_listen, upstream, store, client_id) {
        (Some(listen), Some(admin_listen), Some(upstream), Some(store), Some(client_id))
            if problems.0.is_empty() =>
        {
            Ok(Config {
                listen,
                admin_listen,
                upstream,
                store,
                client_id,
                routes: RouteTable::new(routes),
                shutdown_grace,
                implicit_routes,
                errors,
                warnings,
                admin_token,
                admin_tokens,
                sweep_interval,
                sweep_batch,
                unresolved_retention,
                reconcile,
                limits,
                tls,
                tracing,
                encryption,
            })
        }
        _ => Err(problems.0),
    }
}

fn parse_addr(
    p: &mut Problems,
    key: &str,
    value: Option<&str>,
    default: &str,
) -> Option<SocketAddr> {
    let text = value.unwrap_or(default);
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            p.push(
                key,
                format!("`{text}` is not an address like 127.0.0.1:8080"),
            );
            None
        }
    }
}

fn header_name(p: &mut Problems, key: String, value: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(value.as_bytes()) {
        Ok(name) if HOP_BY_HOP.contains(&name.as_str()) => {
            p.push(
                key,
                format!("`{value}` is a hop-by-hop header and cannot be used here"),
            );
            None
        }
        Ok(name) => Some(name),
        Err(_) => {
            p.push(key, format!("`{value}` is not a header name"));
            None
        }
    }
}
