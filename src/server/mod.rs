//! The accept loop: one task per connection, HTTP/1.1 and HTTP/2, graceful drain; and the
//! server threads the binary runs it on, one per core.
//!
//! `run` takes a bound listener and a shutdown future, so tests bind port 0 and stop the
//! server with a oneshot, exactly as the binary stops it with SIGTERM. The binary uses
//! `bind` and `run_threaded`: the same loop on every thread, each thread with a listening
//! socket and a runtime of its own.
//!
//! The protocol is chosen before hyper sees a byte: by ALPN on TLS, and on a plain
//! listener by peeking (not reading) at the first bytes for HTTP/2's preface. hyper then
//! reads the head straight into its own buffer. (hyper-util's auto-detection reads the
//! first bytes itself and replays them, which costs a layer on every read and, by the
//! way its read buffer then grows, 16 KiB instead of 8 KiB per connection.)

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio_util::sync::CancellationToken;

mod conn;
mod error;
mod h2;

use crate::metrics::KindLabel;
use crate::proxy::Proxy;
use crate::store::KeyStore;
use conn::{ConnError, Protocol, Protocols, before_serving, serve_protocol, sniff};

/// Serves `proxy` on `listener` until `shutdown` resolves, then stops accepting, lets
/// in-flight requests and their completions finish (up to `grace`), and returns whether
/// all of them did.
pub async fn run<S: KeyStore>(
    listener: TcpListener,
    proxy: Proxy<S>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> bool {
    let gate = Gate::new(proxy.config().limits.max_connections);
    let graceful = accept(listener, &proxy, shutdown, &gate).await;
    start_drain(&proxy, &gate);
    let drained = drain(graceful, &proxy, grace).await;
    report_drain(drained, &proxy, grace);
    drained
}

/// The moment shutdown starts: readiness turns false, idle connections are closed.
fn start_drain<S: KeyStore>(proxy: &Proxy<S>, gate: &Gate) {
    proxy.start_draining();
    gate.draining.cancel();
    tracing::info!("shutting down: not ready, no longer accepting; finishing in-flight requests");
}

/// Binds `threads` listening sockets to `addr` for [`run_threaded`], one per server
/// thread. Several sockets share the address with `SO_REUSEPORT`, and the kernel spreads
/// new connections over them.
///
/// `SO_REUSEPORT` would also let a second process bind the address silently; so the address
/// is first bound without it, which fails as usual when the port is taken.
pub async fn bind(addr: SocketAddr, threads: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let exclusive = TcpListener::bind(addr).await?;
    if threads <= 1 {
        return Ok(vec![exclusive.into_std()?]);
    }
    // Port 0 has become a real port; the group binds that one.
    let addr = exclusive.local_addr()?;
    drop(exclusive);
    (0..threads)
        .map(|_| {
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(LISTEN_BACKLOG)?.into_std()
        })
        .collect()
}

/// Like [`run`], with one server thread per listener (see [`bind`]): this thread serves the
/// first, and a new thread with a single-threaded runtime of its own serves each other one.
///
/// Why: on a work-stealing runtime, the tasks of one request (client connection, detached
/// execution, store connection) wake each other across threads, and every such wake-up is
/// a system call. Here a connection and everything it starts stay on the thread that
/// accepted it, with that thread's upstream connections, as in nginx's worker model. The
/// store, the metrics, `limits.max_connections` and the detached executions are shared;
/// on shutdown every thread stops accepting and all of them drain together.
///
/// The calling thread must run a current-thread runtime: a work-stealing one would move
/// this thread's connections to its other workers again. Returns whether every in-flight
/// request finished within `grace`.
pub async fn run_threaded<S: KeyStore + Clone>(
    listeners: Vec<std::net::TcpListener>,
    proxy: Proxy<S>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<bool> {
    let gate = Gate::new(proxy.config().limits.max_connections);
    let mut listeners = listeners.into_iter();
    let Some(first) = listeners.next() else {
        return Ok(true);
    };
    // Every runtime is built before any thread starts, so a failure leaves nothing running.
    let others = listeners
        .map(|listener| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            Ok((listener, runtime))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let first = TcpListener::from_std(first)?;
    let (stop, stopping) = watch::channel(false);
    let (release, released) = watch::channel(false);
    let mut drained = Vec::new();
    for (n, (listener, runtime)) in others.into_iter().enumerate() {
        let (proxy, gate) = (proxy.sibling(), gate.clone());
        let (stopping, released) = (stopping.clone(), released.clone());
        let (done, finished) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("idemproxy-{}", n + 1))
            .spawn(move || {
                runtime.block_on(async move {
                    let graceful = match TcpListener::from_std(listener) {
                        Ok(listener) => accept(listener, &proxy, raised(stopping), &gate).await,
                        Err(e) => {
                            tracing::error!(cause = %e, "a server thread cannot listen");
                            GracefulShutdown::new()
                        }
                    };
                    let _ = done.send(drain(graceful, &proxy, grace).await);
                    // Store connections this runtime opened may serve other threads'
                    // requests: it keeps running them until every thread has drained.
                    raised(released).await;
                });
            })?;
        drained.push(finished);
    }
    let graceful = accept(first, &proxy, shutdown, &gate).await;
    let _ = stop.send(true);
    start_drain(&proxy, &gate);
    let mut all = drain(graceful, &proxy, grace).await;
    for finished in drained {
        all &= finished.await.unwrap_or(false);
    }
    let _ = release.send(true);
    report_drain(all, &proxy, grace);
    Ok(all)
}

/// Resolves once the flag is raised (or its sender is gone).
async fn raised(mut flag: watch::Receiver<bool>) {
    let _ = flag.wait_for(|raised| *raised).await;
}

/// The pending-connection queue of each listening socket.
const LISTEN_BACKLOG: u32 = 1024;

/// What every server thread shares: the connection limit and the start of draining.
#[derive(Clone)]
struct Gate {
    /// Past `limits.max_connections`, connections wait in the kernel's accept queue
    /// instead of being served.
    slots: Arc<Semaphore>,
    /// Cancelled when draining starts: a connection that has not sent a request yet is
    /// closed then, instead of holding the drain up until its header timeout.
    draining: CancellationToken,
}

impl Gate {
    fn new(max_connections: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_connections)),
            draining: CancellationToken::new(),
        }
    }
}

/// Accepts and serves connections, one task each, until `shutdown` resolves. Returns what
/// tracks the connections still open.
async fn accept<S: KeyStore>(
    listener: TcpListener,
    proxy: &Proxy<S>,
    shutdown: impl Future<Output = ()>,
    gate: &Gate,
) -> GracefulShutdown {
    let limits = proxy.config().limits;
    let h1_limits = crate::http1::server::Limits {
        head_timeout: limits.header_read_timeout,
        max_head: limits.max_header_bytes,
    };
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(u32::try_from(limits.http2_max_streams).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(limits.http2_ping_interval))
        .keep_alive_timeout(limits.http2_ping_timeout);
    let protocols = Arc::new(Protocols {
        h1: h1_limits,
        h2,
        limits,
    });
    let graceful = GracefulShutdown::new();
    // TLS on the listener when configured; HTTP/2 is offered by ALPN.
    let acceptor = proxy
        .config()
        .tls
        .clone()
        .map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
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
        // The slot is taken after the accept, not before: a thread waiting in `accept`
        // with a slot in hand would keep it from a connection another thread accepted.
        // At the limit each thread holds one accepted connection until a slot frees, and
        // slots go to the waiting threads in turn.
        let slot = tokio::select! {
            slot = Arc::clone(&gate.slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let metrics = Arc::clone(proxy.metrics());
        let open = metrics.connections_open.clone();
        open.inc();
        let (protocols, watcher, proxy) =
            (Arc::clone(&protocols), graceful.watcher(), proxy.clone());
        let acceptor = acceptor.clone();
        let draining = gate.draining.clone();
        let head_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let served = match acceptor {
                None => match before_serving(&draining, head_timeout, sniff(&stream)).await {
                    None => Ok(()),
                    Some(Ok(Ok(protocol))) => {
                        serve_protocol(
                            &protocols, protocol, stream, proxy, peer, &draining, watcher,
                        )
                        .await
                    }
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
                                serve_protocol(
                                    &protocols, protocol, tls, proxy, peer, &draining, watcher,
                                )
                                .await
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
    graceful
}

/// Waits, up to `grace`, for this thread's connections to finish and for every detached
/// execution. True when all of them finished.
async fn drain<S: KeyStore>(graceful: GracefulShutdown, proxy: &Proxy<S>, grace: Duration) -> bool {
    let tasks = proxy.tasks().clone();
    tasks.close();
    tokio::time::timeout(grace, async {
        graceful.shutdown().await;
        tasks.wait().await;
    })
    .await
    .is_ok()
}

fn report_drain<S: KeyStore>(drained: bool, proxy: &Proxy<S>, grace: Duration) {
    if drained {
        tracing::info!("drained");
    } else {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            still_running = proxy.tasks().len(),
            "grace period over; exiting with requests still in flight (their keys free up when the leases run out)"
        );
    }
}
