//! The upstream's connection pool: a stack of idle HTTP/1.1 keep-alive connections, the
//! open ones bounded by permits, and the bodies that give a connection back when its
//! answer ends (see `forward` for why the proxy keeps a pool of its own).

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use super::body::{BoxError, ProxyBody};

/// How long an unused upstream connection is kept.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Read buffer of an upstream connection: enough for any ordinary head in one read,
/// small enough that hundreds of connections cost little.
pub(super) const READ_BUFFER: usize = 8 * 1024;

/// The upstream's connections: idle ones on a stack, the open ones bounded by permits.
pub(super) struct Pool {
    pub(super) connector: HttpsConnector<HttpConnector>,
    pub(super) origin: Uri,
    /// Most recently used on top, so a burst's extra connections age out at the bottom.
    pub(super) idle: Mutex<VecDeque<Idle>>,
    /// Bounds the requests in flight to the upstream (and so its connections): past it,
    /// requests queue here, within their timeout, instead of opening more sockets.
    pub(super) permits: Arc<Semaphore>,
}

/// The transport of an upstream connection (plain TCP or TLS).
pub(super) type Io = <HttpsConnector<HttpConnector> as Service<Uri>>::Response;

/// One upstream connection: the handle requests are sent on and the connection's I/O,
/// which runs only while its holder polls it.
pub(super) struct Conn {
    pub(super) sender: http1::SendRequest<SentBody>,
    /// `None` once the connection has ended (closed or failed). Dropping it drops what
    /// was queued on it, so a request it never wrote is handed back to its sender.
    pub(super) io: Option<http1::Connection<Io, SentBody>>,
}

impl Conn {
    /// Moves the connection's I/O forward as far as it can go now, and arranges for the
    /// current task to be woken when it can go further.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        if let Poll::Ready(result) = Pin::new(io).poll(cx) {
            self.io = None;
            if let Err(e) = result {
                tracing::debug!(cause = %e, "upstream connection ended with an error");
            }
        }
    }

    pub(super) fn ended(&self) -> bool {
        self.io.is_none()
    }
}

pub(super) struct Idle {
    pub(super) conn: Box<Conn>,
    pub(super) since: Instant,
}

/// A connection lent to one request; it goes back to the pool when the answer's body
/// has been read to the end and the request's body was sent whole.
pub(super) struct Lease {
    /// Boxed: the connection's state is large and changes hands on every request.
    pub(super) conn: Box<Conn>,
    pub(super) pool: Arc<Pool>,
    pub(super) request_sent: Arc<AtomicBool>,
}

/// An upstream answer's body. It holds its connection's permit until it is dropped, and
/// returns the connection to the pool when it ends.
pub struct UpstreamBody {
    pub(super) inner: Incoming,
    pub(super) lease: Option<Lease>,
    pub(super) _permit: OwnedSemaphorePermit,
}

impl UpstreamBody {
    pub(super) fn finish(&mut self) {
        if let Some(lease) = self.lease.take() {
            // A request body still being sent (the upstream answered early) keeps its
            // connection busy: that connection is closed instead of reused.
            if lease.request_sent.load(Ordering::Acquire) && !lease.conn.ended() {
                lease.pool.put(lease.conn);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // The body's bytes arrive only while its connection's I/O is driven.
        if let Some(lease) = self.lease.as_mut() {
            lease.conn.drive(cx);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(),
            // An error ends the connection: dropping the lease closes it.
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request's body, marking when it has been sent whole (or had nothing to send).
/// The pool's connections take it as it is, so it is not boxed a second time.
pub(super) struct SentBody {
    pub(super) inner: ProxyBody,
    pub(super) sent: Arc<AtomicBool>,
}

impl Body for SentBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.sent.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Pool {
    /// The most recently used idle connection, if there is one that is not too old. (An
    /// idle connection is not driven, so whether the upstream closed it shows only when
    /// it is used.)
    pub(super) fn checkout(&self) -> Option<Box<Conn>> {
        let mut idle = self.lock();
        while let Some(Idle { conn, since }) = idle.pop_back() {
            if since.elapsed() <= IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    pub(super) fn put(&self, conn: Box<Conn>) {
        let now = Instant::now();
        let mut idle = self.lock();
        while idle
            .front()
            .is_some_and(|old| now.duration_since(old.since) > IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        idle.push_back(Idle { conn, since: now });
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        // The queue stays consistent even if a holder panicked: push and pop only.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a new connection; its I/O runs when its holder drives it.
    pub(super) async fn connect(&self) -> Result<Box<Conn>, BoxError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await?;
        let io = connector.call(self.origin.clone()).await?;
        let (sender, io) = http1::Builder::new()
            .read_buf_exact_size(Some(READ_BUFFER))
            .handshake(io)
            .await?;
        Ok(Box::new(Conn {
            sender,
            io: Some(io),
        }))
    }
}
