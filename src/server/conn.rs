//! One client connection: which protocol it speaks (ALPN, or a peek at HTTP/2's preface),
//! how long it may take to send its first head, hyper serving it, and why it ended.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;

use crate::problem::ProxyError;
use crate::proxy::Proxy;
use crate::store::KeyStore;

/// Why a client connection ended badly, for the log and `connection_errors_total`.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error("{0}")]
    Http(Box<dyn std::error::Error + Send + Sync>),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("no request head within the header read timeout")]
    NoHead,
    #[error("{0}")]
    H1(#[from] crate::http1::server::ConnError),
}

impl ConnError {
    pub(super) fn kind(&self) -> &'static str {
        let e = match self {
            ConnError::Http(e) => e,
            ConnError::Tls(_) => return "tls_handshake",
            ConnError::NoHead => return "header_timeout",
            ConnError::H1(e) => return e.kind(),
        };
        match e.downcast_ref::<hyper::Error>() {
            Some(h) if h.is_timeout() => "header_timeout",
            Some(h) if h.is_parse_too_large() => "head_too_large",
            Some(h) if h.is_parse() => "malformed",
            Some(h) if h.is_incomplete_message() || h.is_closed() => "closed_early",
            _ => "other",
        }
    }
}

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
            let svc = service(proxy, peer);
            Box::pin(watcher.watch(protocols.h2.serve_connection(TokioIo::new(io), svc)))
                .await
                .map_err(|e| ConnError::Http(Box::new(e)))
        }
    }
}

pub(super) fn service<S: KeyStore>(
    proxy: Proxy<S>,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = http::Response<crate::body::ProxyBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<crate::body::ProxyBody>, Infallible>> + Send,
> + Clone {
    service_fn(move |req: http::Request<Incoming>| {
        let proxy = proxy.clone();
        async move {
            if let Some(refused) = malformed_h2(&req) {
                return Ok(refused.into_response_in(&proxy.config().errors));
            }
            Ok::<_, Infallible>(proxy.handle(req, peer).await)
        }
    })
}

/// What RFC 9113 §8.3.1 calls malformed and hyper lets through (it already resets streams
/// with connection-specific fields): `Host` naming another authority than `:authority`,
/// or more than one `Host`. The upstream is told the host in `X-Forwarded-Host`, so the
/// two must not disagree.
fn malformed_h2<B>(req: &http::Request<B>) -> Option<ProxyError> {
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let host = hosts.next()?;
    if hosts.next().is_some() {
        return Some(ProxyError::MalformedH2(
            "more than one Host field".to_owned(),
        ));
    }
    let authority = req.uri().authority()?;
    (!host
        .as_bytes()
        .eq_ignore_ascii_case(authority.as_str().as_bytes()))
    .then(|| {
        ProxyError::MalformedH2(format!(
            "Host `{}` names another authority than `:authority` `{authority}`",
            String::from_utf8_lossy(host.as_bytes())
        ))
    })
}
