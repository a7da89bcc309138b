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
        let open = proxy.metrics().connections_open.clone();
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
                    watcher.watch(conn.into_owned()).await
                }
                // The handshake counts against the header timeout, like a slow head.
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let conn =
                                builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
                            watcher.watch(conn.into_owned()).await
                        }
                        Ok(Err(e)) => Err(e.into()),
                        Err(_) => Err("TLS handshake timed out".into()),
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!(cause = %e, %peer, "connection ended with an error");
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
