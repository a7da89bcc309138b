//! `FileConfig` → `Config`: defaults, meaning and every cross-field check, with errors that
//! name the offending key (`routes[1].lease: ...`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method};

use super::file::{FileConfig, FileOnConflict, FilePolicy, FileRoute};
use super::model::*;
use super::units::format_duration;
use crate::route::{PathPattern, RouteTable};

/// Values given on the command line or in the environment; they win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub database_url: Option<String>,
    /// `IDEMPROXY_ADMIN_TOKEN`: secrets belong in the environment, not the file.
    pub admin_token: Option<String>,
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

fn apply_overrides(file: &mut FileConfig, overrides: &Overrides) {
    if let Some(listen) = &overrides.listen {
        file.listen = Some(listen.clone());
    }
    if let Some(url) = &overrides.upstream {
        file.upstream.get_or_insert_with(Default::default).url = Some(url.clone());
    }
    if let Some(token) = &overrides.admin_token {
        file.admin_token = Some(token.clone());
    }
    if let Some(url) = &overrides.database_url {
        let store = file.store.get_or_insert_with(Default::default);
        store.embedded = None;
        store.postgres.get_or_insert_with(Default::default).url = Some(url.clone());
    }
}

/// Only the store section, for commands that need nothing else (`migrate`).
pub(crate) fn build_store_only(
    mut file: FileConfig,
    overrides: &Overrides,
) -> Result<StoreConfig, Vec<String>> {
    apply_overrides(&mut file, overrides);
    let mut problems = Problems::default();
    match build_store(&mut problems, &file) {
        Some(store) if problems.0.is_empty() => Ok(store),
        _ => Err(problems.0),
    }
}

pub(crate) fn build(mut file: FileConfig, overrides: &Overrides) -> Result<Config, Vec<String>> {
    let mut problems = Problems::default();
    apply_overrides(&mut file, overrides);

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
    let client_id = build_client_id(&mut problems, &file);
    let shutdown_grace = file.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0);
    let admin_token = file.admin_token.clone().filter(|t| !t.is_empty());
    if let Some(addr) = admin_listen {
        if !addr.ip().is_loopback() && admin_token.is_none() {
            problems.push(
                "admin_token",
                format!("required when admin_listen ({addr}) is not a loopback address; set it or IDEMPROXY_ADMIN_TOKEN"),
            );
        }
    }
    let sweep = file.sweep.as_ref();
    let sweep_interval = sweep
        .and_then(|s| s.interval)
        .map_or(DEFAULT_SWEEP_INTERVAL, |d| d.0);
    let sweep_batch = sweep.and_then(|s| s.batch).unwrap_or(DEFAULT_SWEEP_BATCH);
    if !(1..=100_000).contains(&sweep_batch) {
        problems.push("sweep.batch", "must be between 1 and 100000");
    }
    if sweep_interval.is_zero() {
        problems.push("sweep.interval", "must be more than 0s");
    }
    let limits = build_limits(&mut problems, file.limits.as_ref());
    let tls = build_listener_tls(&mut problems, file.tls.as_ref());

    let store_timeout = store
        .as_ref()
        .map_or(DEFAULT_STORE_TIMEOUT, StoreConfig::timeout);
    let defaults = file.defaults.unwrap_or_default();
    let base = merge_policy(&mut problems, "defaults", None, &defaults, store_timeout);

    let implicit_routes = file.routes.is_none();
    let routes = match (&file.routes, &base) {
        (None, Some(base)) => vec![Route {
            name: "default".into(),
            methods: vec![Method::POST, Method::PATCH],
            pattern: PathPattern::parse("/*").expect("constant pattern is valid"),
            policy: base.clone(),
        }],
        (Some(routes), Some(base)) => build_routes(&mut problems, routes, base, store_timeout),
        (_, None) => Vec::new(),
    };

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
                admin_token,
                sweep_interval,
                sweep_batch,
                limits,
                tls,
            })
        }
        _ => Err(problems.0),
    }
}

fn build_limits(p: &mut Problems, file: Option<&super::file::FileLimits>) -> Limits {
    let limits = Limits {
        max_connections: file
            .and_then(|l| l.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        header_read_timeout: file
            .and_then(|l| l.header_read_timeout)
            .map_or(DEFAULT_HEADER_READ_TIMEOUT, |d| d.0),
        body_read_timeout: file
            .and_then(|l| l.body_read_timeout)
            .map_or(DEFAULT_BODY_READ_TIMEOUT, |d| d.0),
        max_header_bytes: file
            .and_then(|l| l.max_header_bytes)
            .map_or(DEFAULT_MAX_HEADER_BYTES, |s| {
                usize::try_from(s.0).unwrap_or(usize::MAX)
            }),
    };
    if limits.max_connections == 0 {
        p.push("limits.max_connections", "must be at least 1");
    }
    if limits.header_read_timeout.is_zero() {
        p.push("limits.header_read_timeout", "must be more than 0s");
    }
    if limits.body_read_timeout.is_zero() {
        p.push("limits.body_read_timeout", "must be more than 0s");
    }
    if !(8192..=1 << 24).contains(&limits.max_header_bytes) {
        p.push("limits.max_header_bytes", "must be between 8KiB and 16MiB");
    }
    limits
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

fn build_upstream(p: &mut Problems, file: &FileConfig) -> Option<UpstreamConfig> {
    let up = file.upstream.as_ref();
    let Some(url) = up.and_then(|u| u.url.as_deref()) else {
        p.push(
            "upstream.url",
            "required (or pass --upstream http://host:port)",
        );
        return None;
    };
    let uri: http::Uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => {
            p.push("upstream.url", format!("`{url}` is not a URL: {e}"));
            return None;
        }
    };
    let scheme = match uri.scheme_str() {
        Some("http") => "http",
        Some("https") => "https",
        _ => {
            p.push(
                "upstream.url",
                format!("`{url}` must start with http:// or https://"),
            );
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        p.push("upstream.url", format!("`{url}` has no host"));
        return None;
    };
    if uri.query().is_some() {
        p.push("upstream.url", "must not carry a query string");
        return None;
    }
    let origin = http::Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query("/")
        .build()
        .ok()?;
    let connect_timeout = up
        .and_then(|u| u.connect_timeout)
        .map_or(DEFAULT_CONNECT_TIMEOUT, |d| d.0);
    let timeout = up
        .and_then(|u| u.timeout)
        .map_or(DEFAULT_UPSTREAM_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        p.push("upstream.timeout", "must be more than 0s");
    }
    let max_connections = up
        .and_then(|u| u.max_connections)
        .unwrap_or(DEFAULT_UPSTREAM_MAX_CONNECTIONS);
    if max_connections == 0 {
        p.push("upstream.max_connections", "must be at least 1");
    }
    let (tls, tls_summary) = build_upstream_tls(p, up.and_then(|u| u.tls.as_ref()))?;
    Some(UpstreamConfig {
        tls,
        tls_summary,
        max_connections,
        origin,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        connect_timeout,
        timeout,
    })
}

fn build_upstream_tls(
    p: &mut Problems,
    file: Option<&super::file::FileUpstreamTls>,
) -> Option<(std::sync::Arc<rustls::ClientConfig>, String)> {
    let roots = match file.and_then(|t| t.roots.as_deref()) {
        None | Some("webpki") => crate::tls::Roots::Webpki,
        Some("system") => crate::tls::Roots::System,
        Some(other) => {
            p.push(
                "upstream.tls.roots",
                format!("`{other}`: use `webpki` or `system`"),
            );
            return None;
        }
    };
    let ca = file
        .and_then(|t| t.ca_file.as_deref())
        .map(std::path::Path::new);
    let client = match (
        file.and_then(|t| t.client_cert.as_deref()),
        file.and_then(|t| t.client_key.as_deref()),
    ) {
        (Some(cert), Some(key)) => Some((std::path::Path::new(cert), std::path::Path::new(key))),
        (None, None) => None,
        _ => {
            p.push(
                "upstream.tls",
                "set both `client_cert` and `client_key`, or neither",
            );
            return None;
        }
    };
    match crate::tls::client_config(roots, ca, client) {
        Ok(config) => {
            let summary = format!(
                "roots: {}{}{}",
                if roots == crate::tls::Roots::Webpki {
                    "webpki"
                } else {
                    "system"
                },
                ca.map(|c| format!(", ca_file: {}", c.display()))
                    .unwrap_or_default(),
                client
                    .map(|(c, _)| format!(", client_cert: {}", c.display()))
                    .unwrap_or_default()
            );
            Some((config, summary))
        }
        Err(e) => {
            p.push("upstream.tls", e);
            None
        }
    }
}

fn build_listener_tls(
    p: &mut Problems,
    file: Option<&super::file::FileListenerTls>,
) -> Option<std::sync::Arc<rustls::ServerConfig>> {
    let file = file?;
    let (Some(cert), Some(key)) = (file.cert_file.as_deref(), file.key_file.as_deref()) else {
        p.push("tls", "set both `cert_file` and `key_file`");
        return None;
    };
    match crate::tls::server_config(std::path::Path::new(cert), std::path::Path::new(key)) {
        Ok(config) => Some(config),
        Err(e) => {
            p.push("tls", e);
            None
        }
    }
}

fn build_store(p: &mut Problems, file: &FileConfig) -> Option<StoreConfig> {
    let store = file.store.as_ref();
    match (
        store.and_then(|s| s.postgres.as_ref()),
        store.and_then(|s| s.embedded.as_ref()),
    ) {
        (Some(_), Some(_)) => {
            p.push(
                "store",
                "configure either `postgres` or `embedded`, not both",
            );
            None
        }
        (Some(pg), None) => {
            let Some(url) = pg.url.clone() else {
                p.push(
                    "store.postgres.url",
                    "required (or set DATABASE_URL / --database-url)",
                );
                return None;
            };
            if let Err(e) = url.parse::<tokio_postgres::Config>() {
                p.push("store.postgres.url", format!("not a PostgreSQL URL: {e}"));
                return None;
            }
            let pool_size = pg.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
            if pool_size == 0 {
                p.push("store.postgres.pool_size", "must be at least 1");
            }
            let timeout = pg.timeout.map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
            if timeout.is_zero() {
                p.push("store.postgres.timeout", "must be more than 0s");
            }
            Some(StoreConfig::Postgres(PostgresConfig {
                url,
                pool_size,
                connect_timeout: pg.connect_timeout.map_or(DEFAULT_CONNECT_TIMEOUT, |d| d.0),
                timeout,
            }))
        }
        (None, embedded) => {
            let timeout = embedded
                .and_then(|e| e.timeout)
                .map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
            if timeout.is_zero() {
                p.push("store.embedded.timeout", "must be more than 0s");
            }
            Some(StoreConfig::Embedded {
                path: PathBuf::from(
                    embedded
                        .and_then(|e| e.path.clone())
                        .unwrap_or_else(|| DEFAULT_EMBEDDED_PATH.into()),
                ),
                timeout,
            })
        }
    }
}

fn build_client_id(p: &mut Problems, file: &FileConfig) -> Option<ClientIdSource> {
    let Some(c) = &file.client_id else {
        return Some(ClientIdSource::Static("default".into()));
    };
    let given = [
        c.header.is_some(),
        c.authorization.is_some(),
        c.static_name.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        p.push(
            "client_id",
            "set exactly one of `header`, `authorization` or `static`",
        );
        return None;
    }
    if let Some(h) = &c.header {
        return match HeaderName::from_bytes(h.as_bytes()) {
            Ok(name) => Some(ClientIdSource::Header(name)),
            Err(_) => {
                p.push("client_id.header", format!("`{h}` is not a header name"));
                None
            }
        };
    }
    if let Some(a) = &c.authorization {
        if a != "sha256" {
            p.push(
                "client_id.authorization",
                format!("`{a}`: the only supported value is `sha256`"),
            );
            return None;
        }
        return Some(ClientIdSource::AuthorizationSha256);
    }
    let name = c.static_name.clone().unwrap_or_default();
    if name.is_empty() || !crate::proxy::is_visible_ascii(&name) {
        p.push(
            "client_id.static",
            "must be a non-empty printable ASCII name",
        );
        return None;
    }
    Some(ClientIdSource::Static(name))
}

fn build_routes(
    p: &mut Problems,
    routes: &[FileRoute],
    base: &Policy,
    store_timeout: Duration,
) -> Vec<Route> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let at = format!("routes[{i}]");
        let Some(name) = r.name.clone().filter(|n| !n.is_empty()) else {
            p.push(format!("{at}.name"), "required");
            continue;
        };
        if !names.insert(name.clone()) {
            p.push(
                format!("{at}.name"),
                format!("`{name}` is used by an earlier route; names must be unique"),
            );
        }
        let pattern = match r.path.as_deref().map(PathPattern::parse) {
            Some(Ok(pattern)) => Some(pattern),
            Some(Err(e)) => {
                p.push(format!("{at}.path"), e);
                None
            }
            None => {
                p.push(format!("{at}.path"), "required");
                None
            }
        };
        let methods = match &r.methods {
            None => vec![Method::POST],
            Some(list) if list.is_empty() => {
                p.push(format!("{at}.methods"), "must list at least one method");
                Vec::new()
            }
            Some(list) => list
                .iter()
                .filter_map(
                    |m| match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                        Ok(method) => Some(method),
                        Err(_) => {
                            p.push(
                                format!("{at}.methods"),
                                format!("`{m}` is not an HTTP method"),
                            );
                            None
                        }
                    },
                )
                .collect(),
        };
        let own = route_policy(r);
        let policy = merge_policy(p, &at, Some(base), &own, store_timeout);
        if let (Some(pattern), Some(policy)) = (pattern, policy) {
            out.push(Route {
                name: name.into(),
                methods,
                pattern,
                policy,
            });
        }
    }
    out
}

/// The policy part of a route entry, in the shape of `defaults:`.
fn route_policy(r: &FileRoute) -> FilePolicy {
    FilePolicy {
        key_header: r.key_header.clone(),
        upstream_key_header: r.upstream_key_header.clone(),
        lease: r.lease,
        retention: r.retention,
        max_body: r.max_body,
        max_stored_response: r.max_stored_response,
        require_key: r.require_key,
        on_conflict: r.on_conflict.as_ref().map(|c| match c {
            FileOnConflict::Word(w) => FileOnConflict::Word(w.clone()),
            FileOnConflict::Wait(w) => FileOnConflict::Wait(super::file::FileWait { wait: w.wait }),
        }),
        store_headers: r.store_headers.clone(),
        release_on: r.release_on.clone(),
        fingerprint: r
            .fingerprint
            .as_ref()
            .map(|f| super::file::FileFingerprint {
                fields: f.fields.clone(),
            }),
        recovery_probe: r.recovery_probe.clone(),
        on_ambiguous: r.on_ambiguous.clone(),
        ambiguous_statuses: r.ambiguous_statuses.clone(),
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

/// Merges `own` over `base` (or over the built-in defaults when `base` is `None`).
fn merge_policy(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
    store_timeout: Duration,
) -> Option<Policy> {
    let before = p.0.len();
    let default_key = HeaderName::from_static(DEFAULT_KEY_HEADER);
    let key_header = match &own.key_header {
        Some(h) => header_name(p, format!("{at}.key_header"), h),
        None => Some(base.map_or(default_key.clone(), |b| b.key_header.clone())),
    };
    let upstream_key_header = match &own.upstream_key_header {
        Some(h) => header_name(p, format!("{at}.upstream_key_header"), h),
        None => Some(base.map_or(default_key, |b| b.upstream_key_header.clone())),
    };
    let lease = own
        .lease
        .map(|d| d.0)
        .or(base.map(|b| b.lease))
        .unwrap_or(DEFAULT_LEASE);
    let retention = own
        .retention
        .map(|d| d.0)
        .or(base.map(|b| b.retention))
        .unwrap_or(DEFAULT_RETENTION);
    let min_lease = (store_timeout * 3).max(Duration::from_secs(1));
    if lease < min_lease {
        p.push(
            format!("{at}.lease"),
            format!(
                "{} is too short to be renewed in time: it must be at least {} (3 × the store timeout of {}, and 1s at least)",
                format_duration(lease),
                format_duration(min_lease),
                format_duration(store_timeout)
            ),
        );
    }
    if retention <= lease {
        p.push(
            format!("{at}.retention"),
            format!(
                "{} must be longer than the lease ({})",
                format_duration(retention),
                format_duration(lease)
            ),
        );
    }
    let max_body = own
        .max_body
        .map(|s| s.0)
        .or(base.map(|b| b.max_body))
        .unwrap_or(DEFAULT_MAX_BODY);
    let max_stored_response = own
        .max_stored_response
        .map(|s| s.0)
        .or(base.map(|b| b.max_stored_response))
        .unwrap_or(DEFAULT_MAX_STORED_RESPONSE);
    for (name, value) in [
        ("max_body", max_body),
        ("max_stored_response", max_stored_response),
    ] {
        if value == 0 {
            p.push(format!("{at}.{name}"), "must be more than 0");
        } else if value > 1 << 30 {
            p.push(format!("{at}.{name}"), "must be at most 1GiB");
        }
    }
    let require_key = own
        .require_key
        .or(base.map(|b| b.require_key))
        .unwrap_or(false);
    let on_conflict = match &own.on_conflict {
        None => base.map_or(OnConflict::Reject, |b| b.on_conflict),
        Some(FileOnConflict::Word(w)) if w == "reject" => OnConflict::Reject,
        Some(FileOnConflict::Word(w)) => {
            p.push(
                format!("{at}.on_conflict"),
                format!("`{w}`: use `reject` or `{{ wait: 5s }}`"),
            );
            OnConflict::Reject
        }
        Some(FileOnConflict::Wait(w)) => OnConflict::Wait(w.wait.0),
    };
    let fingerprint_fields = match own.fingerprint.as_ref().and_then(|f| f.fields.as_ref()) {
        Some(fields) => {
            if fields.is_empty() {
                p.push(
                    format!("{at}.fingerprint.fields"),
                    "list at least one JSON Pointer, or leave it out to fingerprint the whole body",
                );
            }
            for (i, field) in fields.iter().enumerate() {
                if let Err(e) = crate::fingerprint::check_pointer(field) {
                    p.push(format!("{at}.fingerprint.fields[{i}]"), e);
                }
            }
            Some(fields.clone())
        }
        None => base.and_then(|b| b.fingerprint_fields.clone()),
    };
    let store_headers = match &own.store_headers {
        Some(list) => list
            .iter()
            .enumerate()
            .filter_map(|(i, h)| header_name(p, format!("{at}.store_headers[{i}]"), h))
            .collect(),
        None => base.map(|b| b.store_headers.clone()).unwrap_or_default(),
    };
    let release_on = match &own.release_on {
        Some(list) => {
            for (i, code) in list.iter().enumerate() {
                if !(100..=599).contains(code) {
                    p.push(
                        format!("{at}.release_on[{i}]"),
                        format!("{code} is not an HTTP status"),
                    );
                }
            }
            list.clone()
        }
        None => base.map(|b| b.release_on.clone()).unwrap_or_default(),
    };
    let on_ambiguous = match own.on_ambiguous.as_deref() {
        None => base.map_or(Ambiguous::Keep, |b| b.on_ambiguous),
        Some("keep") => Ambiguous::Keep,
        Some("store") => Ambiguous::Store,
        Some("release") => Ambiguous::Release,
        Some(other) => {
            p.push(
                format!("{at}.on_ambiguous"),
                format!("`{other}`: use `keep`, `store` or `release`"),
            );
            Ambiguous::Keep
        }
    };
    let ambiguous_statuses = match &own.ambiguous_statuses {
        Some(list) => {
            for (i, code) in list.iter().enumerate() {
                if !(100..=599).contains(code) {
                    p.push(
                        format!("{at}.ambiguous_statuses[{i}]"),
                        format!("{code} is not an HTTP status"),
                    );
                }
            }
            list.clone()
        }
        None => base
            .map(|b| b.ambiguous_statuses.clone())
            .unwrap_or_default(),
    };
    let recovery_probe = match &own.recovery_probe {
        Some(probe) => build_probe(p, &format!("{at}.recovery_probe"), probe),
        None => base.and_then(|b| b.recovery_probe.clone()),
    };
    if p.0.len() != before {
        return None;
    }
    Some(Policy {
        key_header: key_header?,
        upstream_key_header: upstream_key_header?,
        lease,
        retention,
        max_body,
        max_stored_response,
        require_key,
        on_conflict,
        fingerprint_fields,
        store_headers,
        release_on,
        recovery_probe,
        on_ambiguous,
        ambiguous_statuses,
    })
}

fn build_probe(
    p: &mut Problems,
    at: &str,
    probe: &super::file::FileProbe,
) -> Option<RecoveryProbe> {
    let written = probe
        .method
        .as_deref()
        .unwrap_or("GET")
        .to_ascii_uppercase();
    let Ok(method) = Method::from_bytes(written.as_bytes()) else {
        p.push(format!("{at}.method"), "not an HTTP method");
        return None;
    };
    let Some(path) = probe.path.clone() else {
        p.push(
            format!("{at}.path"),
            "required, e.g. /payments/by-key/{key}",
        );
        return None;
    };
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        p.push(
            format!("{at}.path"),
            format!("`{path}` must be a path starting with `/`"),
        );
        return None;
    }
    let found = probe.found.clone().unwrap_or_else(|| vec![200]);
    let not_found = probe.not_found.clone().unwrap_or_else(|| vec![404]);
    if let Some(both) = found.iter().find(|s| not_found.contains(s)) {
        p.push(
            at,
            format!("status {both} is in both `found` and `not_found`"),
        );
        return None;
    }
    Some(RecoveryProbe {
        method,
        path,
        found,
        not_found,
    })
}
