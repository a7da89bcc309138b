//! Sending requests upstream over a pooled hyper-util client.
//!
//! The one distinction that matters for idempotency is made here: a connection that could
//! not be made means nothing was sent (the key can be released); any later failure means
//! the upstream may have acted (the key must stay in progress).

use std::net::SocketAddr;

use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, Uri, header, request};
use hyper::body::Incoming;
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
    /// Pooled keep-alive client; cloning shares the pool.
    client: Client<HttpConnector, ProxyBody>,
    upstream: UpstreamConfig,
}

impl Forwarder {
    /// Builds the client for `upstream`.
    pub fn new(upstream: UpstreamConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(upstream.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(connector);
        Self { client, upstream }
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
        set_forwarded(&mut parts.headers, peer, original_host);
        parts.uri = self.upstream_uri(&parts.uri);
        parts.version = http::Version::HTTP_11;
        Request::from_parts(parts, body)
    }

    fn upstream_uri(&self, uri: &Uri) -> Uri {
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let joined = format!("{}{pq}", self.upstream.base_path);
        let mut parts = self.upstream.origin.clone().into_parts();
        parts.path_and_query = joined
            .parse()
            .ok()
            .or_else(|| Some(PathAndQuery::from_static("/")));
        Uri::from_parts(parts).unwrap_or_else(|_| self.upstream.origin.clone())
    }

    /// Sends the request and returns the answer's head; the body streams afterwards.
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, ForwardError> {
        self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::NotSent(Box::new(e))
            } else {
                ForwardError::Failed(Box::new(e))
            }
        })
    }
}
