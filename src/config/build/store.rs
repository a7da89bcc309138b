//! `store:` — which backend keeps the keys, and its settings.

use std::path::{Path, PathBuf};

use super::Problems;
use crate::config::file::{FileConfig, FilePostgres};
use crate::config::libpq::{TlsParams, split_tls};
use crate::config::model::*;
use crate::tls::{PgCheck, PgRoots, postgres_client_config};

pub(super) fn build_store(p: &mut Problems, file: &FileConfig) -> Option<StoreConfig> {
    let store = file.store.as_ref();
    let replay_cache = store
        .and_then(|s| s.replay_cache)
        .map_or(DEFAULT_REPLAY_CACHE, |s| s.0);
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
        (Some(pg), None) => build_postgres(p, pg, replay_cache),
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
                replay_cache,
            })
        }
    }
}

fn build_postgres(p: &mut Problems, pg: &FilePostgres, replay_cache: u64) -> Option<StoreConfig> {
    let Some(written) = pg.url.clone() else {
        p.push(
            "store.postgres.url",
            "required (or set DATABASE_URL / --database-url)",
        );
        return None;
    };
    let (url, in_url) = match split_tls(&written) {
        Ok(split) => split,
        Err(e) => {
            p.push("store.postgres.url", format!("not a PostgreSQL URL: {e}"));
            return None;
        }
    };
    if let Err(e) = url.parse::<tokio_postgres::Config>() {
        p.push("store.postgres.url", format!("not a PostgreSQL URL: {e}"));
        return None;
    }
    let listen_url = match pg.listen_url.as_deref().map(split_tls) {
        None => None,
        Some(Err(e)) => {
            p.push(
                "store.postgres.listen_url",
                format!("not a PostgreSQL URL: {e}"),
            );
            return None;
        }
        Some(Ok((_, params))) if params != TlsParams::default() => {
            p.push(
                "store.postgres.listen_url",
                "set TLS parameters in `url` or in the store.postgres section: they apply to both connections",
            );
            return None;
        }
        Some(Ok((listen, _))) => {
            if let Err(e) = listen.parse::<tokio_postgres::Config>() {
                p.push(
                    "store.postgres.listen_url",
                    format!("not a PostgreSQL URL: {e}"),
                );
                return None;
            }
            Some(listen)
        }
    };
    let tls = build_pg_tls(p, pg, in_url)?;
    let pool_size = pg.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
    if pool_size == 0 {
        p.push("store.postgres.pool_size", "must be at least 1");
    }
    let timeout = pg.timeout.map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        p.push("store.postgres.timeout", "must be more than 0s");
    }
    // Per address: a host that vanished (no answer, no reset) must leave time for the next
    // (`failover_warning` says what a longer one costs).
    let connect_timeout = pg
        .connect_timeout
        .map_or(DEFAULT_PG_CONNECT_TIMEOUT.min(timeout / 2), |d| d.0);
    if connect_timeout.is_zero() {
        p.push(
            "store.postgres.connect_timeout",
            "must be more than 0s (it bounds each host's connection attempt)",
        );
    }
    Some(StoreConfig::Postgres(PostgresConfig {
        url,
        listen_url,
        pool_size,
        connect_timeout,
        timeout,
        tls,
        replay_cache,
    }))
}

/// libpq's TLS parameters from the section and the URL (the same value in both is fine,
/// different values an error), turned into a rustls configuration that does what libpq
/// does in that mode. Without `sslmode`, libpq's default: `prefer`.
fn build_pg_tls(p: &mut Problems, pg: &FilePostgres, in_url: TlsParams) -> Option<PgTls> {
    let mut pick = |key: &str, section: &Option<String>, url: Option<String>| match (section, url) {
        (Some(a), Some(b)) if *a != b => {
            p.push(
                format!("store.postgres.{key}"),
                format!("`{a}` here but `{b}` in the URL: set it in one place"),
            );
            None
        }
        (Some(a), _) => Some(a.clone()),
        (None, b) => b,
    };
    let sslmode = pick("sslmode", &pg.sslmode, in_url.sslmode);
    let sslrootcert = pick("sslrootcert", &pg.sslrootcert, in_url.sslrootcert);
    let sslcert = pick("sslcert", &pg.sslcert, in_url.sslcert);
    let sslkey = pick("sslkey", &pg.sslkey, in_url.sslkey);
    let mode = match sslmode.as_deref() {
        None | Some("prefer") => PgSslMode::Prefer,
        Some("disable") => PgSslMode::Disable,
        Some("require") => PgSslMode::Require,
        Some("verify-ca") => PgSslMode::VerifyCa,
        Some("verify-full") => PgSslMode::VerifyFull,
        Some(other) => {
            p.push(
                "store.postgres.sslmode",
                format!("`{other}`: use disable, prefer, require, verify-ca or verify-full"),
            );
            return None;
        }
    };
    // libpq: `require` with a root certificate given verifies the chain, like verify-ca.
    let verify = match (mode, &sslrootcert) {
        (PgSslMode::VerifyFull, _) => PgVerify::Full,
        (PgSslMode::VerifyCa, _) | (PgSslMode::Require, Some(_)) => PgVerify::Chain,
        _ => PgVerify::Nothing,
    };
    if verify != PgVerify::Nothing && sslrootcert.is_none() {
        p.push(
            "store.postgres.sslrootcert",
            format!(
                "sslmode={} verifies the server, so it needs trusted roots: a PEM file, or `system` for the operating system's store",
                mode.as_str()
            ),
        );
        return None;
    }
    let client_auth = match (&sslcert, &sslkey) {
        (Some(cert), Some(key)) => Some((Path::new(cert.as_str()), Path::new(key.as_str()))),
        (None, None) => None,
        _ => {
            p.push(
                "store.postgres",
                "set both `sslcert` and `sslkey`, or neither",
            );
            return None;
        }
    };
    let roots = sslrootcert.as_deref().map(|r| match r {
        "system" => PgRoots::System,
        file => PgRoots::File(Path::new(file)),
    });
    let check = match verify {
        PgVerify::Nothing => PgCheck::Nothing,
        PgVerify::Chain => PgCheck::Chain,
        PgVerify::Full => PgCheck::Full,
    };
    match postgres_client_config(check, roots, client_auth) {
        Ok(client) => Some(PgTls {
            mode,
            verify,
            sslrootcert,
            sslcert,
            sslkey,
            client,
        }),
        Err(e) => {
            p.push("store.postgres", format!("TLS: {e}"));
            None
        }
    }
}

/// A warning when `connect_timeout` is not well under the store `timeout`: a first host
/// that vanished (accepts and never answers) then costs every call for a while, since no
/// call lasts long enough to see its connection attempt reach the next host.
pub(super) fn failover_warning(pg: &crate::config::PostgresConfig) -> Option<String> {
    let (connect, timeout) = (pg.connect_timeout, pg.timeout);
    if connect.saturating_mul(2) <= timeout {
        return None;
    }
    let hosts = crate::config::libpq::split_hosts(&pg.url).len();
    let next = if hosts > 1 {
        "the next host"
    } else {
        "the name's next address"
    };
    Some(format!(
        "store.postgres.connect_timeout ({}) is more than half of store.postgres.timeout ({}): when a database host vanishes (a VM gone, an address that accepts and never answers), every store call gives up (503, nothing forwarded) before the connection attempt reaches {next}; the attempt goes on in the background and serves the calls after it, so a vanished first host costs about {} of 503s (calls in flight on it: up to the timeout, then the attempt: up to connect_timeout). Set connect_timeout to at most half the timeout (e.g. {}) to fail over within one call.",
        crate::config::units::format_duration(connect),
        crate::config::units::format_duration(timeout),
        crate::config::units::format_duration(timeout + connect),
        crate::config::units::format_duration(timeout / 2),
    ))
}
