//! Why no PostgreSQL connection could be had: what each host said, and a TLS handshake
//! told apart from an outage. Apart from the backend that makes them, so that the store's
//! contract ([`super::StoreError`]) can name them without depending on the backend.

use std::io;
use std::time::Duration;

use super::describe::describe;

/// Why one host's attempt failed.
#[derive(Debug)]
pub enum Failure {
    Postgres(tokio_postgres::Error),
    TimedOut(Duration),
}

/// No host took the connection: what each one said.
#[derive(Debug)]
pub struct ConnectError {
    pub attempts: Vec<(String, Failure)>,
}

impl ConnectError {
    /// The PostgreSQL errors among the attempts.
    pub fn errors(&self) -> impl Iterator<Item = &tokio_postgres::Error> {
        self.attempts.iter().filter_map(|(_, f)| match f {
            Failure::Postgres(e) => Some(e),
            Failure::TimedOut(_) => None,
        })
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.attempts.is_empty() {
            return f.write_str("the connection attempt ended without a result");
        }
        for (i, (host, failure)) in self.attempts.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match failure {
                Failure::Postgres(e) => write!(f, "{host}: {}", describe(e))?,
                Failure::TimedOut(d) => write!(f, "{host}: no answer within {d:?}")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConnectError {}

/// A TLS handshake with a PostgreSQL host failed (a certificate that does not verify, a
/// server that speaks no TLS): not an outage but a configuration to fix, so the store
/// tells it apart (see [`crate::store::StoreError::is_tls`]).
#[derive(Debug, thiserror::Error)]
#[error("TLS with PostgreSQL at {host} failed: {source}{}", hint(.source))]
pub struct HandshakeFailed {
    host: String,
    #[source]
    source: io::Error,
}

impl HandshakeFailed {
    pub(crate) fn new(host: String, source: io::Error) -> Self {
        Self { host, source }
    }
}

/// What to do about a handshake failure whose cause alone would not say.
fn hint(source: &io::Error) -> &'static str {
    if source.to_string().contains("UnsupportedCertVersion") {
        " (the server's certificate is X.509 v1, which sslmode=verify-ca and verify-full \
         cannot verify: reissue it as v3 with the CA, or use sslmode=require, which \
         encrypts without verifying as libpq does)"
    } else {
        ""
    }
}
