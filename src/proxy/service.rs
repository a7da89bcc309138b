//! [`Proxy::handle`]: the entry point for every request — route lookup, pass-through, and
//! the hand-over to the protected path.
//!
//! `handle` never fails: every error becomes a problem response here, logged once.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Body;

use super::job::Outcome;
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
        // protected request's own URI comes back in `Handled::uri`).
        let method = req.method().clone();
        let uri = req.uri().clone();
        let Handled {
            route,
            outcome,
            result,
            uri: routed_uri,
            protection,
        } = self.handle_inner(req, peer).await;
        let uri = routed_uri.unwrap_or(uri);
        let Protection {
            marks,
            dialect,
            trace,
        } = protection.unwrap_or_default();
        let status = match &result {
            Ok(resp) => resp.status(),
            Err(err) => err.status(),
        };
        if let Some(trace) = trace {
            trace.finish(vec![
                ("http.request.method", method.as_str().into()),
                ("idemproxy.route", (*route).into()),
                ("idemproxy.outcome", outcome.as_str().into()),
                ("http.response.status_code", status.as_u16().into()),
            ]);
        }
        self.shared.metrics.observe_request(
            &route,
            outcome.as_str(),
            status.as_u16(),
            started.elapsed(),
        );
        let mut resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                log_failure(&err, &method, &uri, &route);
                err.into_response_in(dialect.as_ref().unwrap_or(&self.shared.config.errors))
            }
        };
        if let Some(marks) = marks {
            marks.apply(&mut resp, outcome == Outcome::Replayed);
        }
        resp
    }

    /// Routes the request and answers it: passed through, refused, or protected.
    async fn handle_inner<B>(&self, mut req: Box<Request<B>>, peer: SocketAddr) -> Handled
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
                return Box::pin(self.pass_through(unrouted, req, peer, None)).await;
            }
            Err(e) => {
                let unrouted = Arc::clone(&self.shared.unrouted);
                return Handled::new(unrouted, Outcome::Rejected, Err(e), None);
            }
        };
        // What was matched is what is forwarded. The copy also frees the connection's read
        // buffer, which the URI as read is a slice of, while a protected request waits.
        *req.uri_mut() = uri.clone();
        let policy = &route.policy;
        let mut protection = Protection {
            marks: None,
            dialect: Some(policy.errors.clone()),
            trace: None,
        };
        let name = || Arc::clone(&route.name);
        let sent = match sent_key(&req, policy) {
            Ok(KeyIn::Header(sent)) => Some(sent),
            Ok(KeyIn::Body) => None,
            Ok(KeyIn::Nowhere) => {
                let handled = Box::pin(self.pass_through(name(), req, peer, Some(protection)));
                return handled.await.routed(uri);
            }
            Err(err) => {
                return Handled::new(name(), Outcome::Rejected, Err(err), Some(protection))
                    .routed(uri);
            }
        };
        // From here on every answer is a protected one, marked as such.
        let key = sent
            .as_ref()
            .map(|s| scoped_key(&route.name, &s.key, policy.key_scope));
        protection.marks = Some(Marks {
            replayed: policy.replayed_header.clone(),
            echo: sent
                .as_ref()
                .and_then(|s| echo(policy, s.sent.clone(), Some(&s.header))),
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
            protection.trace = Some(t);
        }
        // Boxed: the protected path's state is large, and every request's future (pass
        // through included) would otherwise be as large as it.
        let protected = Box::pin(protect::protect(
            &self.shared,
            Arc::clone(&route),
            key,
            req,
            peer,
            protection.trace.clone(),
        ))
        .await;
        match protected {
            Protected::Answered(outcome, result, body_key) => {
                // A key from the body is echoed only under a configured name.
                if let (Some(marks), Some(key)) = (protection.marks.as_mut(), body_key)
                    && let Ok(value) = http::HeaderValue::from_str(&key)
                {
                    marks.echo = echo(policy, value, None);
                }
                Handled::new(name(), outcome, result, Some(protection)).routed(uri)
            }
            Protected::Unkeyed(req) => {
                protection.marks = None;
                let req = Box::new(req);
                let handled = Box::pin(self.pass_through(name(), req, peer, Some(protection)));
                handled.await.routed(uri)
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
        protection: Option<Protection>,
    ) -> Handled
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
                let resp = Ok(Response::from_parts(parts, boxed(body)));
                return Handled::new(route, Outcome::PassedThrough, resp, protection);
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
        Handled::new(route, Outcome::UpstreamError, Err(err), protection)
    }
}

/// How a request was handled: everything the metrics, the log and the answer need, in one
/// value.
struct Handled {
    /// The route's name (`-` for none).
    route: Arc<str>,
    outcome: Outcome,
    result: Result<Response<ProxyBody>, ProxyError>,
    /// The URI in the route's spelling, for the log, when a route matched.
    uri: Option<Uri>,
    /// What a request on a route carries to its answer.
    protection: Option<Protection>,
}

impl Handled {
    fn new(
        route: Arc<str>,
        outcome: Outcome,
        result: Result<Response<ProxyBody>, ProxyError>,
        protection: Option<Protection>,
    ) -> Self {
        Self {
            route,
            outcome,
            result,
            uri: None,
            protection,
        }
    }

    fn routed(self, uri: Uri) -> Self {
        Self {
            uri: Some(uri),
            ..self
        }
    }
}

/// What a request on a route carries to its answer: the marks of a protected answer, the
/// route's error dialect, and its trace.
#[derive(Default)]
struct Protection {
    marks: Option<Marks>,
    dialect: Option<Dialect>,
    trace: Option<Trace>,
}

/// Where a request on a route carries its key.
enum KeyIn {
    Header(super::key::HeaderKey),
    /// Looked for in the body once it is read (`key_from.body`).
    Body,
    /// Nowhere, and the route does not require one: forwarded unprotected.
    Nowhere,
}

/// Where `req` carries its key on a route with `policy`, or why it is refused.
fn sent_key<B>(req: &Request<B>, policy: &crate::config::Policy) -> Result<KeyIn, ProxyError> {
    match parse_keys(req.headers(), &policy.key_headers) {
        Ok(Some(sent)) => Ok(KeyIn::Header(sent)),
        Ok(None) if policy.key_from_body.is_some() => Ok(KeyIn::Body),
        Ok(None) if policy.require_key => Err(ProxyError::MissingKey {
            header: policy.key_header_names(),
            body: None,
        }),
        Ok(None) => Ok(KeyIn::Nowhere),
        Err((header, reason)) => Err(ProxyError::InvalidKey {
            header: header.to_string(),
            reason,
        }),
    }
}

/// The key echoed on a protected answer, as the route's `echo_key` says.
fn echo(
    policy: &crate::config::Policy,
    value: http::HeaderValue,
    header: Option<&http::HeaderName>,
) -> Option<(http::HeaderName, http::HeaderValue)> {
    match &policy.echo_key {
        EchoKey::AsSent => header.map(|h| (h.clone(), value)),
        EchoKey::Named(name) => Some((name.clone(), value)),
        EchoKey::Off => None,
    }
}

/// Logs a failed request once: store faults and overload are said elsewhere (once per
/// fault, or at most every few seconds), a duplicate in flight at debug, the client's own
/// mistakes at info, everything else at warning.
fn log_failure(err: &ProxyError, method: &http::Method, uri: &Uri, route: &str) {
    let status = err.status();
    let said_elsewhere = matches!(err, ProxyError::StoreUnavailable(e) if e.fault().is_some())
        || matches!(err, ProxyError::Overloaded { .. });
    if said_elsewhere {
        tracing::debug!(%method, path = uri.path(), route, status = status.as_u16(), cause = %error_chain(err), "request refused: said once elsewhere");
    } else if status.is_server_error() {
        tracing::warn!(%method, path = uri.path(), route, status = status.as_u16(), cause = %error_chain(err), "request failed");
    } else if status == http::StatusCode::CONFLICT {
        // A duplicate of a request in flight: the normal course of a retry.
        tracing::debug!(%method, path = uri.path(), route, status = status.as_u16(), reason = %err, "request rejected");
    } else {
        // The client's to fix: at info, with the reason, for whoever helps it find out why.
        tracing::info!(%method, path = uri.path(), route, status = status.as_u16(), reason = %err, "request rejected");
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
