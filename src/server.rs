//! The accept loop: one task per connection, HTTP/1.1 and HTTP/2, graceful drain.
//!
//! `run` takes a bound listener and a shutdown future, so tests bind port 0 and stop the
//! server with a oneshot, exactly as the binary stops it with SIGTERM.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // The read buffer bounds a request head: larger gets 431.
        .max_buf_size(limits.max_header_bytes);
    // Past the limit, connections wait in the kernel's accept queue instead of being served.
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
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
        let (builder, watcher, svc) = (
            builder.clone(),
            graceful.watcher(),
            service(proxy.clone(), peer),
        );
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let served = match acceptor {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    watcher
                        .watch(conn.into_owned())
                        .await
                        .map_err(ConnError::Http)
                }
                // The handshake counts against the header timeout, like a slow head.
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let conn =
                                builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
                            watcher
                                .watch(conn.into_owned())
                                .await
                                .map_err(ConnError::Http)
                        }
                        Ok(Err(e)) => Err(ConnError::Tls(e.to_string())),
                        Err(_) => Err(ConnError::Tls("handshake timed out".into())),
                    }
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
}

impl ConnError {
    fn kind(&self) -> &'static str {
        let ConnError::Http(e) = self else {
            return "tls_handshake";
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
