//! The detached part of a protected request: reserve → forward (lease renewed meanwhile) →
//! complete or release → answer.
//!
//! It runs as its own task, so that the client going away changes nothing: the upstream
//! call and the completion run to the end, and the retry that arrives a moment later gets
//! the stored answer instead of a `409` until the lease runs out. The answer is stored
//! *before* it is sent, so a client that has its answer never sees `409` on a retry.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode, request, response};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use super::body::{BoxError, Prefixed, ProxyBody, boxed, empty, full};
use super::forward::{ForwardError, UpstreamBody};
use super::headers::{client_head, decode_stored, detach_headers, encode_stored};
use super::key::derived_key;
use super::observe::Observed;
use super::service::{Shared, error_chain};
use crate::config::{Ambiguous, OnConflict, Policy, RecoveryProbe, Route};
use crate::fingerprint::Fingerprint;
use crate::metrics::{KindLabel, Metrics, RouteLabel, RouteName};
use crate::problem::ProxyError;
use crate::store::{
    Completion, Fence, Fenced, KeyStore, Reservation, ReserveRequest, StoreError, StoredResponse,
    key_id,
};

/// How long to keep retrying a completion the store refused to take (store unreachable).
const COMPLETION_RETRY_WINDOW: Duration = Duration::from_secs(300);
/// First and largest pause between completion retries.
const COMPLETION_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(5));
/// How often a waiting duplicate re-checks the row if no notification came.
const WAIT_FALLBACK_TICK: Duration = Duration::from_secs(1);
/// What a duplicate is told to wait before retrying while the first request runs.
const CONFLICT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Everything the detached task needs, owned.
pub(crate) struct Job {
    pub route: Arc<Route>,
    pub client_id: String,
    pub key: String,
    pub fingerprint: Fingerprint,
    pub parts: request::Parts,
    pub body: Bytes,
    pub peer: SocketAddr,
}

/// How a protected request ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Executed,
    Replayed,
    Conflict,
    Mismatch,
    NotReplayable,
    Released,
    StoreError,
    UpstreamError,
    Failed,
}

impl Outcome {
    /// Stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::NotReplayable => "not_replayable",
            Outcome::Released => "released",
            Outcome::StoreError => "store_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Failed => "failed",
        }
    }
}

/// What the waiting client handler receives.
pub(crate) type Answer = (Outcome, Result<Response<ProxyBody>, ProxyError>);

/// What the upstream call came to.
enum Upstream {
    /// A whole answer, small enough to store.
    Answered { head: response::Parts, body: Bytes },
    /// An answer too large to store: what was read so far, and the rest of the stream.
    TooLarge {
        head: response::Parts,
        prefix: Bytes,
        rest: UpstreamBody,
    },
    /// Nothing reached the upstream.
    NotSent(BoxError),
    /// The upstream may have acted, but we have no answer.
    Unknown(ProxyError),
}

/// Runs one protected request to the end, whether or not anyone still waits on `tx`.
pub(crate) async fn run<S: KeyStore>(
    shared: Arc<Shared<S>>,
    job: Job,
    tx: oneshot::Sender<Answer>,
) {
    let route = Arc::clone(&job.route);
    let lease = match reserve(&shared, &job).await {
        Ok(Reservation::Reserved(lease)) => lease,
        Ok(Reservation::Done(stored)) => return answer(tx, Outcome::Replayed, Ok(replay(stored))),
        Ok(Reservation::InProgress { .. }) => {
            let err = ProxyError::InProgress {
                retry_after: CONFLICT_RETRY_AFTER,
            };
            return answer(tx, Outcome::Conflict, Err(err));
        }
        Ok(Reservation::Mismatch) => {
            return answer(tx, Outcome::Mismatch, Err(ProxyError::KeyReused));
        }
        Ok(Reservation::NotReplayable { status }) => {
            let err = ProxyError::NotReplayable { status };
            return answer(tx, Outcome::NotReplayable, Err(err));
        }
        Err(e) => {
            return answer(
                tx,
                Outcome::StoreError,
                Err(ProxyError::StoreUnavailable(e)),
            );
        }
    };
    // The execution stage is boxed: the many duplicates that only wait on a reservation
    // (or get 409) then cost a small future each, not the whole state machine.
    Box::pin(async move {
        let policy = &route.policy;
        let store = Observed { store: &shared.store, metrics: &shared.metrics, route: &route.name };
        if lease.takeover {
            Metrics::count_route(&shared.metrics.takeovers, &route.name);
            tracing::warn!(
                route = %job.route.name,
                attempt = lease.attempts,
                "took over an expired lease; re-executing with the same derived key"
            );
        }

        let derived = derived_key(&job.client_id, &job.key);
        let derived_value = HeaderValue::from_str(&derived).ok();
        let fence = Fence {
            client_id: job.client_id,
            key: job.key,
            token: lease.token,
            notify: matches!(policy.on_conflict, OnConflict::Wait(_)),
        };
        let mut parts = job.parts;
        parts.headers.remove(&policy.key_header);
        if let Some(value) = &derived_value {
            parts
                .headers
                .insert(policy.upstream_key_header.clone(), value.clone());
        }
        let request = shared
            .forwarder
            .upstream_request(parts, full(job.body), job.peer);
        // Only a re-execution asks the probe: the first attempt may have happened.
        let probe = policy.recovery_probe.as_ref().filter(|_| lease.takeover);

        let upstream = {
            let work = async {
                if let Some(probe) = probe {
                    let verdict =
                        ask_probe(&shared, probe, &derived, derived_value, policy, job.peer).await;
                    match verdict {
                        Probe::Found(answer) => {
                            tracing::warn!(route = %job.route.name, "recovery probe found the operation; storing its answer instead of executing again");
                            return answer;
                        }
                        Probe::NotFound => {}
                        Probe::Inconclusive(err) => return Upstream::Unknown(err),
                    }
                }
                call_upstream(&shared, &route.name, request, policy.max_stored_response).await
            };
            // Boxed: the upstream exchange takes the most state of any stage, and what
            // follows (waiting for a store connection to complete) may take a while.
            let mut work = Box::pin(work);
            tokio::select! {
                biased;
                result = &mut work => result,
                never = keep_lease(&store, &fence, policy.lease) => match never {},
            }
        };

        match upstream {
            Upstream::NotSent(cause) => {
                // Nothing was sent, so nothing happened: free the key for the next attempt.
                if let Err(e) = store.release(&fence).await {
                    tracing::warn!(cause = %e, "could not release the key; it frees up when its lease runs out");
                }
                answer(
                    tx,
                    Outcome::UpstreamError,
                    Err(ProxyError::UpstreamUnreachable(cause)),
                );
            }
            Upstream::Unknown(err) => match policy.on_ambiguous {
                Ambiguous::Keep => {
                    // The upstream may have acted: keep the key in progress (renewal has
                    // stopped, so the lease runs out) and let a later retry re-execute with
                    // the same derived key.
                    tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; the key stays in progress until its lease runs out");
                    answer(tx, Outcome::UpstreamError, Err(err));
                }
                Ambiguous::Release => {
                    tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; released as the route's policy says");
                    if let Err(e) = store.release(&fence).await {
                        tracing::warn!(cause = %e, "could not release the key; it frees up when its lease runs out");
                    }
                    answer(tx, Outcome::Released, Err(err));
                }
                Ambiguous::Store => {
                    // The route treats this failure as the final answer: store the problem.
                    tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; storing the failure as the answer, as the route's policy says");
                    let (head, body) = err.into_response().into_parts();
                    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                    let completion = Completion::Stored(StoredResponse {
                        status: head.status.as_u16(),
                        headers: encode_stored(&head.headers, &[]),
                        body: body.clone(),
                    });
                    let first = store.complete(&fence, &completion).await;
                    answer(tx, Outcome::UpstreamError, Ok(Response::from_parts(head, full(body))));
                    settle(&store, &fence, &completion, first).await;
                }
            },
            Upstream::Answered { mut head, body } => {
                client_head(&mut head);
                // The body is sent whole: hyper sets Content-Length from it.
                head.headers.remove(http::header::CONTENT_LENGTH);
                let status = head.status.as_u16();
                let ambiguous = policy.ambiguous_statuses.contains(&status);
                if ambiguous && policy.on_ambiguous == Ambiguous::Keep {
                    tracing::warn!(status, "ambiguous upstream status; the key stays in progress until its lease runs out");
                    return answer(tx, Outcome::UpstreamError, Ok(Response::from_parts(head, full(body))));
                }
                if policy.release_on.contains(&status) || (ambiguous && policy.on_ambiguous == Ambiguous::Release) {
                    if let Err(e) = store.release(&fence).await {
                        tracing::warn!(cause = %e, "could not release the key; it frees up when its lease runs out");
                    }
                    return answer(
                        tx,
                        Outcome::Released,
                        Ok(Response::from_parts(head, full(body))),
                    );
                }
                let completion = Completion::Stored(StoredResponse {
                    status,
                    headers: encode_stored(&head.headers, &policy.store_headers),
                    body: body.clone(),
                });
                let first = store.complete(&fence, &completion).await;
                answer(
                    tx,
                    Outcome::Executed,
                    Ok(Response::from_parts(head, full(body))),
                );
                settle(&store, &fence, &completion, first).await;
            }
            Upstream::TooLarge {
                mut head,
                prefix,
                rest,
            } => {
                client_head(&mut head);
                let completion = Completion::NotReplayable {
                    status: head.status.as_u16(),
                };
                let first = store.complete(&fence, &completion).await;
                let body = boxed(Prefixed::new(prefix, rest));
                answer(
                    tx,
                    Outcome::NotReplayable,
                    Ok(Response::from_parts(head, body)),
                );
                settle(&store, &fence, &completion, first).await;
            }
        }
    })
    .await;
}

/// Reserves the key; on a wait-mode route, a duplicate of a request in flight waits for it
/// (woken by the store's notifications, with a slow fallback tick) up to the route's bound.
async fn reserve<S: KeyStore>(shared: &Shared<S>, job: &Job) -> Result<Reservation, StoreError> {
    let policy = &job.route.policy;
    let store = Observed {
        store: &shared.store,
        metrics: &shared.metrics,
        route: &job.route.name,
    };
    let request = ReserveRequest {
        client_id: &job.client_id,
        key: &job.key,
        fingerprint: &job.fingerprint,
        route: &job.route.name,
        lease: policy.lease,
        retention: policy.retention,
    };
    let first = store.reserve(&request).await;
    let OnConflict::Wait(limit) = policy.on_conflict else {
        return first;
    };
    if !matches!(first, Ok(Reservation::InProgress { .. })) {
        return first;
    }
    let deadline = Instant::now() + limit;
    let notify = shared.store.subscribe(key_id(&job.client_id, &job.key));
    loop {
        // Enabled before the re-check, so a completion between the two is not missed.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = store.reserve(&request).await;
        if !matches!(now, Ok(Reservation::InProgress { .. })) || Instant::now() >= deadline {
            return now;
        }
        tokio::select! {
            () = &mut notified => {}
            () = sleep(WAIT_FALLBACK_TICK) => {}
            () = sleep_until(deadline) => {}
        }
    }
}

/// What the recovery probe said.
enum Probe {
    /// The operation happened; this is its answer, to be stored.
    Found(Upstream),
    /// It did not: execute.
    NotFound,
    /// No usable answer: keep the key in progress and execute nothing.
    Inconclusive(ProxyError),
}

/// Asks the upstream whether the operation carrying `derived` already happened.
async fn ask_probe<S>(
    shared: &Shared<S>,
    probe: &RecoveryProbe,
    derived: &str,
    derived_value: Option<HeaderValue>,
    policy: &Policy,
    peer: SocketAddr,
) -> Probe {
    let path = probe.path.replace("{key}", &percent_encode(derived));
    let Ok(request) = http::Request::builder()
        .method(probe.method.clone())
        .uri(path)
        .body(())
    else {
        return Probe::Inconclusive(ProxyError::ProbeInconclusive { status: None });
    };
    let (mut parts, ()) = request.into_parts();
    if let Some(value) = derived_value {
        parts
            .headers
            .insert(policy.upstream_key_header.clone(), value);
    }
    let request = shared.forwarder.upstream_request(parts, empty(), peer);
    let answer = call_upstream(
        shared,
        &Arc::from("recovery-probe"),
        request,
        policy.max_stored_response,
    )
    .await;
    let status = match &answer {
        Upstream::Answered { head, .. } | Upstream::TooLarge { head, .. } => head.status.as_u16(),
        Upstream::NotSent(e) => {
            tracing::warn!(cause = %e, "recovery probe could not reach the upstream");
            return Probe::Inconclusive(ProxyError::ProbeInconclusive { status: None });
        }
        Upstream::Unknown(e) => {
            tracing::warn!(cause = %error_chain(e), "recovery probe failed");
            return Probe::Inconclusive(ProxyError::ProbeInconclusive { status: None });
        }
    };
    if probe.found.contains(&status) {
        Probe::Found(answer)
    } else if probe.not_found.contains(&status) {
        Probe::NotFound
    } else {
        tracing::warn!(
            status,
            "recovery probe answered neither found nor not found"
        );
        Probe::Inconclusive(ProxyError::ProbeInconclusive {
            status: Some(status),
        })
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for a path segment.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn answer(
    tx: oneshot::Sender<Answer>,
    outcome: Outcome,
    result: Result<Response<ProxyBody>, ProxyError>,
) {
    if tx.send((outcome, result)).is_err() {
        tracing::debug!(
            outcome = outcome.as_str(),
            "client went away before its answer; the outcome is kept"
        );
    }
}

/// The stored answer, marked as a replay.
fn replay(stored: StoredResponse) -> Response<ProxyBody> {
    let mut resp = Response::new(full(stored.body));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::BAD_GATEWAY);
    *resp.headers_mut() = decode_stored(&stored.headers);
    resp.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    resp
}

/// Calls the upstream and reads its answer, all within the upstream timeout; timed and
/// counted per route.
async fn call_upstream<S>(
    shared: &Shared<S>,
    route: &Arc<str>,
    request: http::Request<ProxyBody>,
    max_stored: u64,
) -> Upstream {
    let started = std::time::Instant::now();
    let result = read_upstream(shared, request, max_stored).await;
    let metrics = &shared.metrics;
    metrics
        .upstream_seconds
        .get_or_create(&RouteLabel {
            route: RouteName(Arc::clone(route)),
        })
        .observe(started.elapsed().as_secs_f64());
    let kind = match &result {
        Upstream::Answered { .. } | Upstream::TooLarge { .. } => None,
        Upstream::NotSent(_) => Some("not_sent"),
        Upstream::Unknown(ProxyError::UpstreamTimeout) => Some("timeout"),
        Upstream::Unknown(_) => Some("failed"),
    };
    if let Some(kind) = kind {
        metrics
            .upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }
    result
}

async fn read_upstream<S>(
    shared: &Shared<S>,
    request: http::Request<ProxyBody>,
    max_stored: u64,
) -> Upstream {
    let deadline = Instant::now() + shared.forwarder.upstream().timeout;
    let resp = match timeout_at(deadline, shared.forwarder.send(request)).await {
        Err(_) => return Upstream::Unknown(ProxyError::UpstreamTimeout),
        Ok(Err(ForwardError::NotSent(e))) => return Upstream::NotSent(e),
        Ok(Err(ForwardError::Failed(e))) => {
            return Upstream::Unknown(ProxyError::UpstreamFailed(e));
        }
        Ok(Ok(resp)) => resp,
    };
    let (head, mut body) = resp.into_parts();
    let limit = usize::try_from(max_stored).unwrap_or(usize::MAX);
    let mut buf = BytesMut::new();
    loop {
        match timeout_at(deadline, body.frame()).await {
            Err(_) => return Upstream::Unknown(ProxyError::UpstreamTimeout),
            Ok(None) => {
                // The answer waits for its completion: it must not hold the connection's
                // read buffer meanwhile (the body is already a copy).
                let mut head = head;
                detach_headers(&mut head.headers);
                return Upstream::Answered {
                    head,
                    body: buf.freeze(),
                };
            }
            Ok(Some(Err(e))) => return Upstream::Unknown(ProxyError::UpstreamFailed(Box::new(e))),
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not stored
                };
                if buf.len() + data.len() > limit {
                    buf.extend_from_slice(&data);
                    return Upstream::TooLarge {
                        head,
                        prefix: buf.freeze(),
                        rest: body,
                    };
                }
                buf.extend_from_slice(&data);
            }
        }
    }
}

/// Renews the lease every third of its length for as long as it is polled.
async fn keep_lease<S: KeyStore>(
    store: &Observed<'_, S>,
    fence: &Fence,
    lease: Duration,
) -> Infallible {
    loop {
        sleep(lease / 3).await;
        match store.renew(fence, lease).await {
            Ok(Fenced::Applied) => {}
            Ok(Fenced::Refused) => {
                tracing::warn!(
                    "lease lost to a takeover or an eviction; the completion will be fenced off"
                );
                return std::future::pending().await;
            }
            Err(e) => tracing::warn!(cause = %e, "could not renew the lease; will try again"),
        }
    }
}

/// Finishes a completion whose first attempt is `first`: logs a fenced-off write, retries a
/// failed one with backoff for a bounded time.
async fn settle<S: KeyStore>(
    store: &Observed<'_, S>,
    fence: &Fence,
    completion: &Completion,
    first: Result<Fenced, crate::store::StoreError>,
) {
    let mut result = first;
    let give_up = Instant::now() + COMPLETION_RETRY_WINDOW;
    let mut pause = COMPLETION_BACKOFF.0;
    loop {
        match result {
            Ok(Fenced::Applied) => return,
            Ok(Fenced::Refused) => {
                tracing::warn!(
                    "completion fenced off: the lease was taken over, so the new owner's answer stands"
                );
                return;
            }
            Err(e) if Instant::now() + pause > give_up => {
                store.metrics.completions_abandoned.inc();
                tracing::error!(
                    cause = %e,
                    "completion abandoned after retrying; the key stays in progress until its lease runs out, then a retry re-executes with the same derived key"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(cause = %e, retry_in_ms = pause.as_millis() as u64, "could not store the answer; retrying");
                sleep(pause).await;
                pause = (pause * 2).min(COMPLETION_BACKOFF.1);
                result = store.complete(fence, completion).await;
            }
        }
    }
}
