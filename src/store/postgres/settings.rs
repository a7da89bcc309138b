//! The tokio-postgres settings for the store's connection strings: TLS as `sslmode` says,
//! the connect timeout, an application name, and TCP keepalives short enough that an idle
//! connection to a vanished host is found out in seconds.

use std::time::Duration;

/// The tokio-postgres settings for a connection string (its TLS parameters already taken
/// out by the configuration): TLS as `sslmode` says, the connect timeout per host, and an
/// application name for `pg_stat_activity`.
pub(super) fn connection_config(
    url: &str,
    config: &crate::config::PostgresConfig,
) -> Result<tokio_postgres::Config, crate::store::StoreError> {
    use crate::config::PgSslMode;
    use tokio_postgres::config::SslMode;
    let mut pg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        crate::store::StoreError::Config(format!("database URL: {e}"))
    })?;
    pg.connect_timeout(config.connect_timeout);
    pg.ssl_mode(match config.tls.mode {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::Prefer => SslMode::Prefer,
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => SslMode::Require,
    });
    if pg.get_application_name().is_none() {
        pg.application_name("idemproxy");
    }
    // TCP keepalives after 10 s idle instead of libpq's and the kernel's 2 h, unless the
    // URL says otherwise: a host that vanished is noticed on an idle connection (the
    // notification connection is idle most of the time).
    if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        pg.keepalives_idle(Duration::from_secs(10));
    }
    // And probes every 5 s, three unanswered ending the connection: a silent host costs an
    // idle connection 25 s, not the kernel's retransmission timeouts (minutes).
    if pg.get_keepalives_interval().is_none() {
        pg.keepalives_interval(Duration::from_secs(5));
    }
    if pg.get_keepalives_retries().is_none() {
        pg.keepalives_retries(3);
    }
    Ok(pg)
}
