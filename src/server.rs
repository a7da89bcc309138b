//! The accept loop: one task per connection, HTTP/1.1 and HTTP/2, graceful drain.
//!
//! `run` takes a bound listener and a shutdown future, so tests bind port 0 and stop the
//! server with a oneshot, exactly as the binary stops it with SIGTERM.
//!
//! The protocol is chosen before hyper sees a byte: by ALPN on TLS, and on a plain
//! listener by peeking (not reading) at the first bytes for HTTP/2's preface. hyper then
//! reads the head straight into its own buffer. (hyper-util's auto-detection reads the
//! first bytes itself and replays them, which costs a layer on every read and, by the
//! way its read buffer then grows, 16 KiB instead of 8 KiB per connection.)

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;

use crate::metrics::KindLabel;
use crate::proxy::Proxy;
use crate::store::KeyStore;

/// Serves `proxy` on `listener` until `shutdown` resolves, then stops accepting, lets
/// in-flight requests and their completions finish (up to `grace`), and returns.
pub async fn run<S: KeyStore>(
    listener: TcpListener,
    proxy: Proxy<S>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let limits = proxy.config().limits;
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // The read buffer bounds a request head: larger gets 431.
        .max_buf_size(limits.max_header_bytes);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let builders = Arc::new((h1, h2));
    // Past the limit, connections wait in the kernel's accept queue instead of being served.
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    // Cancelled when draining starts: a connection that has not sent a request yet is
    // closed then, instead of holding the drain up until its header timeout.
    let draining = CancellationToken::new();
    // TLS on the listener when configured; HTTP/2 is offered by ALPN.
    let acceptor = proxy
        .config()
        .tls
        .clone()
        .map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(cause = %e, "failed to accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let metrics = Arc::clone(proxy.metrics());
        let open = metrics.connections_open.clone();
        open.inc();
        let (builders, watcher, svc) = (
            Arc::clone(&builders),
            graceful.watcher(),
            service(proxy.clone(), peer),
        );
        let acceptor = acceptor.clone();
        let draining = draining.clone();
        let head_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let (h1, h2) = &*builders;
            let served = match acceptor {
                None => match before_serving(&draining, head_timeout, sniff(&stream)).await {
                    None => Ok(()),
                    Some(Ok(Ok(protocol))) => serve(h1, h2, protocol, stream, svc, watcher).await,
                    Some(Ok(Err(e))) => Err(ConnError::Http(Box::new(e))),
                    Some(Err(_)) => Err(ConnError::NoHead),
                },
                // Boxed, so that a plain connection's task is not as large as a TLS
                // one's. The handshake counts against the header timeout, like a slow head.
                Some(acceptor) => {
                    Box::pin(async move {
                        let handshake = acceptor.accept(stream);
                        match before_serving(&draining, head_timeout, handshake).await {
                            None => Ok(()),
                            Some(Ok(Ok(tls))) => {
                                let protocol = match tls.get_ref().1.alpn_protocol() {
                                    Some(b"h2") => Protocol::Http2,
                                    _ => Protocol::Http1,
                                };
                                serve(h1, h2, protocol, tls, svc, watcher).await
                            }
                            Some(Ok(Err(e))) => Err(ConnError::Tls(e.to_string())),
                            Some(Err(_)) => Err(ConnError::Tls("handshake timed out".into())),
                        }
                    })
                    .await
                }
            };
            if let Err(e) = served {
                let kind = e.kind();
                metrics
                    .connection_errors
                    .get_or_create(&KindLabel { kind })
                    .inc();
                tracing::debug!(cause = %e, kind, %peer, "connection ended with an error");
            }
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!("shutting down: no longer accepting; finishing in-flight requests");
    draining.cancel();
    let tasks = proxy.tasks().clone();
    tasks.close();
    let drained = tokio::time::timeout(grace, async {
        graceful.shutdown().await;
        tasks.wait().await;
    })
    .await;
    match drained {
        Ok(()) => tracing::info!("drained"),
        Err(_) => tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            still_running = tasks.len(),
            "grace period over; exiting with requests still in flight (their keys free up when the leases run out)"
        ),
    }
}

/// Why a client connection ended badly, for the log and `connection_errors_total`.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Http(Box<dyn std::error::Error + Send + Sync>),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("no request head within the header read timeout")]
    NoHead,
}

impl ConnError {
    fn kind(&self) -> &'static str {
        let e = match self {
            ConnError::Http(e) => e,
            ConnError::Tls(_) => return "tls_handshake",
            ConnError::NoHead => return "header_timeout",
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
enum Protocol {
    Http1,
    Http2,
}

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Tells HTTP/2 with prior knowledge from HTTP/1 on a plain connection by peeking at its
/// first bytes, which stay in the socket for hyper to read.
async fn sniff(stream: &TcpStream) -> std::io::Result<Protocol> {
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
async fn before_serving<T>(
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

/// Serves one connection in `protocol` until it ends or the server drains.
async fn serve<I, F>(
    h1: &http1::Builder,
    h2: &http2::Builder<TokioExecutor>,
    protocol: Protocol,
    io: I,
    svc: impl hyper::service::Service<
        http::Request<Incoming>,
        Response = http::Response<crate::proxy::body::ProxyBody>,
        Error = Infallible,
        Future = F,
    > + Clone
    + Send
    + 'static,
    watcher: Watcher,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Future<Output = Result<http::Response<crate::proxy::body::ProxyBody>, Infallible>>
        + Send
        + 'static,
{
    let io = TokioIo::new(io);
    let served = match protocol {
        // Upgrades (WebSocket) are not proxied, so the connection needs no upgrade support.
        Protocol::Http1 => watcher.watch(h1.serve_connection(io, svc)).await,
        // Boxed: HTTP/2's connection state is larger, and HTTP/1 connections are the many.
        Protocol::Http2 => Box::pin(watcher.watch(h2.serve_connection(io, svc))).await,
    };
    served.map_err(|e| ConnError::Http(Box::new(e)))
}

fn service<S: KeyStore>(
    proxy: Proxy<S>,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = http::Response<crate::proxy::body::ProxyBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<crate::proxy::body::ProxyBody>, Infallible>>
             + Send,
> + Clone {
    service_fn(move |req: http::Request<Incoming>| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(proxy.handle(req, peer).await) }
    })
}
