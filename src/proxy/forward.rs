//! Sending requests upstream over a pooled hyper-util client.
//!
//! The one distinction that matters for idempotency is made here: a connection that could
//! not be made means nothing was sent (the key can be released); any later failure means
//! the upstream may have acted (the key must stay in progress).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, Uri, header, request};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::body::{BoxError, ProxyBody};
use super::headers::{set_forwarded, strip_hop_by_hop};
use crate::config::UpstreamConfig;

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection could be made: the request was certainly not sent.
    #[error("could not connect to the upstream: {0}")]
    NotSent(#[source] BoxError),
    /// The connection failed after the request may have been sent.
    #[error("upstream connection failed: {0}")]
    Failed(#[source] BoxError),
}

/// Forwards requests to the configured upstream.
#[derive(Clone)]
pub struct Forwarder {
    /// Pooled keep-alive client (plain or TLS, by the URL's scheme); cloning shares the pool.
    client: Client<HttpsConnector<HttpConnector>, ProxyBody>,
    /// `X-Forwarded-Proto`: how clients reached this proxy.
    client_proto: &'static str,
    upstream: UpstreamConfig,
    /// Bounds the requests in flight to the upstream (and so its connections): past it,
    /// requests queue here, within their timeout, instead of opening more sockets.
    permits: Arc<Semaphore>,
}

/// An upstream answer's body, holding its connection's permit until it is dropped.
pub struct UpstreamBody {
    inner: Incoming,
    _permit: OwnedSemaphorePermit,
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Forwarder {
    /// Builds the client for `upstream`.
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
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .pool_max_idle_per_host(upstream.max_connections)
            .build(connector);
        let permits = Arc::new(Semaphore::new(upstream.max_connections));
        let client_proto = if client_tls { "https" } else { "http" };
        Self {
            client,
            client_proto,
            upstream,
            permits,
        }
    }

    /// The upstream settings (timeouts).
    pub fn upstream(&self) -> &UpstreamConfig {
        &self.upstream
    }

    /// Turns a client request's head into the upstream request: upstream URI, hop-by-hop
    /// headers stripped, `X-Forwarded-*` set, `Host` left to the client to set.
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
        parts.headers.remove(header::HOST);
        set_forwarded(&mut parts.headers, peer, original_host, self.client_proto);
        parts.uri = self.upstream_uri(&parts.uri);
        parts.version = http::Version::HTTP_11;
        Request::from_parts(parts, body)
    }

    fn upstream_uri(&self, uri: &Uri) -> Uri {
        let mut parts = self.upstream.origin.clone().into_parts();
        parts.path_and_query = if self.upstream.base_path.is_empty() {
            // The common case: no prefix, so the request's own path is reused as it is.
            Some(
                uri.path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
            )
        } else {
            let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
            format!("{}{pq}", self.upstream.base_path).parse().ok()
        };
        Uri::from_parts(parts).unwrap_or_else(|_| self.upstream.origin.clone())
    }

    /// Sends the request and returns the answer's head; the body streams afterwards.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ForwardError> {
        let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await else {
            return Err(ForwardError::NotSent(
                "upstream connection limiter closed".into(),
            ));
        };
        let resp = self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::NotSent(Box::new(e))
            } else {
                ForwardError::Failed(Box::new(e))
            }
        })?;
        Ok(resp.map(|inner| UpstreamBody {
            inner,
            _permit: permit,
        }))
    }
}
