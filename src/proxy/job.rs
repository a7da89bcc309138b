//! A protected request as the detached execution owns it ([`Job`]), and how it ended
//! ([`Outcome`]): the types the request path's stages hand each other.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, request};
use tokio::sync::oneshot;

use crate::body::ProxyBody;
use crate::config::Route;
use crate::fingerprint::Fingerprint;
use crate::key::{ClearKey, ClientId, SentKey, StoredKey, UpstreamKey};
use crate::otlp::Trace;
use crate::problem::ProxyError;

/// Everything the detached task needs, owned.
pub(crate) struct Job {
    pub route: Arc<Route>,
    pub client_id: ClientId,
    /// The key as the store keeps it.
    pub key: StoredKey,
    /// The clear key when the store keeps a hash of it; `None`: it is `key`.
    pub clear_key: Option<ClearKey>,
    /// The key as found in the body (`key_from.body`), for the answer's echo; `None` when
    /// it came in a header.
    pub client_key: Option<SentKey>,
    /// The derived key in the route's form when it is not plain, kept with a new
    /// reservation.
    pub derived_key: Option<UpstreamKey>,
    pub fingerprint: Fingerprint,
    pub parts: request::Parts,
    pub body: Bytes,
    pub peer: SocketAddr,
    /// The request's trace, when spans are exported.
    pub trace: Option<Trace>,
}

impl Job {
    /// The key as the client sent it (scoped to the route with `key_scope:
    /// client_and_route`): what the derived key and the log lines' key hash are made of.
    pub fn clear_key(&self) -> &str {
        self.clear_key.as_deref().unwrap_or(&self.key)
    }
}

/// How a request ended — one typed value from the state machine to the metrics, the
/// log and the answer's marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No route protects it (or it carried no key): forwarded as it was.
    PassedThrough,
    /// Refused before anything was reserved: the client's to fix.
    Rejected,
    /// Refused before anything was reserved: too much detached work in flight.
    Overloaded,
    Executed,
    Replayed,
    Conflict,
    Mismatch,
    NotReplayable,
    Unknown,
    Released,
    StoreError,
    UpstreamError,
    Failed,
    /// The stored answer could not be opened; nothing was executed.
    Unreadable,
}

impl Outcome {
    /// Stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::PassedThrough => "passed_through",
            Outcome::Rejected => "rejected",
            Outcome::Overloaded => "overloaded",
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::NotReplayable => "not_replayable",
            Outcome::Unknown => "outcome_unknown",
            Outcome::Released => "released",
            Outcome::StoreError => "store_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Failed => "failed",
            Outcome::Unreadable => "unreadable",
        }
    }
}

/// What the waiting client handler receives.
pub(crate) type Answer = (Outcome, Result<Response<ProxyBody>, ProxyError>);

/// Hands the answer to the waiting client handler; a client that left is logged, since
/// the work it started still ran to its end.
pub(crate) fn answer(
    tx: oneshot::Sender<Answer>,
    outcome: Outcome,
    result: Result<Response<ProxyBody>, ProxyError>,
) {
    let status = match &result {
        Ok(resp) => resp.status(),
        Err(e) => e.status(),
    };
    if tx.send((outcome, result)).is_err() {
        // The work a disconnected client started still ran to its end: say how it ended,
        // so that whoever looks for that payment finds it (the retry is answered from it).
        tracing::info!(
            outcome = outcome.as_str(),
            status = status.as_u16(),
            "finished after the client left; its retry gets this outcome"
        );
    }
}
