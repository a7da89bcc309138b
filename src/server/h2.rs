//! Serving one HTTP/2 connection with the hygiene hyper leaves to its user: a connection
//! with no open stream for `limits.http2_idle_timeout` is closed with GOAWAY (HTTP/1's
//! idle connections close at the header timeout), and a peer that leaves what it is sent
//! unread — its window or its socket full, e.g. while it floods PINGs it never reads the
//! answers to — is disconnected after `limits.send_timeout`. hyper's keep-alive pings
//! (`limits.http2_ping_interval`, `…_timeout`) close a peer that stopped answering.
//!
//! Without these, idle HTTP/2 connections stayed open for good, and `limits.max_connections`
//! of them locked every new client out.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::error::ConnError;
use crate::body::{BoxError, ProxyBody, boxed};
use crate::config::Limits;
use crate::problem::ProxyError;
use crate::proxy::{ConnectionWork, Proxy};
use crate::store::KeyStore;

/// What the watchdog reads of a connection: its open streams, when that last changed, and
/// since when a write has been waiting for the peer to read.
struct Activity {
    /// Milliseconds are counted from here.
    base: Instant,
    open: AtomicUsize,
    /// When the last stream ended (or the connection started), in ms from `base`.
    quiet_since: AtomicU64,
    /// When a write started waiting for the peer, in ms from `base` plus one; 0: none is.
    stalled_since: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            open: AtomicUsize::new(0),
            quiet_since: AtomicU64::new(0),
            stalled_since: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// A stream opened: dropped when it ends (answered, reset, or its handler dropped).
    fn stream(self: &Arc<Self>) -> StreamGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        StreamGuard(Arc::clone(self))
    }

    fn write_ready(&self, pending: bool) {
        if pending {
            if self.stalled_since.load(Ordering::Relaxed) == 0 {
                self.stalled_since
                    .store(self.now_ms() + 1, Ordering::Relaxed);
            }
        } else if self.stalled_since.load(Ordering::Relaxed) != 0 {
            self.stalled_since.store(0, Ordering::Relaxed);
        }
    }
}

/// One open stream; its end is the connection's activity.
struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        activity
            .quiet_since
            .store(activity.now_ms(), Ordering::Release);
        activity.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `io` as HTTP/2 until it ends, the server drains, it idles past its timeout or
/// its peer stops reading.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve<S: KeyStore, I>(
    builder: &http2::Builder<TokioExecutor>,
    limits: Limits,
    io: I,
    proxy: Proxy<S>,
    peer: SocketAddr,
    draining: &CancellationToken,
    watcher: Watcher,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Held to the end: the drain waits for every watcher to be dropped.
    let _watcher = watcher;
    let activity = Arc::new(Activity::new());
    let io = Watched {
        io,
        activity: Arc::clone(&activity),
    };
    let svc = service(proxy, peer, Arc::clone(&activity));
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut closing = false;
    // After a GOAWAY for idleness, how long the peer has to let the connection end
    // (hyper waits for its answer to a ping first): a peer that does not is dropped.
    let mut close_by: Option<Instant> = None;
    loop {
        let mut next = deadline(&activity, &limits, closing);
        if let Some(by) = close_by {
            next = next.min(by);
        }
        tokio::select! {
            done = conn.as_mut() => return done.map_err(|e| ConnError::Http(Box::new(e))),
            () = draining.cancelled(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = sleep_until(next) => {
                if close_by.is_some_and(|by| Instant::now() >= by) {
                    return Ok(());
                }
                let now = activity.now_ms();
                let stalled = activity.stalled_since.load(Ordering::Relaxed);
                if stalled != 0 && now + 1 - stalled >= limits.send_timeout.as_millis() as u64 {
                    return Err(ConnError::SendTimeout);
                }
                let idle = activity.open.load(Ordering::Acquire) == 0
                    && now.saturating_sub(activity.quiet_since.load(Ordering::Acquire))
                        >= limits.http2_idle_timeout.as_millis() as u64;
                if idle && !closing {
                    tracing::debug!(%peer, "closing an idle HTTP/2 connection (limits.http2_idle_timeout)");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    close_by = Some(Instant::now() + limits.http2_ping_timeout);
                }
            }
        }
    }
}

/// When the watchdog looks next: when the idle timeout would run out (no stream open),
/// when a stalled write would exceed the send timeout, and otherwise after the shorter of
/// the two.
fn deadline(activity: &Activity, limits: &Limits, closing: bool) -> Instant {
    let now = Instant::now();
    let mut next = now + limits.http2_idle_timeout.min(limits.send_timeout);
    if !closing && activity.open.load(Ordering::Acquire) == 0 {
        let quiet = activity.at(activity.quiet_since.load(Ordering::Acquire));
        next = next.min(quiet + limits.http2_idle_timeout);
    }
    let stalled = activity.stalled_since.load(Ordering::Relaxed);
    if stalled != 0 {
        next = next.min(activity.at(stalled - 1) + limits.send_timeout);
    }
    next.max(now + Duration::from_millis(10))
}

/// The connection's socket, noting when a write waits for the peer to read.
struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.activity.write_ready(polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.activity.write_ready(polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.activity.write_ready(polled.is_pending());
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that keeps its stream counted as open until it ends or is dropped.
fn counted(body: ProxyBody, guard: StreamGuard) -> ProxyBody {
    boxed(Counted {
        inner: body,
        _guard: guard,
    })
}

struct Counted {
    inner: ProxyBody,
    _guard: StreamGuard,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The service of one HTTP/2 connection: each request tagged with the connection's
/// detached work (see `proxy::admission`), and counted as an open stream in `activity`
/// until its answer ends.
fn service<S: KeyStore>(
    proxy: Proxy<S>,
    peer: SocketAddr,
    activity: Arc<Activity>,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = http::Response<crate::body::ProxyBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<crate::body::ProxyBody>, Infallible>> + Send,
> + Clone {
    // This connection's detached work: a reset stream's counts until it ends.
    let work = Arc::new(ConnectionWork::default());
    service_fn(move |mut req: http::Request<Incoming>| {
        let proxy = proxy.clone();
        req.extensions_mut().insert(Arc::clone(&work));
        let stream = activity.stream();
        async move {
            let resp = match malformed_h2(&req) {
                Some(refused) => refused.into_response_in(&proxy.config().errors),
                None => proxy.handle(req, peer).await,
            };
            Ok::<_, Infallible>(resp.map(|body| counted(body, stream)))
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
