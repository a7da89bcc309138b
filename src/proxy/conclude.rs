//! The last stage of the key state machine: end the reservation as the upstream's answer
//! and the route's policy say — stored, released, or kept in progress — and answer the
//! client once the store has it.
//!
//! Why the decision is a plain function ([`decide`]) and the stage awaits one ending: a
//! future keeps room for the largest set of locals alive at any of its `.await`s, and one
//! `end` call per case made the largest of them the size of every request being executed
//! (its whole upstream call included).

use http::Response;
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use super::call::Upstream;
use super::job::{Answer, Outcome, answer};
use super::lease::{Finish, Holder};
use super::state::error_chain;
use crate::body::{Prefixed, ProxyBody, boxed, full};
use crate::config::{Ambiguous, Policy};
use crate::problem::ProxyError;
use crate::store::{Completion, Fenced, KeyStore, StoredResponse};
use crate::stored::encode_stored;
use crate::upstream::headers::client_head;

/// What the client is answered.
type Reply = Result<Response<ProxyBody>, ProxyError>;

/// How a reservation ends, decided before anything is awaited.
enum Ending {
    /// Answer, and leave the key in progress: its lease runs out, and a later retry
    /// re-executes with the same derived key.
    Keep(Outcome, Reply),
    /// Release the key (nothing happened, or the policy says so), then answer.
    Release(Outcome, Reply),
    /// Store this completion, then answer.
    Complete(Completion, Outcome, Reply),
    /// Store the problem an unknown outcome makes (the route's policy): its body is read
    /// first.
    StoreProblem(ProxyError),
}

/// Ends the reservation as the upstream's answer and the route's policy say.
pub(super) async fn conclude<S: KeyStore>(
    holder: &mut Holder<'_, S>,
    policy: &Policy,
    upstream: Upstream,
    tx: oneshot::Sender<Answer>,
) {
    let (completion, outcome, result) = match decide(policy, upstream) {
        Ending::Keep(outcome, result) => return answer(tx, outcome, result),
        Ending::Release(outcome, result) => (None, outcome, result),
        Ending::Complete(completion, outcome, result) => (Some(completion), outcome, result),
        Ending::StoreProblem(err) => {
            let (completion, result) = Box::pin(stored_problem(policy, err)).await;
            (Some(completion), Outcome::UpstreamError, result)
        }
    };
    let finish = match &completion {
        Some(completion) => Finish::Complete(completion),
        None => Finish::Release,
    };
    end(holder, finish, tx, outcome, result).await;
}

/// The ending the upstream's answer and the route's policy call for; awaits nothing.
fn decide(policy: &Policy, upstream: Upstream) -> Ending {
    match upstream {
        // Nothing was sent, so nothing happened: free the key for the next attempt.
        Upstream::NotSent(cause) => Ending::Release(
            Outcome::UpstreamError,
            Err(ProxyError::UpstreamUnreachable(cause)),
        ),
        Upstream::Unknown(err) => match policy.on_ambiguous {
            Ambiguous::Keep => {
                // The upstream may have acted: keep the key in progress (renewal stops
                // here, so the lease runs out) and let a later retry re-execute with the
                // same derived key.
                tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; the key stays in progress until its lease runs out");
                Ending::Keep(Outcome::UpstreamError, Err(err))
            }
            Ambiguous::Release => {
                tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; released as the route's policy says");
                Ending::Release(Outcome::Released, Err(err))
            }
            Ambiguous::Store => {
                // The route treats this failure as the final answer: store the problem.
                tracing::warn!(cause = %error_chain(&err), "upstream outcome unknown; storing the failure as the answer, as the route's policy says");
                Ending::StoreProblem(err)
            }
        },
        Upstream::Answered { mut head, body } => {
            client_head(&mut head);
            // The body is sent whole: hyper sets Content-Length from it.
            head.headers.remove(http::header::CONTENT_LENGTH);
            let status = head.status.as_u16();
            let stored = StoredResponse::clear(
                status,
                encode_stored(&head.headers, &policy.store_headers),
                body.clone(),
            );
            let resp = Ok(Response::from_parts(head, full(body)));
            let ambiguous = policy.ambiguous_statuses.contains(&status);
            if ambiguous && policy.on_ambiguous == Ambiguous::Keep {
                tracing::warn!(
                    status,
                    "ambiguous upstream status; the key stays in progress until its lease runs out"
                );
                return Ending::Keep(Outcome::UpstreamError, resp);
            }
            if policy.release_on.contains(&status)
                || (ambiguous && policy.on_ambiguous == Ambiguous::Release)
            {
                return Ending::Release(Outcome::Released, resp);
            }
            Ending::Complete(Completion::Stored(stored), Outcome::Executed, resp)
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
            let resp = Ok(Response::from_parts(
                head,
                boxed(Prefixed::new(prefix, rest)),
            ));
            Ending::Complete(completion, Outcome::NotReplayable, resp)
        }
    }
}

/// The problem an unknown outcome makes, as the completion to store and the answer.
async fn stored_problem(policy: &Policy, err: ProxyError) -> (Completion, Reply) {
    let (head, body) = err.into_response_in(&policy.errors).into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let completion = Completion::Stored(StoredResponse::clear(
        head.status.as_u16(),
        encode_stored(&head.headers, &[]),
        body.clone(),
    ));
    (completion, Ok(Response::from_parts(head, full(body))))
}

/// Writes the outcome once, answers the client (after the first attempt, so that a client
/// that has its answer finds it stored — or, when the store refused it, held in this
/// process), then sees the write through.
async fn end<S: KeyStore>(
    holder: &mut Holder<'_, S>,
    finish: Finish<'_>,
    tx: oneshot::Sender<Answer>,
    outcome: Outcome,
    result: Reply,
) {
    let first = holder.attempt(finish).await;
    if first.is_err() {
        // Before the client has its answer: its first retry must find it held here.
        holder.hold(finish);
    }
    answer(tx, outcome, result);
    // Boxed, and only when the first attempt did not do: retrying takes the most state of
    // any ending, and almost every ending is done in one.
    if !matches!(first, Ok(Fenced::Applied)) {
        Box::pin(holder.settle(finish, first)).await;
    }
}
