//! TLS for the PostgreSQL store's connections, over rustls (the stack the proxy already
//! uses for HTTPS; no OpenSSL).
//!
//! tokio-postgres negotiates TLS itself (`SSLRequest`, falling back to plain under
//! `prefer`) and hands the socket to [`PgTlsConnect`] for the handshake. How the server's
//! certificate is checked was decided by the configuration (see
//! [`crate::config::PgTls`]). A handshake that fails names the host, so that a certificate
//! that does not verify says which server it came from.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::store::connect_error::HandshakeFailed;

/// Makes a TLS connector per host; shared by every connection of a store.
#[derive(Clone)]
pub struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    /// Raised once a handshake has completed, for the start-up log ("was TLS used?").
    used: Arc<AtomicBool>,
}

impl PgTlsConnect {
    pub fn new(config: Arc<rustls::ClientConfig>) -> Self {
        Self {
            config,
            used: Arc::default(),
        }
    }

    /// Whether any connection so far was encrypted.
    pub fn was_used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }
}

impl MakeTlsConnect<Socket> for PgTlsConnect {
    type Stream = PgTlsStream;
    type TlsConnect = HostTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<HostTlsConnect> {
        let name = ServerName::try_from(domain.to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TLS to `{domain}`: {e}"),
            )
        })?;
        Ok(HostTlsConnect {
            connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
            name,
            host: domain.to_owned(),
            used: Arc::clone(&self.used),
        })
    }
}

/// The handshake with one host.
pub struct HostTlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    host: String,
    used: Arc<AtomicBool>,
}

impl TlsConnect<Socket> for HostTlsConnect {
    type Stream = PgTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move {
            match self.connector.connect(self.name, socket).await {
                Ok(stream) => {
                    self.used.store(true, Ordering::Relaxed);
                    Ok(PgTlsStream(Box::new(stream)))
                }
                Err(e) => Err(io::Error::new(e.kind(), HandshakeFailed::new(self.host, e))),
            }
        })
    }
}

/// An encrypted connection to PostgreSQL.
pub struct PgTlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // Without it, SCRAM authenticates without binding to the TLS session; binding
        // would need the certificate's own signature hash, and a wrong one fails logins.
        ChannelBinding::none()
    }
}

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
