//! One client connection: which protocol it speaks (ALPN, or a peek at HTTP/2's preface),
//! how long it may take to send its first head, and serving it: HTTP/1 by this crate's
//! own server, HTTP/2 by hyper (see `h2`).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;

pub(super) use super::error::ConnError;
use crate::proxy::Proxy;
use crate::store::KeyStore;

/// The protocol a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// How each protocol is served, the same for every connection of a listener.
pub(super) struct Protocols {
    pub(super) h1: crate::http1::server::Limits,
    pub(super) h2: http2::Builder<TokioExecutor>,
    /// What bounds a connection (HTTP/2's idle and send timeouts).
    pub(super) limits: crate::config::Limits,
}

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
pub(super) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Tells HTTP/2 with prior knowledge from HTTP/1 on a plain connection by peeking at its
/// first bytes, which stay in the socket for hyper to read.
pub(super) async fn sniff(stream: &TcpStream) -> std::io::Result<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut first).await?;
        if n == 0 || !H2_PREFACE.starts_with(&first[..n]) {
            // HTTP/1, or closed before a byte (hyper then ends it quietly).
            return Ok(Protocol::Http1);
        }
        if n == H2_PREFACE.len() {
            return Ok(Protocol::Http2);
        }
        // Part of the preface so far. Peeking again returns at once while those bytes
        // wait in the socket, so pause briefly; this happens only for a split preface.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits for `step` (what happens before hyper serves: the sniff, the TLS handshake) for
/// at most the header timeout. `None` when draining starts first.
pub(super) async fn before_serving<T>(
    draining: &CancellationToken,
    limit: Duration,
    step: impl Future<Output = T>,
) -> Option<Result<T, Elapsed>> {
    tokio::select! {
        biased;
        () = draining.cancelled() => None,
        done = tokio::time::timeout(limit, step) => Some(done),
    }
}

/// Serves one connection in `protocol` until it ends or the server drains: HTTP/1 by this
/// crate's own connection ([`crate::http1::server`]), HTTP/2 by hyper.
pub(super) async fn serve_protocol<S: KeyStore, I>(
    protocols: &Protocols,
    protocol: Protocol,
    io: I,
    proxy: Proxy<S>,
    peer: SocketAddr,
    draining: &CancellationToken,
    watcher: Watcher,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match protocol {
        Protocol::Http1 => {
            // Held to the end: the drain waits for every watcher to be dropped.
            let _watcher = watcher;
            Ok(
                crate::http1::server::serve_connection(io, &proxy, peer, protocols.h1, draining)
                    .await?,
            )
        }
        // Boxed: HTTP/2's connection state is larger, and HTTP/1 connections are the many.
        Protocol::Http2 => {
            Box::pin(super::h2::serve(
                &protocols.h2,
                protocols.limits,
                io,
                proxy,
                peer,
                draining,
                watcher,
            ))
            .await
        }
    }
}
