//! The key state machine: the detached part of a protected request, as named stages:
//! [`reserve`] → [`execute`] (lease renewed meanwhile, see [`super::lease`]) →
//! [`conclude`]: complete or release → answer.
//!
//! It runs as its own task, so that the client going away changes nothing: the upstream
//! call and the completion run to the end, and the retry that arrives a moment later gets
//! the stored answer instead of a `409` until the lease runs out. The answer is stored
//! *before* it is sent, so a client that has its answer never sees `409` on a retry.

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, sleep_until};

use super::admission::Admitted;
use super::call::{Outgoing, outgoing};
use super::conclude::conclude;
use super::held::{HeldEnding, HeldFor};
pub(crate) use super::job::{Answer, Job, Outcome, answer};
use super::lease::{Holder, fence_for};
use super::state::Shared;
use crate::body::{ProxyBody, full};
use crate::config::{OnConflict, Takeover};
use crate::metrics::Metrics;
use crate::otlp::{Kind, Timer};
use crate::problem::ProxyError;
use crate::store::{
    KeyStore, Lease, Reservation, ReserveRequest, StoreError, StoredResponse, key_id,
};
use crate::stored::decode_stored;

/// How often a waiting duplicate re-checks the row if no notification came.
const WAIT_FALLBACK_TICK: Duration = Duration::from_secs(1);
/// What a duplicate is told to wait before retrying while the first request runs.
const CONFLICT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Runs one protected request to the end, whether or not anyone still waits on `tx`:
/// reserve → execute → complete or release → answer.
///
/// The job comes boxed: it is borrowed while the key is reserved, and a future keeps a
/// borrowed local's room to its end, so inline it would be held twice while the upstream
/// call runs (here, and moved into the execution).
///
/// `admitted` is the execution's slot (see [`super::admission`]): held to the end, the
/// stored answer included, and given back when this returns.
pub(crate) async fn run<S: KeyStore>(
    shared: Arc<Shared<S>>,
    job: Box<Job>,
    admitted: Admitted,
    tx: oneshot::Sender<Answer>,
) {
    let _admitted = admitted;
    let timer = Timer::start(job.trace.as_ref());
    // Boxed, like `execute` below: each stage's state is freed when it ends, instead of
    // the largest one being held for the whole request.
    let reservation = Box::pin(reserve(&shared, &job)).await;
    timer.end("reserve", Kind::Internal, || {
        let said = reservation
            .as_ref()
            .map_or("store_error", Reservation::as_str);
        vec![("idemproxy.reservation", said.into())]
    });
    let lease = match reservation {
        Ok(Reservation::Reserved(lease)) => lease,
        other => return answer_unreserved(tx, other, &job),
    };
    // Boxed: the many duplicates that only wait on a reservation (or get 409) then cost a
    // small future each, not the whole state machine.
    Box::pin(execute(&shared, *job, lease, tx)).await;
}

/// The answer to a request whose key was not reserved: what the row says, or `503`.
fn answer_unreserved(
    tx: oneshot::Sender<Answer>,
    reservation: Result<Reservation, StoreError>,
    job: &Job,
) {
    let (outcome, result) = unreserved(reservation, job);
    answer(tx, outcome, result);
}

/// What a request whose key was not reserved is answered.
pub(crate) fn unreserved(reservation: Result<Reservation, StoreError>, job: &Job) -> Answer {
    match reservation {
        Ok(Reservation::Done(stored)) => {
            let timer = Timer::start(job.trace.as_ref());
            let answer = replay(stored);
            let status = answer.status().as_u16();
            timer.end("replay", Kind::Internal, || {
                vec![("http.response.status_code", status.into())]
            });
            (Outcome::Replayed, Ok(answer))
        }
        Ok(Reservation::InProgress { .. }) => (
            Outcome::Conflict,
            Err(ProxyError::InProgress {
                retry_after: CONFLICT_RETRY_AFTER,
            }),
        ),
        Ok(Reservation::Mismatch) => (Outcome::Mismatch, Err(ProxyError::KeyReused)),
        // Logged and counted where it was found (`Observed::reserve`).
        Ok(Reservation::Unreadable(why)) => (
            Outcome::Unreadable,
            Err(ProxyError::StoredAnswerUnreadable(why)),
        ),
        Ok(Reservation::NotReplayable { status }) => (
            Outcome::NotReplayable,
            Err(ProxyError::NotReplayable { status }),
        ),
        Ok(Reservation::Unresolved { attempts }) => {
            tracing::warn!(
                route = %job.route.name,
                key = %crate::key::key_hash(&job.client_id, job.clear_key()),
                attempts,
                "a retry of an unresolved key was refused (takeover: never): the operation may or may not have happened; resolve it with POST /admin/keys/{{client_id}}/{{key}}/resolve or evict it"
            );
            (Outcome::Unknown, Err(ProxyError::OutcomeUnknown))
        }
        // Unreachable by construction (the caller took it), but a request must still end.
        Ok(Reservation::Reserved(_)) => (Outcome::Failed, Err(ProxyError::Internal)),
        Err(e) => (Outcome::StoreError, Err(ProxyError::StoreUnavailable(e))),
    }
}

/// Forwards the reserved request (asking the recovery probe first on a re-execution),
/// with the lease renewed meanwhile, then ends the reservation as the answer says.
///
/// The request is made ready before the future starts: a future keeps room for its
/// arguments (the whole [`Job`]) and for every local still in scope at an `.await`, so
/// the headers, the body and the upstream's answer would otherwise take room for as long
/// as the completion runs.
fn execute<S: KeyStore>(
    shared: &Shared<S>,
    job: Job,
    lease: Lease,
    tx: oneshot::Sender<Answer>,
) -> impl Future<Output = ()> + '_ {
    let route = Arc::clone(&job.route);
    let trace = job.trace.clone();
    if lease.takeover {
        Metrics::count_route(&shared.metrics.takeovers, &route.name);
        tracing::warn!(
            route = %route.name,
            attempt = lease.attempts,
            "took over an expired lease; re-executing with the same derived key"
        );
    }
    let fingerprint = job.fingerprint;
    let Outgoing { fence, work } = outgoing(shared, job, &lease);
    async move {
        let policy = &route.policy;
        let store = shared.observed(&route.name);
        let mut holder = Holder::new(store, fence, fingerprint, policy.lease);
        let timer = Timer::start(trace.as_ref());
        let upstream = holder.during(work).await;
        timer.end("upstream", Kind::Client, || {
            let mut attributes = vec![("idemproxy.upstream", upstream.label().into())];
            attributes.extend(
                upstream
                    .status()
                    .map(|s| ("http.response.status_code", s.into())),
            );
            attributes
        });
        let timer = Timer::start(trace.as_ref());
        conclude(&mut holder, policy, upstream, tx).await;
        timer.end("complete", Kind::Internal, Vec::new);
    }
}

/// Reserves the key; on a wait-mode route, a duplicate of a request in flight waits for it
/// (woken by the store's notifications, with a slow fallback tick) up to the route's bound.
async fn reserve<S: KeyStore>(shared: &Shared<S>, job: &Job) -> Result<Reservation, StoreError> {
    let first = reserve_once(shared, job, &reserve_request(job)).await;
    match (job.route.policy.on_conflict, &first) {
        (OnConflict::Wait(limit), Ok(Reservation::InProgress { .. })) => {
            // Boxed: only a duplicate of a request in flight waits, and inline the loop's
            // state (timers, the notification, a second store call) would size every
            // request's reservation.
            Box::pin(wait_for_first(shared, job, limit)).await
        }
        _ => first,
    }
}

/// A duplicate's wait (`on_conflict: wait`) for the request in flight to end: re-checks
/// the row when its completion is heard of, once a second otherwise, until `limit`.
async fn wait_for_first<S: KeyStore>(
    shared: &Shared<S>,
    job: &Job,
    limit: Duration,
) -> Result<Reservation, StoreError> {
    let request = reserve_request(job);
    let deadline = Instant::now() + limit;
    let notify = shared.store.subscribe(key_id(&job.client_id, &job.key));
    loop {
        // Enabled before the re-check, so a completion between the two is not missed.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = reserve_once(shared, job, &request).await;
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

/// One look at the key: the store's answer — but for a key this process holds an ending
/// for (see [`super::held`]), never a takeover and never a final "unknown".
async fn reserve_once<S: KeyStore>(
    shared: &Shared<S>,
    job: &Job,
    request: &ReserveRequest<'_>,
) -> Result<Reservation, StoreError> {
    let id = key_id(&job.client_id, &job.key);
    match shared.held.lookup(&id, &job.fingerprint) {
        None => {
            let store = shared.observed(&job.route.name);
            store.reserve(request, job.clear_key()).await
        }
        Some(HeldFor::AnotherRequest) => Ok(Reservation::Mismatch),
        Some(HeldFor::ThisRequest(ending)) => {
            Box::pin(held_or_stored(shared, job, request, ending)).await
        }
    }
}

/// The answer to a retry of a key whose ending this process holds: the store is asked
/// first, without taking anything over, since once an answer is stored (another replica
/// may have stored one after a takeover) every client gets that one. While nothing is
/// stored — the row in progress, unresolved, or the store away — the held ending answers.
/// A row that is gone (evicted, released) was reserved anew by the look: a held answer is
/// then stored under it, and a held release lets the request execute.
async fn held_or_stored<S: KeyStore>(
    shared: &Shared<S>,
    job: &Job,
    request: &ReserveRequest<'_>,
    ending: HeldEnding,
) -> Result<Reservation, StoreError> {
    let store = shared.observed(&job.route.name);
    let look = ReserveRequest {
        takeover: false,
        ..*request
    };
    match (store.reserve(&look, job.clear_key()).await, &ending) {
        (Ok(stored @ (Reservation::Done(_) | Reservation::NotReplayable { .. })), _) => Ok(stored),
        // A held release: nothing happened upstream, so the request executes.
        (Ok(reserved @ Reservation::Reserved(_)), HeldEnding::Release) => Ok(reserved),
        (Ok(Reservation::Reserved(lease)), HeldEnding::Answer(completion)) => {
            let fence = fence_for(
                &job.route.policy,
                job.client_id.to_string(),
                job.key.to_string(),
                lease.token,
            );
            // Whatever this write comes to, the client gets the held answer; a write that
            // failed leaves the new row to its lease, like any completion given up on.
            let _ = store.complete(&fence, completion).await;
            Ok(ending.reservation())
        }
        (Ok(_) | Err(_), _) => Ok(ending.reservation()),
    }
}

/// What reserving `job`'s key asks the store.
pub(crate) fn reserve_request(job: &Job) -> ReserveRequest<'_> {
    let policy = &job.route.policy;
    ReserveRequest {
        client_id: &job.client_id,
        key: &job.key,
        fingerprint: &job.fingerprint,
        route: &job.route.name,
        lease: policy.lease,
        retention: policy.retention,
        takeover: policy.takeover == Takeover::Execute,
        derived_key: job.derived_key.as_deref(),
    }
}

/// The stored answer (marked as a replay by the caller, see `service::Marks`).
fn replay(stored: StoredResponse) -> Response<ProxyBody> {
    let mut resp = Response::new(full(stored.body));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::BAD_GATEWAY);
    *resp.headers_mut() = decode_stored(&stored.headers);
    resp
}
