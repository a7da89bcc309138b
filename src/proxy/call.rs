//! The upstream side of a protected request: the call itself, read whole up to what can be
//! stored, and the recovery probe asked before a re-execution.
//!
//! What matters for idempotency is told apart here: nothing sent (the key can be
//! released), an answer (stored), or an unknown outcome (the upstream may have acted).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, response};
use http_body_util::BodyExt;
use tokio::time::{Instant, timeout_at};

use super::headers::detach_headers;
use super::job::Job;
use super::lease::fence_for;
use super::rewrite::set_key;
use super::state::{Shared, error_chain};
use crate::body::{BoxError, ProxyBody, empty, full};
use crate::config::{Policy, RecoveryProbe};
use crate::key::derived_key;
use crate::metrics::{KindLabel, RouteLabel, RouteName};
use crate::problem::ProxyError;
use crate::store::{Fence, KeyStore, Lease};
use crate::upstream::ForwardError;
use crate::upstream::UpstreamBody;

/// What the upstream call came to.
pub(crate) enum Upstream {
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

impl Upstream {
    /// How the call ended, as a label (for traces).
    pub fn label(&self) -> &'static str {
        match self {
            Upstream::Answered { .. } => "answered",
            Upstream::TooLarge { .. } => "answered_too_large",
            Upstream::NotSent(_) => "not_sent",
            Upstream::Unknown(_) => "unknown",
        }
    }

    /// The upstream's status, when it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Upstream::Answered { head, .. } | Upstream::TooLarge { head, .. } => {
                Some(head.status.as_u16())
            }
            Upstream::NotSent(_) | Upstream::Unknown(_) => None,
        }
    }
}

/// What the recovery probe said.
pub(crate) enum Probe {
    /// The operation happened; this is its answer, to be stored.
    Found(Upstream),
    /// It did not: execute.
    NotFound,
    /// No usable answer: keep the key in progress and execute nothing.
    Inconclusive(ProxyError),
}

/// A reserved request made ready to send.
pub(crate) struct Outgoing<'a> {
    /// What ending the reservation is written under.
    pub fence: Fence,
    /// The exchange: the recovery probe first on a re-execution, then the call. Boxed, so
    /// that the stage awaiting it holds a pointer, and the request's parts are gone from
    /// the stage's state once it is sent.
    pub work: Pin<Box<dyn Future<Output = Upstream> + Send + 'a>>,
}

/// Makes `job` ready to send under the reservation `lease`: the key headers taken out and
/// the derived key put in (in the header, or in the body where the provider reads it).
pub(crate) fn outgoing<'a, S: KeyStore>(
    shared: &'a Shared<S>,
    job: Job,
    lease: &Lease,
) -> Outgoing<'a> {
    let route = Arc::clone(&job.route);
    let policy = &route.policy;
    // What the first attempt sent, as the row keeps it (a takeover after `derived_key:`
    // was reconfigured still sends the same key).
    let derived = lease
        .derived_key
        .clone()
        .unwrap_or_else(|| derived_key(&job.client_id, job.clear_key()));
    let derived_value = HeaderValue::from_str(&derived).ok();
    // Only on routes whose provider reads the key in the body: what `protect` wrote there.
    let written = || match &job.derived_key {
        Some(form) => form.as_str().to_owned(),
        None => derived_key(&job.client_id, job.clear_key()),
    };
    let mut body = job.body.clone();
    if let Some(pointer) = &policy.upstream_key_body
        && written() != derived
    {
        // `protect` wrote the key in this configuration's form; the row says otherwise.
        let content_type = job.parts.headers.get(http::header::CONTENT_TYPE);
        if let Ok(rewritten) = set_key(content_type.map(|v| v.as_bytes()), &body, pointer, &derived)
        {
            body = rewritten;
        }
    }
    let fence = fence_for(
        policy,
        job.client_id.into_string(),
        job.key.into_string(),
        lease.token,
    );
    let mut parts = job.parts;
    for name in &policy.key_headers {
        parts.headers.remove(name);
    }
    // Unless the provider reads it in the body, where `protect` already wrote it.
    if let (Some(value), None) = (&derived_value, &policy.upstream_key_body) {
        parts
            .headers
            .insert(policy.upstream_key_header.clone(), value.clone());
    }
    let peer = job.peer;
    let request = shared.forwarder.upstream_request(parts, full(body), peer);
    // Only a re-execution asks the probe: the first attempt may have happened.
    let takeover = lease.takeover;
    let work = Box::pin(async move {
        let policy = &route.policy;
        if let Some(probe) = policy.recovery_probe.as_ref().filter(|_| takeover) {
            match ask_probe(shared, probe, &derived, derived_value, policy, peer).await {
                Probe::Found(answer) => {
                    tracing::warn!(route = %route.name, "recovery probe found the operation; storing its answer instead of executing again");
                    return answer;
                }
                Probe::NotFound => {}
                Probe::Inconclusive(err) => return Upstream::Unknown(err),
            }
        }
        call_upstream(shared, &route.name, request, policy.max_stored_response).await
    });
    Outgoing { fence, work }
}

/// Asks the upstream whether the operation carrying `derived` already happened.
pub(crate) async fn ask_probe<S>(
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

/// Calls the upstream and reads its answer, all within the upstream timeout; timed and
/// counted per route.
pub(crate) async fn call_upstream<S>(
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
    let forwarder = &shared.forwarder;
    let deadline = Instant::now() + forwarder.upstream().timeout;
    // The wait for a connection is not the call: giving up on it sends nothing.
    let ready = match timeout_at(deadline, forwarder.ready()).await {
        Err(_) => {
            return Upstream::NotSent(
                format!(
                    "no upstream connection came free within upstream.timeout ({} ms; upstream.max_connections {} all busy)",
                    forwarder.upstream().timeout.as_millis(),
                    forwarder.max_connections()
                )
                .into(),
            );
        }
        Ok(Err(ForwardError::NotSent(e))) => return Upstream::NotSent(e),
        Ok(Err(ForwardError::Failed(e))) => {
            return Upstream::Unknown(ProxyError::UpstreamFailed(e));
        }
        Ok(Ok(ready)) => ready,
    };
    let resp = match timeout_at(deadline, ready.send(request)).await {
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
