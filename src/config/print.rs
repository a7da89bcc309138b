//! The effective configuration as `check-config` prints it: every default filled in, the
//! route table spelled out, secrets hidden.

use std::fmt;

use http::{HeaderName, Method};

use super::identity::ClientIdSource;
use super::model::*;
use super::policy::*;
use super::units::{format_duration, format_size};

impl fmt::Display for Config {
    /// The effective configuration and route table, as `check-config` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_listeners(f)?;
        self.write_upstream(f)?;
        self.write_store(f)?;
        self.write_clients_and_limits(f)?;
        self.write_background(f)?;
        self.write_encryption(f)?;
        if self.implicit_routes {
            writeln!(
                f,
                "# no routes configured: every POST and PATCH carrying a key is protected"
            )?;
        }
        for warning in &self.warnings {
            writeln!(f, "# warning: {warning}")?;
        }
        writeln!(f, "routes:")?;
        for route in self.routes.routes() {
            write_route(f, route)?;
        }
        Ok(())
    }
}

impl Config {
    /// The listeners.
    fn write_listeners(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "listen: {}", self.listen)?;
        writeln!(f, "admin_listen: {}", self.admin_listen)?;
        // Comments where the file's own form cannot be printed back (the certificate
        // paths are not kept), so that the output still reads as a configuration.
        writeln!(
            f,
            "{}",
            if self.tls.is_some() {
                "# tls: on (HTTP/2 and HTTP/1.1 by ALPN; cert_file and key_file as configured)"
            } else {
                "# tls: off"
            }
        )?;
        Ok(())
    }

    /// The upstream.
    fn write_upstream(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "upstream:")?;
        writeln!(
            f,
            "  url: {}{}",
            self.upstream.origin,
            self.upstream.base_path.trim_start_matches('/')
        )?;
        writeln!(
            f,
            "  connect_timeout: {}",
            format_duration(self.upstream.connect_timeout)
        )?;
        writeln!(f, "  timeout: {}", format_duration(self.upstream.timeout))?;
        writeln!(f, "  max_connections: {}", self.upstream.max_connections)?;
        writeln!(f, "  tls: {}", self.upstream.tls_summary)?;
        Ok(())
    }

    /// The store, its secrets hidden.
    fn write_store(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "store:")?;
        match &self.store {
            StoreConfig::Postgres(pg) => {
                writeln!(f, "  postgres:")?;
                writeln!(f, "    url: {}", redact_url(&pg.url))?;
                if let Some(listen) = &pg.listen_url {
                    writeln!(f, "    listen_url: {}", redact_url(listen))?;
                }
                writeln!(f, "    sslmode: {}", pg.tls.mode.as_str())?;
                for (key, value) in [
                    ("sslrootcert", &pg.tls.sslrootcert),
                    ("sslcert", &pg.tls.sslcert),
                    ("sslkey", &pg.tls.sslkey),
                ] {
                    if let Some(value) = value {
                        writeln!(f, "    {key}: {value}")?;
                    }
                }
                writeln!(f, "    pool_size: {}", pg.pool_size)?;
                writeln!(
                    f,
                    "    connect_timeout: {}",
                    format_duration(pg.connect_timeout)
                )?;
                writeln!(f, "    timeout: {}", format_duration(pg.timeout))?;
                writeln!(f, "  replay_cache: {}", format_size(pg.replay_cache))?;
            }
            StoreConfig::Embedded {
                path,
                timeout,
                replay_cache,
            } => {
                writeln!(f, "  embedded:")?;
                writeln!(f, "    path: {}", path.display())?;
                writeln!(f, "    timeout: {}", format_duration(*timeout))?;
                writeln!(f, "  replay_cache: {}", format_size(*replay_cache))?;
            }
        }
        Ok(())
    }

    /// Whose keys are whose, the drain, the limits, the admin token.
    fn write_clients_and_limits(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.client_id {
            ClientIdSource::Header(h) => writeln!(f, "client_id:\n  header: {h}")?,
            ClientIdSource::AuthorizationSha256 => {
                writeln!(f, "client_id:\n  authorization: sha256")?
            }
            ClientIdSource::Credentials(c) => {
                writeln!(f, "client_id:\n  credentials:\n    header: {}", c.header)?;
                let mut tenants: std::collections::BTreeMap<&String, Vec<String>> =
                    Default::default();
                for (hash, tenant) in &c.tenants {
                    let hash = format!("sha256:{}", crate::key::hex(hash));
                    tenants.entry(tenant).or_default().push(hash);
                }
                writeln!(f, "    tenants:")?;
                for (tenant, mut hashes) in tenants {
                    hashes.sort();
                    let name = serde_json::to_string(tenant).map_err(|_| fmt::Error)?;
                    writeln!(f, "      {name}: [{}]", hashes.join(", "))?;
                }
                let unlisted = if c.unlisted_own_namespace {
                    "sha256"
                } else {
                    "refuse"
                };
                writeln!(f, "    unlisted: {unlisted}")?;
            }
            ClientIdSource::Jwt(j) => {
                let v = &j.verifier;
                let quoted = |s: &str| serde_json::to_string(s).map_err(|_| fmt::Error);
                writeln!(f, "client_id:\n  jwt:\n    claim: {}", quoted(v.claim())?)?;
                writeln!(
                    f,
                    "    keys: {}   # {}",
                    j.keys_from,
                    v.describe_keys().join(", ")
                )?;
                if let Some(issuer) = v.issuer() {
                    writeln!(f, "    issuer: {}", quoted(issuer)?)?;
                }
                if let Some(audience) = v.audience() {
                    writeln!(f, "    audience: {}", quoted(audience)?)?;
                }
                writeln!(f, "    leeway: {}", format_duration(v.leeway()))?;
            }
            ClientIdSource::Static(name) => writeln!(f, "client_id:\n  static: {name}")?,
        }
        writeln!(
            f,
            "shutdown_grace: {}",
            format_duration(self.shutdown_grace)
        )?;
        let l = &self.limits;
        writeln!(
            f,
            "limits:\n  max_connections: {}\n  header_read_timeout: {}\n  body_read_timeout: {}\n  max_header_bytes: {}",
            l.max_connections,
            format_duration(l.header_read_timeout),
            format_duration(l.body_read_timeout),
            format_size(l.max_header_bytes as u64)
        )?;
        writeln!(
            f,
            "  detached: {{max: {}, per_client: {}, per_connection: {}}}\n  http2_idle_timeout: {}\n  http2_ping_interval: {}\n  http2_ping_timeout: {}\n  http2_max_streams: {}\n  send_timeout: {}",
            l.detached.max,
            l.detached.per_client,
            l.detached.per_connection,
            format_duration(l.http2_idle_timeout),
            format_duration(l.http2_ping_interval),
            format_duration(l.http2_ping_timeout),
            l.http2_max_streams,
            format_duration(l.send_timeout)
        )?;
        let token = if self.admin_token.is_some() {
            "set (never printed)"
        } else {
            "none"
        };
        writeln!(f, "# admin_token: {token}")?;
        if !self.admin_tokens.is_empty() {
            let names: Vec<&str> = self.admin_tokens.iter().map(|t| t.name.as_str()).collect();
            writeln!(f, "# admin_tokens: {} (by SHA-256)", names.join(", "))?;
        }
        Ok(())
    }

    /// The sweep, the reconciler and tracing.
    fn write_background(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sweep:\n  interval: {}\n  batch: {}",
            format_duration(self.sweep_interval),
            self.sweep_batch
        )?;
        match self.unresolved_retention {
            Some(d) => writeln!(f, "  unresolved_retention: {}", format_duration(d))?,
            None => writeln!(f, "  # unresolved_retention: none (kept until resolved)")?,
        }
        match self.reconcile {
            Some(r) => writeln!(
                f,
                "reconcile:\n  interval: {}\n  batch: {}",
                format_duration(r.interval),
                r.batch
            )?,
            None => writeln!(f, "# reconcile: off")?,
        }
        match &self.tracing {
            Some(t) => writeln!(
                f,
                "tracing:\n  otlp_endpoint: {}\n  service_name: {}",
                t.traces_url,
                serde_json::Value::String(t.service_name.clone())
            )?,
            None => writeln!(f, "# tracing: off")?,
        }
        Ok(())
    }

    /// Encryption at rest, the keys named by their source, never printed.
    fn write_encryption(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.encryption {
            Some(e) => {
                writeln!(f, "encryption:\n  keys:")?;
                for key in &e.keys {
                    let id = serde_json::Value::String(key.id.clone());
                    writeln!(f, "    {id}: {}", key.source)?;
                }
                writeln!(
                    f,
                    "  active: {}",
                    serde_json::Value::String(e.active.clone())
                )?;
                if let Some(hash_key) = &e.hash_key {
                    // The verifier names the secret's bytes (a reload that changed them
                    // is told they need a restart), without revealing them.
                    writeln!(
                        f,
                        "  hash_keys: true\n  hash_key: {}  # {}",
                        hash_key.source,
                        e.key_form().marker()
                    )?;
                }
            }
            None => writeln!(f, "# encryption: off (stored answers are kept in clear)")?,
        }
        Ok(())
    }
}

/// One route of the table, every policy field spelled out.
fn write_route(f: &mut fmt::Formatter<'_>, route: &Route) -> fmt::Result {
    let p = &route.policy;
    let (methods, extensions): (Vec<&Method>, Vec<&Method>) =
        route.methods.iter().partition(|m| is_registered_method(m));
    let names = |list: Vec<&Method>| {
        list.iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(f, "  - name: {}", route.name)?;
    writeln!(f, "    methods: [{}]", names(methods))?;
    if !extensions.is_empty() {
        writeln!(f, "    extension_methods: [{}]", names(extensions))?;
    }
    writeln!(f, "    path: {}", route.pattern.as_str())?;
    let keys: Vec<&str> = p.key_headers.iter().map(HeaderName::as_str).collect();
    writeln!(f, "    key_headers: [{}]", keys.join(", "))?;
    let form = match p.derived_key {
        DerivedKey::Plain => "plain".to_owned(),
        DerivedKey::Sha256 => "{ hash: sha256 }".to_owned(),
        DerivedKey::MaxLength(n) => format!("{{ max_length: {n} }}"),
    };
    writeln!(f, "    derived_key: {form}   # {}", p.derived_key.explain())?;
    if let Some(pointer) = &p.upstream_key_body {
        writeln!(f, "    upstream_key: {{ body: \"{pointer}\" }}")?;
    }
    if let Some(pointer) = &p.key_from_body {
        writeln!(f, "    key_from: {{ body: \"{pointer}\" }}")?;
    }
    let scope = match p.key_scope {
        KeyScope::Client => "client",
        KeyScope::ClientAndRoute => "client_and_route",
    };
    writeln!(f, "    key_scope: {scope}")?;
    writeln!(f, "    replayed_header: {}", p.replayed_header)?;
    match &p.echo_key {
        EchoKey::AsSent => writeln!(f, "    # echo_key_header: the header the key came in")?,
        EchoKey::Named(h) => writeln!(f, "    echo_key_header: {h}")?,
        EchoKey::Off => writeln!(f, "    echo_key_header: none")?,
    }
    writeln!(f, "    upstream_key_header: {}", p.upstream_key_header)?;
    writeln!(f, "    require_key: {}", p.require_key)?;
    if !p.console_body {
        writeln!(f, "    console_body: false")?;
    }
    writeln!(f, "    lease: {}", format_duration(p.lease))?;
    writeln!(f, "    retention: {}", format_duration(p.retention))?;
    writeln!(f, "    max_body: {}", format_size(p.max_body))?;
    writeln!(
        f,
        "    max_stored_response: {}",
        format_size(p.max_stored_response)
    )?;
    match p.on_conflict {
        OnConflict::Reject => writeln!(f, "    on_conflict: reject")?,
        OnConflict::Wait(d) => writeln!(f, "    on_conflict: {{ wait: {} }}", format_duration(d))?,
    }
    let headers: Vec<&str> = p
        .fingerprint_headers
        .iter()
        .map(HeaderName::as_str)
        .collect();
    match (&p.fingerprint_fields, p.fingerprint_off) {
        (_, true) => writeln!(f, "    fingerprint: none")?,
        (Some(fields), false) => writeln!(
            f,
            "    fingerprint: {{ fields: [{}], headers: [{}] }}",
            fields.join(", "),
            headers.join(", ")
        )?,
        (None, false) => writeln!(
            f,
            "    fingerprint: {{ headers: [{}] }}  # and the whole body",
            headers.join(", ")
        )?,
    }
    let stored: Vec<&str> = p.store_headers.iter().map(HeaderName::as_str).collect();
    writeln!(
        f,
        "    store_headers: [{}]  # and always content-type, location",
        stored.join(", ")
    )?;
    if let Some(probe) = &p.recovery_probe {
        let found: Vec<String> = probe.found.iter().map(u16::to_string).collect();
        let missing: Vec<String> = probe.not_found.iter().map(u16::to_string).collect();
        writeln!(
            f,
            "    recovery_probe: {{ method: {}, path: {:?}, found: [{}], not_found: [{}] }}",
            probe.method,
            probe.path,
            found.join(", "),
            missing.join(", ")
        )?;
    }
    let ambiguous = match p.on_ambiguous {
        Ambiguous::Keep => "keep",
        Ambiguous::Store => "store",
        Ambiguous::Release => "release",
    };
    writeln!(f, "    on_ambiguous: {ambiguous}")?;
    let takeover = match p.takeover {
        Takeover::Execute => "execute",
        Takeover::Never => "never",
    };
    writeln!(f, "    takeover: {takeover}")?;
    if !p.ambiguous_statuses.is_empty() {
        let codes: Vec<String> = p.ambiguous_statuses.iter().map(u16::to_string).collect();
        writeln!(f, "    ambiguous_statuses: [{}]", codes.join(", "))?;
    }
    if !p.release_on.is_empty() {
        let codes: Vec<String> = p.release_on.iter().map(u16::to_string).collect();
        writeln!(f, "    release_on: [{}]", codes.join(", "))?;
    }
    Ok(())
}
