//! The upstream's connection pool: a stack of idle HTTP/1.1 keep-alive connections, the
//! open ones bounded by permits, and the bodies that give a connection back when its
//! answer ends (see `forward` for why the proxy keeps a pool of its own).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tower_service::Service;

use crate::body::BoxError;
use crate::http1::BodyError;
use crate::http1::client::Connection;
use crate::http1::client::answer::AnswerBody;

/// How long an unused upstream connection is kept.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request that finds every upstream connection busy waits for one to come
/// back before it opens another (see [`Pool::checkout`]).
pub(super) const HANDOFF: Duration = Duration::from_millis(2);

/// The upstream's connections: idle ones on a stack, the open ones bounded by permits.
pub(super) struct Pool {
    pub(super) connector: HttpsConnector<HttpConnector>,
    pub(super) origin: Uri,
    /// Idle connections, and the requests waiting for one to come back.
    pub(super) slots: Mutex<Slots>,
    /// Bounds the requests in flight to the upstream (and so its connections): past it,
    /// requests queue here, within their timeout, instead of opening more sockets.
    pub(super) permits: Arc<Semaphore>,
}

/// What the pool holds between requests.
#[derive(Default)]
pub(super) struct Slots {
    /// Most recently used on top, so a burst's extra connections age out at the bottom.
    idle: VecDeque<Idle>,
    /// Requests that found every connection busy, oldest first: a connection given back
    /// goes to the first of them still waiting.
    waiters: VecDeque<oneshot::Sender<Connection>>,
}

struct Idle {
    conn: Connection,
    since: Instant,
}

/// An upstream answer's body. It holds its connection's permit until it is dropped, and
/// returns the connection to the pool when it ends.
pub struct UpstreamBody {
    pub(super) inner: AnswerBody,
    pub(super) pool: Arc<Pool>,
    pub(super) _permit: OwnedSemaphorePermit,
}

impl UpstreamBody {
    /// Gives the connection back once the body has ended (and the upstream keeps it open).
    pub(super) fn finish(&mut self) {
        if let Some(conn) = self.inner.take_connection() {
            self.pool.put(conn);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(),
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

impl Pool {
    /// An idle connection, or else one given back within [`HANDOFF`]; `None`: open one.
    ///
    /// Why wait at all: a burst of requests (a batch of reservations committed together)
    /// would otherwise open a connection each while the busy ones are a fraction of a
    /// millisecond from free, and each upstream connection holds buffers for as long as it
    /// stays in the pool. Waiting briefly keeps the pool near the concurrency the upstream
    /// actually needs; a slow upstream still gets a new connection after [`HANDOFF`].
    pub(super) async fn checkout(&self) -> Option<Connection> {
        let mut waiting = {
            let mut slots = self.lock();
            if let Some(conn) = Self::freshest(&mut slots.idle) {
                return Some(conn);
            }
            while slots
                .waiters
                .front()
                .is_some_and(oneshot::Sender::is_closed)
            {
                slots.waiters.pop_front();
            }
            let (handoff, waiting) = oneshot::channel();
            slots.waiters.push_back(handoff);
            waiting
        };
        match tokio::time::timeout(HANDOFF, &mut waiting).await {
            Ok(conn) => conn.ok(),
            Err(_) => {
                // One given back as the wait ran out is still taken.
                waiting.close();
                waiting.try_recv().ok()
            }
        }
    }

    /// The most recently used idle connection that is not too old. (An idle connection
    /// is not driven, so whether the upstream closed it shows only when it is used.)
    fn freshest(idle: &mut VecDeque<Idle>) -> Option<Connection> {
        while let Some(Idle { conn, since }) = idle.pop_back() {
            if since.elapsed() <= IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    /// Gives a connection back: to the first request still waiting, or to the idle stack.
    pub(super) fn put(&self, mut conn: Connection) {
        let now = Instant::now();
        let mut slots = self.lock();
        while let Some(waiter) = slots.waiters.pop_front() {
            match waiter.send(conn) {
                Ok(()) => return,
                Err(back) => conn = back,
            }
        }
        while slots
            .idle
            .front()
            .is_some_and(|old| now.duration_since(old.since) > IDLE_TIMEOUT)
        {
            slots.idle.pop_front();
        }
        slots.idle.push_back(Idle { conn, since: now });
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // The queues stay consistent even if a holder panicked: push and pop only.
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a new connection.
    pub(super) async fn connect(&self) -> Result<Connection, BoxError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await?;
        let io = connector.call(self.origin.clone()).await?;
        Ok(Connection::new(TokioIo::new(io)))
    }
}
