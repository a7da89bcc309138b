//! A protected request up to the hand-off: client identity, body, fingerprint.
//!
//! Everything here can fail because of the client, and nothing here touches the store: a
//! request rejected at this stage reserves nothing, so the client can fix it and send it
//! again with the same key. From the reservation on, the work runs detached (see
//! [`super::execute`]) so that a client going away cannot cut it short.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body::Body;
use http_body_util::Full;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::admission::{Admitted, ConnectionWork};
use super::headers::detach_headers;
use super::identity::client_id;
use super::key::{body_key, formatted_derived_key, scoped_key};
use super::machine::{Answer, Job, Outcome, reserve_request, run, unreserved};
use super::rewrite::set_key;
use super::state::Shared;
use crate::body::{BoxError, CollectError, ProxyBody, collect_limited};
use crate::config::{Policy, Route};
use crate::fingerprint::{self, fingerprint};
use crate::key::{ClearKey, ClientId, SentKey, StoredKey, UpstreamKey, derived_key, hex, key_hash};
use crate::otlp::{Kind, Timer, Trace};
use crate::problem::ProxyError;
use crate::store::KeyStore;

/// How a request on a protected route went.
pub(crate) enum Protected {
    /// Answered: how it ended, the answer, and the key when it came from the body.
    Answered(
        Outcome,
        Result<Response<ProxyBody>, ProxyError>,
        Option<String>,
    ),
    /// It carried no key anywhere and the route does not require one: forward it as it
    /// is (its body already read).
    Unkeyed(Request<Full<Bytes>>),
}

/// Handles a request on a protected route that carries a valid key in a header (`key`),
/// or, when `key` is `None`, may carry one in its body (`key_from.body`).
pub(crate) async fn protect<S, B>(
    shared: &Arc<Shared<S>>,
    route: Arc<Route>,
    key: Option<String>,
    req: Box<Request<B>>,
    peer: SocketAddr,
    trace: Option<Trace>,
) -> Protected
where
    S: KeyStore,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let started = Instant::now();
    // Boxed: what checking takes is freed before the long wait for the answer. Its
    // result is only a temporary here, and `hand_off` is a plain function that moves the job
    // into the detached task: this future, which every request waiting on the store
    // keeps, holds the receiver and what the request line logs, not the job.
    let Awaiting {
        body_key,
        key,
        client,
        answer,
    } = match hand_off(
        shared,
        &route,
        Box::pin(check(shared, Arc::clone(&route), key, req, peer)).await,
        trace,
    ) {
        HandOff::Awaiting(awaiting) => awaiting,
        HandOff::Done(done) => return done,
    };
    let (outcome, result) = match answer {
        AnswerFrom::Cache(answer) => answer,
        AnswerFrom::Task(rx) => rx
            .await
            .unwrap_or_else(|_| (Outcome::Failed, Err(ProxyError::Internal))),
    };
    let status = match &result {
        Ok(resp) => resp.status().as_u16(),
        Err(e) => e.status().as_u16(),
    };
    if let Some(key) = &key {
        shared.journal.record(key, outcome.as_str(), status);
    }
    if let (Some(client), Some(key)) = (client, key) {
        tracing::info!(
            route = %route.name,
            client = %client,
            key = %key,
            outcome = outcome.as_str(),
            status,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "protected request"
        );
    }
    Protected::Answered(outcome, result, body_key)
}

/// A request handed off and awaiting its answer: what the request line logs, and where the
/// answer comes from (the job itself has moved on).
struct Awaiting {
    /// The key as found in the body, for the answer's echo.
    body_key: Option<String>,
    /// Short hashes of (client, key) — always, the journal is keyed by it — and of the
    /// client, when the request line is logged.
    key: Option<String>,
    client: Option<String>,
    answer: AnswerFrom,
}

/// What handing a checked request off came to: awaiting its answer, or already answered
/// (refused, unkeyed, overloaded).
enum HandOff {
    Awaiting(Awaiting),
    Done(Protected),
}

/// Where a request's answer comes from.
enum AnswerFrom {
    /// The replay cache, in this task.
    Cache(Answer),
    /// The state machine's task.
    Task(oneshot::Receiver<Answer>),
}

/// Hands a checked request off: answered at once (refused, unkeyed, overloaded, or replayed
/// from the replay cache) or to the state machine's task.
fn hand_off<S: KeyStore>(
    shared: &Arc<Shared<S>>,
    route: &Route,
    checked: Result<Checked, ProxyError>,
    trace: Option<Trace>,
) -> HandOff {
    let job = match checked {
        Ok(Checked::Keyed(job)) => Job { trace, ..job },
        Ok(Checked::Unkeyed(req)) => return HandOff::Done(Protected::Unkeyed(req)),
        Err(err) => return HandOff::Done(Protected::Answered(Outcome::Rejected, Err(err), None)),
    };
    let body_key = job.client_key.clone().map(SentKey::into_string);
    // Logs carry short hashes of the client and of (client, key), never either in clear.
    // The key's is always taken: the journal (the console's key story) is keyed by it.
    let key = Some(key_hash(&job.client_id, job.clear_key()));
    let client = tracing::enabled!(tracing::Level::INFO)
        .then(|| hex(&Sha256::digest(job.client_id.as_bytes())[..4]));
    let answer = match replayed(shared, &job) {
        Some(answer) => AnswerFrom::Cache(answer),
        None => {
            // Before anything is reserved: past a bound, nothing is.
            let connection = job.parts.extensions.get::<Arc<ConnectionWork>>();
            match shared.admission.admit(&job.client_id, connection) {
                Ok(admitted) => {
                    AnswerFrom::Task(detach(shared, route, job, admitted, key.as_deref()))
                }
                Err(refused) => {
                    let err = ProxyError::Overloaded {
                        bound: refused.as_str(),
                    };
                    return HandOff::Done(Protected::Answered(
                        Outcome::Overloaded,
                        Err(err),
                        body_key,
                    ));
                }
            }
        }
    };
    HandOff::Awaiting(Awaiting {
        body_key,
        key,
        client,
        answer,
    })
}

/// A replay answered from the replay cache where the request arrived: nothing is
/// reserved, so nothing needs a task that outlives the client (see [`detach`]).
fn replayed<S: KeyStore>(shared: &Arc<Shared<S>>, job: &Job) -> Option<Answer> {
    let timer = Timer::start(job.trace.as_ref());
    let hit = shared
        .observed(&job.route.name)
        .cached(&reserve_request(job), job.clear_key())?;
    timer.end("reserve", Kind::Internal, || {
        vec![("idemproxy.reservation", hit.as_str().into())]
    });
    Some(unreserved(Ok(hit), job))
}

/// Starts the key's state machine in a task of its own, so that the client going away
/// changes nothing from the reservation on; its answer comes on the receiver.
fn detach<S: KeyStore>(
    shared: &Arc<Shared<S>>,
    route: &Route,
    job: Job,
    admitted: Admitted,
    key: Option<&str>,
) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    // Every line the detached work logs (takeover, lease, completion retries, fence)
    // names the key by the same hash as the request line.
    let span = match key {
        Some(key) => tracing::warn_span!("key", key = %key, route = %route.name),
        None => tracing::Span::none(),
    };
    shared.tasks.spawn(tracing::Instrument::instrument(
        run(Arc::clone(shared), Box::new(job), admitted, tx),
        span,
    ));
    rx
}

/// A request past the checks that are the client's to pass (identity, body, key, fingerprint):
/// a job ready for the store, or a request with no key to forward unprotected.
enum Checked {
    Keyed(Job),
    Unkeyed(Request<Full<Bytes>>),
}

/// Everything that can be the client's fault: identity, body, a key in the body,
/// fingerprint.
async fn check<S, B>(
    shared: &Arc<Shared<S>>,
    route: Arc<Route>,
    key: Option<String>,
    req: Box<Request<B>>,
    peer: SocketAddr,
) -> Result<Checked, ProxyError>
where
    S: KeyStore,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let policy = &route.policy;
    let client_id = client_id(req.headers(), &shared.config.client_id)?;
    let (mut parts, body) = (*req).into_parts();
    let body = read_body(shared, policy, &parts, body).await?;
    let (key, client_key) = match key {
        Some(key) => (key, None),
        None => match key_in_body(&route, &parts, &body)? {
            Some(found) => found,
            None => {
                return Ok(Checked::Unkeyed(Request::from_parts(
                    parts,
                    Full::new(body),
                )));
            }
        },
    };
    let fingerprint = fingerprint_of(policy, &parts, &body)?;
    // The job waits for the store, so it must not hold the connection's read buffer
    // meanwhile: the headers and a body that arrived within one read become copies (the
    // URI already is one, see `Proxy::handle_inner`).
    detach_headers(&mut parts.headers);
    let derived_form = formatted_derived_key(&client_id, &key, policy.derived_key);
    let body = place_upstream_key(policy, &mut parts, body, || {
        derived_form
            .clone()
            .unwrap_or_else(|| derived_key(&client_id, &key))
    })?;
    let body = if body.len() <= shared.config.limits.max_header_bytes {
        Bytes::copy_from_slice(&body)
    } else {
        body
    };
    // The store may keep a hash of the key; the derived key above is the clear one's.
    let (key, clear_key) = if shared.key_form.is_hashed() {
        let stored = shared.key_form.stored(&client_id, key.clone());
        (StoredKey::new(stored), Some(ClearKey::new(key)))
    } else {
        (StoredKey::new(key), None)
    };
    Ok(Checked::Keyed(Job {
        route: Arc::clone(&route),
        client_id: ClientId::new(client_id),
        key,
        clear_key,
        client_key,
        derived_key: derived_form.map(UpstreamKey::new),
        fingerprint,
        parts,
        body,
        peer,
        trace: None,
    }))
}

/// The whole body, within the route's size limit and the body read timeout (a declared
/// length over the limit is refused before a byte is read).
async fn read_body<S: KeyStore, B>(
    shared: &Shared<S>,
    policy: &Policy,
    parts: &http::request::Parts,
    body: B,
) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > policy.max_body) {
        return Err(ProxyError::BodyTooLarge {
            limit: policy.max_body,
        });
    }
    let read = collect_limited(body, policy.max_body);
    match tokio::time::timeout(shared.config.limits.body_read_timeout, read).await {
        Err(_) => Err(ProxyError::BodyTimeout),
        Ok(Err(CollectError::TooLarge(limit))) => Err(ProxyError::BodyTooLarge { limit }),
        Ok(Err(CollectError::Read(e))) => Err(ProxyError::BodyRead(e)),
        Ok(Ok(body)) => Ok(body),
    }
}

/// The key the body carries where the route reads one (`key_from.body`), as stored and as
/// sent; `None` when it carries none and none is required (the request goes through
/// unprotected).
fn key_in_body(
    route: &Route,
    parts: &http::request::Parts,
    body: &Bytes,
) -> Result<Option<(String, Option<SentKey>)>, ProxyError> {
    let policy = &route.policy;
    let pointer = policy.key_from_body.as_deref().unwrap_or_default();
    let content_type = parts.headers.get(header::CONTENT_TYPE);
    match body_key(content_type.map(|v| v.as_bytes()), body, pointer) {
        Ok(Some(sent)) => Ok(Some((
            scoped_key(&route.name, &sent, policy.key_scope),
            Some(SentKey::new(sent)),
        ))),
        Ok(None) if policy.require_key => Err(ProxyError::MissingKey {
            header: policy.key_header_names(),
            body: Some(pointer.to_owned()),
        }),
        Ok(None) => Ok(None),
        Err(reason) => Err(ProxyError::InvalidBodyKey {
            field: pointer.to_owned(),
            reason,
        }),
    }
}

/// What makes this request the same operation as another: method, path, query, body (or
/// the configured fields of it), and the configured headers.
fn fingerprint_of(
    policy: &Policy,
    parts: &http::request::Parts,
    body: &Bytes,
) -> Result<fingerprint::Fingerprint, ProxyError> {
    let fingerprint = if policy.fingerprint_off {
        fingerprint::none()
    } else {
        fingerprint(&fingerprint::Request {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            body,
            fields: policy.fingerprint_fields.as_deref(),
        })?
    };
    if policy.fingerprint_headers.is_empty() {
        return Ok(fingerprint);
    }
    let headers = policy.fingerprint_headers.iter().map(|name| {
        let values = parts.headers.get_all(name).iter().map(|v| v.as_bytes());
        (name.as_str(), values.collect())
    });
    Ok(fingerprint::with_headers(fingerprint, headers))
}

/// Where the provider reads its key in the body (`upstream_key: { body: POINTER }`), the
/// derived key is written there now, so that a body that cannot carry it is refused before
/// anything is reserved.
fn place_upstream_key(
    policy: &Policy,
    parts: &mut http::request::Parts,
    body: Bytes,
    derived: impl FnOnce() -> String,
) -> Result<Bytes, ProxyError> {
    let Some(pointer) = &policy.upstream_key_body else {
        return Ok(body);
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.as_bytes());
    let rewritten = set_key(content_type, &body, pointer, &derived()).map_err(|reason| {
        ProxyError::KeyPlacement {
            field: pointer.clone(),
            reason,
        }
    })?;
    // The length changed: the connection frames the body from its new size.
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(rewritten)
}
