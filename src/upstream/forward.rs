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

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, header, request};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;

use super::headers::{set_forwarded, strip_hop_by_hop};
use super::pool::{Pool, UpstreamBody};
use crate::body::{BoxError, ProxyBody};
use crate::config::UpstreamConfig;
use crate::http1::client::SendError;

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
            slots: Mutex::default(),
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
                slots: Mutex::default(),
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
        // An absolute-form target's authority (or HTTP/2's `:authority`) names the host
        // over any `Host` field (RFC 9112 §3.2.2).
        let original_host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| parts.headers.get(header::HOST).cloned());
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
        if pq == "*" {
            // `OPTIONS *` asks about the server, whatever its path prefix.
            return Uri::from_static("*");
        }
        format!("{}{pq}", self.upstream.base_path)
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"))
    }

    /// Sends the request and returns the answer's head; the body streams afterwards.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        self.ready().await?.send(req).await
    }

    /// A connection to send one request on, within `upstream.max_connections`: what a
    /// request waits for before a byte of it is sent. A caller that gives up on this wait
    /// has sent nothing — unlike one that gives up on [`Ready::send`].
    pub async fn ready(&self) -> Result<Ready, ForwardError> {
        let pool = &self.pool;
        let Ok(permit) = Arc::clone(&pool.permits).acquire_owned().await else {
            return Err(ForwardError::NotSent(
                "upstream connection limiter closed".into(),
            ));
        };
        // An idle connection the upstream closed meanwhile (its keep-alive ran out) is
        // found out before the request is written, and the next one is tried.
        let conn = loop {
            match pool.checkout().await {
                Some(mut conn) => {
                    if conn.is_usable().await {
                        break conn;
                    }
                }
                // Boxed: connecting is rare, and its state would otherwise make every
                // request's future larger.
                None => {
                    break Box::pin(pool.connect())
                        .await
                        .map_err(ForwardError::NotSent)?;
                }
            }
        };
        Ok(Ready {
            pool: Arc::clone(pool),
            permit,
            conn,
        })
    }

    /// Most requests in flight to the upstream at once (`upstream.max_connections`).
    pub fn max_connections(&self) -> usize {
        self.upstream.max_connections
    }
}

/// A connection, and the permit to use it, for one request.
pub struct Ready {
    pool: Arc<Pool>,
    permit: OwnedSemaphorePermit,
    conn: crate::http1::client::Connection,
}

impl Ready {
    /// Sends the request on this connection and returns the answer's head.
    pub async fn send(
        self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let Ready { pool, permit, conn } = self;
        let (parts, body) = req.into_parts();
        match conn.send(parts, body).await {
            Ok(resp) => {
                let (parts, inner) = resp.into_parts();
                let mut body = UpstreamBody {
                    inner,
                    pool,
                    _permit: permit,
                };
                if body.inner.is_end_stream() {
                    body.finish();
                }
                Ok(Response::from_parts(parts, body))
            }
            Err(SendError::NotSent(e)) => Err(ForwardError::NotSent(Box::new(e))),
            Err(SendError::Failed(e)) => Err(ForwardError::Failed(e)),
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
