//! Sending requests upstream over a small pool of HTTP/1.1 keep-alive connections.
//!
//! The one distinction that matters for idempotency is made here: a connection that could
//! not be made, or a request the connection refused before writing a byte of it, means
//! nothing was sent (the key can be released); any later failure means the upstream may
//! have acted (the key must stay in progress).
//!
//! Why an own pool instead of hyper-util's general client: there is exactly one upstream,
//! so the pool is one stack of idle connections with no per-host map, and a connection goes
//! back on the stack when its answer's body ends, with no task spawned per request to
//! watch for that. It also lets the proxy size each connection's read buffer and keep the
//! number of upstream sockets within `upstream.max_connections`.
//!
//! A connection has no task of its own either: whoever holds it drives its I/O (the
//! request's future until the answer's head, then the answer's body). A request and its
//! upstream exchange so run in one task with no hand-over between tasks, which is most of
//! what a pass-through request costs beyond the system calls. An idle connection is not
//! polled at all; one the upstream closed meanwhile is found out when it is next used.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, header, request};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use super::body::{BoxError, ProxyBody};
use super::headers::{set_forwarded, strip_hop_by_hop};
use crate::config::UpstreamConfig;

/// How long an unused upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Read buffer of an upstream connection: enough for any ordinary head in one read,
/// small enough that hundreds of connections cost little.
const READ_BUFFER: usize = 8 * 1024;

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection could be made, or the connection refused the request before writing
    /// it: the request was certainly not sent.
    #[error("could not connect to the upstream: {0}")]
    NotSent(#[source] BoxError),
    /// The connection failed after the request may have been sent.
    #[error("upstream connection failed: {0}")]
    Failed(#[source] BoxError),
}

/// Forwards requests to the configured upstream.
#[derive(Clone)]
pub struct Forwarder {
    pool: Arc<Pool>,
    /// `X-Forwarded-Proto`: how clients reached this proxy.
    client_proto: &'static str,
    upstream: UpstreamConfig,
    /// `Host` of every upstream request: the upstream's authority.
    host: HeaderValue,
}

/// The upstream's connections: idle ones on a stack, the open ones bounded by permits.
struct Pool {
    connector: HttpsConnector<HttpConnector>,
    origin: Uri,
    /// Most recently used on top, so a burst's extra connections age out at the bottom.
    idle: Mutex<VecDeque<Idle>>,
    /// Bounds the requests in flight to the upstream (and so its connections): past it,
    /// requests queue here, within their timeout, instead of opening more sockets.
    permits: Arc<Semaphore>,
}

/// The transport of an upstream connection (plain TCP or TLS).
type Io = <HttpsConnector<HttpConnector> as Service<Uri>>::Response;

/// One upstream connection: the handle requests are sent on and the connection's I/O,
/// which runs only while its holder polls it.
struct Conn {
    sender: http1::SendRequest<SentBody>,
    /// `None` once the connection has ended (closed or failed). Dropping it drops what
    /// was queued on it, so a request it never wrote is handed back to its sender.
    io: Option<http1::Connection<Io, SentBody>>,
}

impl Conn {
    /// Moves the connection's I/O forward as far as it can go now, and arranges for the
    /// current task to be woken when it can go further.
    fn drive(&mut self, cx: &mut Context<'_>) {
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

    fn ended(&self) -> bool {
        self.io.is_none()
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// A connection lent to one request; it goes back to the pool when the answer's body
/// has been read to the end and the request's body was sent whole.
struct Lease {
    /// Boxed: the connection's state is large and changes hands on every request.
    conn: Box<Conn>,
    pool: Arc<Pool>,
    request_sent: Arc<AtomicBool>,
}

/// An upstream answer's body. It holds its connection's permit until it is dropped, and
/// returns the connection to the pool when it ends.
pub struct UpstreamBody {
    inner: Incoming,
    lease: Option<Lease>,
    _permit: OwnedSemaphorePermit,
}

impl UpstreamBody {
    fn finish(&mut self) {
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
struct SentBody {
    inner: ProxyBody,
    sent: Arc<AtomicBool>,
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
    fn checkout(&self) -> Option<Box<Conn>> {
        let mut idle = self.lock();
        while let Some(Idle { conn, since }) = idle.pop_back() {
            if since.elapsed() <= IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    fn put(&self, conn: Box<Conn>) {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        // The queue stays consistent even if a holder panicked: push and pop only.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a new connection; its I/O runs when its holder drives it.
    async fn connect(&self) -> Result<Box<Conn>, BoxError> {
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

impl Forwarder {
    /// Builds the pool for `upstream`; connections open on first use.
    pub fn new(upstream: UpstreamConfig, client_tls: bool) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(upstream.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config((*upstream.tls).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let pool = Arc::new(Pool {
            connector,
            origin: upstream.origin.clone(),
            idle: Mutex::new(VecDeque::new()),
            permits: Arc::new(Semaphore::new(upstream.max_connections)),
        });
        let client_proto = if client_tls { "https" } else { "http" };
        let host = host_header(&upstream.origin);
        Self {
            pool,
            client_proto,
            upstream,
            host,
        }
    }

    /// A forwarder with a pool of its own that shares this one's `upstream.max_connections`.
    ///
    /// Why: a connection's socket is registered with the runtime that opened it, and only
    /// that runtime's thread learns when it is ready. A server thread with its own runtime
    /// therefore needs connections it opened itself.
    pub fn sibling(&self) -> Self {
        Self {
            pool: Arc::new(Pool {
                connector: self.pool.connector.clone(),
                origin: self.pool.origin.clone(),
                idle: Mutex::new(VecDeque::new()),
                permits: Arc::clone(&self.pool.permits),
            }),
            client_proto: self.client_proto,
            upstream: self.upstream.clone(),
            host: self.host.clone(),
        }
    }

    /// The upstream settings (timeouts).
    pub fn upstream(&self) -> &UpstreamConfig {
        &self.upstream
    }

    /// Turns a client request's head into the upstream request: the upstream's path in
    /// origin form, hop-by-hop headers stripped, `X-Forwarded-*` set, `Host` the upstream's.
    pub fn upstream_request(
        &self,
        mut parts: request::Parts,
        body: ProxyBody,
        peer: SocketAddr,
    ) -> Request<ProxyBody> {
        let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        strip_hop_by_hop(&mut parts.headers);
        set_forwarded(&mut parts.headers, peer, original_host, self.client_proto);
        parts.headers.insert(header::HOST, self.host.clone());
        parts.uri = self.upstream_uri(&parts.uri);
        parts.version = http::Version::HTTP_11;
        Request::from_parts(parts, body)
    }

    /// The request line's target: the request's own path and query, after the upstream
    /// URL's path prefix if it has one.
    fn upstream_uri(&self, uri: &Uri) -> Uri {
        if self.upstream.base_path.is_empty() {
            // The common case: no prefix, so the request's own path is reused as it is.
            let pq = uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            return Uri::from(pq);
        }
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        format!("{}{pq}", self.upstream.base_path)
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"))
    }

    /// Sends the request and returns the answer's head; the body streams afterwards.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let pool = &self.pool;
        let Ok(permit) = Arc::clone(&pool.permits).acquire_owned().await else {
            return Err(ForwardError::NotSent(
                "upstream connection limiter closed".into(),
            ));
        };
        // hyper never polls a body that reports its end up front (no body at all).
        let request_sent = Arc::new(AtomicBool::new(req.body().is_end_stream()));
        let mut req = req.map(|inner| SentBody {
            inner,
            sent: Arc::clone(&request_sent),
        });
        // A pooled connection the upstream closed while idle refuses the request before
        // writing it; the request then goes out on another one. A new connection that
        // refuses it ends the attempt: nothing was sent.
        loop {
            let (mut conn, fresh) = match pool.checkout() {
                Some(conn) => (conn, false),
                // Boxed: connecting is rare, and its state would otherwise make every
                // request's future larger.
                None => (
                    Box::pin(pool.connect())
                        .await
                        .map_err(ForwardError::NotSent)?,
                    true,
                ),
            };
            // A reused connection becomes ready once its I/O has caught up with the end
            // of its previous exchange; one the upstream closed meanwhile reports that.
            let ready = poll_fn(|cx| {
                conn.drive(cx);
                conn.sender.poll_ready(cx)
            })
            .await;
            if let Err(e) = ready {
                if fresh {
                    return Err(ForwardError::NotSent(Box::new(e)));
                }
                continue;
            }
            let mut answer = std::pin::pin!(conn.sender.try_send_request(req));
            let answered = poll_fn(|cx| {
                conn.drive(cx);
                answer.as_mut().poll(cx)
            })
            .await;
            match answered {
                Ok(resp) => {
                    let lease = Lease {
                        conn,
                        pool: Arc::clone(pool),
                        request_sent,
                    };
                    let (parts, inner) = resp.into_parts();
                    let mut body = UpstreamBody {
                        inner,
                        lease: Some(lease),
                        _permit: permit,
                    };
                    if body.inner.is_end_stream() {
                        body.finish();
                    }
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    Some(back) if !fresh => req = back,
                    Some(_) => return Err(ForwardError::NotSent(Box::new(e.into_error()))),
                    None => return Err(ForwardError::Failed(Box::new(e.into_error()))),
                },
            }
        }
    }
}

/// `Host` for requests to `origin`: its host, and its port unless the scheme's default.
fn host_header(origin: &Uri) -> HeaderValue {
    let host = origin.host().unwrap_or("localhost");
    let default_port = if origin.scheme() == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    };
    let value = match origin.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("localhost"))
}
