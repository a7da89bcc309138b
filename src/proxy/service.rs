//! [`Proxy::handle`]: the entry point for every request — route lookup, pass-through, and
//! the hand-over to the protected path.
//!
//! `handle` never fails: every error becomes a problem response here, logged once.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Body;

use super::key::{parse_keys, scoped_key};
use super::protect::{self, Protected};
use super::state::{Proxy, error_chain};
use crate::body::{BoxError, ProxyBody, boxed};
use crate::config::Lookup;
use crate::config::{EchoKey, Route};
use crate::dialect::Dialect;
use crate::http1::server::{Handler, HeadError, OptionalBody};
use crate::metrics::KindLabel;
use crate::otlp::{Kind, Trace};
use crate::path::PathError;
use crate::problem::ProxyError;
use crate::store::KeyStore;
use crate::upstream::ForwardError;
use crate::upstream::headers::client_head;

/// The proxy is what its HTTP/1 connections hand their requests to.
impl<S: KeyStore> Handler for Proxy<S> {
    fn handle(
        &self,
        request: Request<OptionalBody>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + '_ {
        Proxy::handle(self, request, peer)
    }

    fn refuse(&self, error: &HeadError) -> Response<ProxyBody> {
        ProxyError::from(error).into_response_in(&self.shared.config.errors)
    }
}

impl<S: KeyStore> Proxy<S> {
    /// Answers one request. Never fails: errors become problem responses.
    ///
    /// The request is boxed before the future is made: each stage's future keeps its own
    /// copy of what it was given for as long as it lives, and a request waiting on the
    /// store (a thousand of them, under load) would otherwise carry several copies of its
    /// head.
    pub fn handle<B>(
        &self,
        req: Request<B>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + '_
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        self.handle_boxed(Box::new(req), peer)
    }

    async fn handle_boxed<B>(&self, req: Box<Request<B>>, peer: SocketAddr) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let started = std::time::Instant::now();
        // For the error log only; both clones are reference counts, not copies (a
        // protected request swaps `uri` for a copy of its own: see `handle_inner`).
        let method = req.method().clone();
        let mut uri = req.uri().clone();
        let mut marks = None;
        let mut trace = None;
        let mut dialect = None;
        let (route, outcome, result) = self
            .handle_inner(req, peer, &mut uri, &mut marks, &mut trace, &mut dialect)
            .await;
        let status = match &result {
            Ok(resp) => resp.status(),
            Err(err) => err.status(),
        };
        if let Some(trace) = trace {
            trace.finish(vec![
                ("http.request.method", method.as_str().into()),
                ("idemproxy.route", (*route).into()),
                ("idemproxy.outcome", outcome.into()),
                ("http.response.status_code", status.as_u16().into()),
            ]);
        }
        self.shared
            .metrics
            .observe_request(&route, outcome, status.as_u16(), started.elapsed());
        let mut resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                let status = err.status();
                // A store fault is said once, when it begins (see `faults`), not per
                // request it refuses.
                let fault_said =
                    matches!(&err, ProxyError::StoreUnavailable(e) if e.fault().is_some());
                // Refusals past a bound come in floods: counted, not logged one by one.
                let fault_said = fault_said || matches!(err, ProxyError::Overloaded { .. });
                if fault_said {
                    tracing::debug!(%method, path = uri.path(), route = &*route, status = status.as_u16(), cause = %error_chain(&err), "request refused: store fault");
                } else if status.is_server_error() {
                    tracing::warn!(%method, path = uri.path(), route = &*route, status = status.as_u16(), cause = %error_chain(&err), "request failed");
                } else if status == http::StatusCode::CONFLICT {
                    // A duplicate of a request in flight: the normal course of a retry.
                    tracing::debug!(%method, path = uri.path(), route = &*route, status = status.as_u16(), reason = %err, "request rejected");
                } else {
                    // The client's to fix: at info, with the reason, for whoever helps it
                    // find out why.
                    tracing::info!(%method, path = uri.path(), route = &*route, status = status.as_u16(), reason = %err, "request rejected");
                }
                err.into_response_in(dialect.as_ref().unwrap_or(&self.shared.config.errors))
            }
        };
        if let Some(marks) = marks {
            marks.apply(&mut resp, outcome == "replayed");
        }
        resp
    }

    /// Routes the request; returns the route's name (`-` for none) and the outcome label
    /// with the result, for metrics.
    async fn handle_inner<B>(
        &self,
        mut req: Box<Request<B>>,
        peer: SocketAddr,
        log_uri: &mut Uri,
        marks: &mut Option<Marks>,
        trace: &mut Option<Trace>,
        dialect: &mut Option<Dialect>,
    ) -> (
        Arc<str>,
        &'static str,
        Result<Response<ProxyBody>, ProxyError>,
    )
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let route_started = self
            .shared
            .tracer
            .is_some()
            .then(std::time::SystemTime::now);
        let (route, uri) = match self.route(&req) {
            Ok(Some(routed)) => routed,
            Ok(None) => {
                let unrouted = Arc::clone(&self.shared.unrouted);
                return Box::pin(self.pass_through(unrouted, req, peer)).await;
            }
            Err(e) => return (Arc::clone(&self.shared.unrouted), "rejected", Err(e)),
        };
        // What was matched is what is forwarded. The copy also frees the connection's read
        // buffer, which the URI as read is a slice of, while a protected request waits.
        *log_uri = uri.clone();
        *req.uri_mut() = uri;
        let policy = &route.policy;
        *dialect = Some(policy.errors.clone());
        let sent = match parse_keys(req.headers(), &policy.key_headers) {
            Ok(Some(sent)) => Some(sent),
            // Looked for in the body once it is read.
            Ok(None) if policy.key_from_body.is_some() => None,
            Ok(None) if policy.require_key => {
                let err = ProxyError::MissingKey {
                    header: policy.key_header_names(),
                    body: None,
                };
                return (Arc::clone(&route.name), "rejected", Err(err));
            }
            Ok(None) => {
                return Box::pin(self.pass_through(Arc::clone(&route.name), req, peer)).await;
            }
            Err((header, reason)) => {
                let err = ProxyError::InvalidKey {
                    header: header.to_string(),
                    reason,
                };
                return (Arc::clone(&route.name), "rejected", Err(err));
            }
        };
        // From here on every answer is a protected one, marked as such.
        let echo =
            |value: http::HeaderValue, header: Option<&http::HeaderName>| match &policy.echo_key {
                EchoKey::AsSent => header.map(|h| (h.clone(), value)),
                EchoKey::Named(name) => Some((name.clone(), value)),
                EchoKey::Off => None,
            };
        let key = sent
            .as_ref()
            .map(|s| scoped_key(&route.name, &s.key, policy.key_scope));
        *marks = Some(Marks {
            replayed: policy.replayed_header.clone(),
            echo: sent
                .as_ref()
                .and_then(|s| echo(s.sent.clone(), Some(&s.header))),
        });
        // One trace per protected request, the caller's when it sent a traceparent.
        if let (Some(tracer), Some(started)) = (&self.shared.tracer, route_started) {
            let t = Trace::start(tracer, req.headers());
            t.stage(
                "route",
                Kind::Internal,
                started,
                vec![("idemproxy.route", (*route.name).into())],
            );
            *trace = Some(t);
        }
        // Boxed: the protected path's state is large, and every request's future (pass
        // through included) would otherwise be as large as it.
        let protected = Box::pin(protect::protect(
            &self.shared,
            Arc::clone(&route),
            key,
            req,
            peer,
            trace.clone(),
        ))
        .await;
        match protected {
            Protected::Answered(outcome, result, body_key) => {
                // A key from the body is echoed only under a configured name.
                if let (Some(marks), Some(key)) = (marks.as_mut(), body_key)
                    && let Ok(value) = http::HeaderValue::from_str(&key)
                {
                    marks.echo = echo(value, None);
                }
                (Arc::clone(&route.name), outcome, result)
            }
            Protected::Unkeyed(req) => {
                *marks = None;
                let req = Box::new(req);
                Box::pin(self.pass_through(Arc::clone(&route.name), req, peer)).await
            }
        }
    }

    /// The route protecting this request and its URI in the route's spelling, `None` when
    /// no route protects it, or a `400` for a path that cannot be normalised safely on a
    /// method some route protects.
    fn route<B>(&self, req: &Request<B>) -> Result<Option<(Arc<Route>, Uri)>, ProxyError> {
        // Every spelling of a protected path is matched, fingerprinted and forwarded as one.
        let table = self.shared.routes.current();
        match table.resolve(req.method(), req.uri().path()) {
            Lookup::Route(route, path) => match respelled(req.uri(), &path) {
                Some(uri) => Ok(Some((Arc::clone(route), uri))),
                None => Err(ProxyError::InvalidPath(PathError::NotAbsolute)),
            },
            Lookup::Unrouted => Ok(None),
            Lookup::Refused(e) => Err(ProxyError::InvalidPath(e)),
        }
    }

    /// Forwards an unprotected request as it is, streaming both ways.
    ///
    /// Callers box it: the upstream exchange's state is large, and every request's future
    /// (a keyed one waiting on the store included, for each of its client's connection)
    /// would otherwise be as large as it.
    async fn pass_through<B>(
        &self,
        route: Arc<str>,
        req: Box<Request<B>>,
        peer: SocketAddr,
    ) -> (
        Arc<str>,
        &'static str,
        Result<Response<ProxyBody>, ProxyError>,
    )
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = (*req).into_parts();
        let forwarder = &self.shared.forwarder;
        let upstream_req = forwarder.upstream_request(parts, boxed(body), peer);
        let timeout = forwarder.upstream().timeout;
        let (kind, err) = match tokio::time::timeout(timeout, forwarder.send(upstream_req)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                client_head(&mut parts);
                return (
                    route,
                    "passed_through",
                    Ok(Response::from_parts(parts, boxed(body))),
                );
            }
            Err(_) => ("timeout", ProxyError::UpstreamTimeout),
            Ok(Err(ForwardError::NotSent(e))) => ("not_sent", ProxyError::UpstreamUnreachable(e)),
            Ok(Err(ForwardError::Failed(e))) => ("failed", ProxyError::UpstreamFailed(e)),
        };
        self.shared
            .metrics
            .upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
        (route, "upstream_error", Err(err))
    }
}

/// `uri` with its path replaced by `path` (its scheme, authority and query kept), as a copy
/// of its own. `None` only if the result is not a URI, which a normalised path cannot cause.
fn respelled(uri: &Uri, path: &str) -> Option<Uri> {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = uri.scheme().cloned();
    parts.authority = uri
        .authority()
        .and_then(|a| http::uri::Authority::try_from(a.as_str()).ok());
    parts.path_and_query = Some(http::uri::PathAndQuery::try_from(path_and_query).ok()?);
    Uri::from_parts(parts).ok()
}

/// What marks a protected answer: whether it is a replay, and the key the client sent.
pub(super) struct Marks {
    replayed: http::HeaderName,
    echo: Option<(http::HeaderName, http::HeaderValue)>,
}

impl Marks {
    fn apply(self, resp: &mut Response<ProxyBody>, replayed: bool) {
        let headers = resp.headers_mut();
        headers.insert(
            self.replayed,
            http::HeaderValue::from_static(if replayed { "true" } else { "false" }),
        );
        if let Some((name, value)) = self.echo {
            headers.insert(name, value);
        }
    }
}
