//! A real HTTP upstream on a loopback port that counts executions and charges, with the
//! behaviours the tests need (slow, failing, dropping the connection, deduplicating).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// How the fake upstream answers.
#[derive(Clone, Debug)]
pub struct Behavior {
    pub delay: Duration,
    pub status: u16,
    /// Deduplicate by the derived key like a provider that supports idempotency keys.
    pub dedupe: bool,
    /// Pad the answer to at least this many bytes.
    pub pad_to: usize,
    /// Close a keep-alive connection silently after it has been idle this long (read
    /// when the connection is accepted).
    pub idle_close: Option<Duration>,
    /// Answer recovery probes with this status instead of found (200) / not found (404):
    /// a provider whose lookup is down.
    pub probe_status: Option<u16>,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            status: 201,
            dedupe: false,
            pad_to: 0,
            idle_close: None,
            probe_status: None,
        }
    }
}

/// What the upstream saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Shown in assertion messages (through `Debug`), read by no test yet.
    #[allow(dead_code)]
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct UpstreamState {
    /// Every request that reached the handler ("executions").
    executions: AtomicUsize,
    /// Charges actually made (differs from executions when deduplicating).
    charges: AtomicUsize,
    by_key: Mutex<HashMap<String, String>>,
    seen: Mutex<Vec<Seen>>,
    behavior: Mutex<Behavior>,
    /// Requests whose answer has been fully produced (after the delay).
    finished: AtomicUsize,
    /// Executions running now (between arrival and answer, or the proxy giving up), and
    /// the most at once.
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Recovery probes answered (`/probe/{key}`), not counted as executions.
    probes: AtomicUsize,
    /// Connections accepted, open now, and open at most at once.
    accepted: AtomicUsize,
    open: AtomicUsize,
    most_open: AtomicUsize,
}

/// A real HTTP upstream on 127.0.0.1 that counts executions.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
}

impl Upstream {
    pub async fn spawn(behavior: Behavior) -> Self {
        Self::spawn_at("127.0.0.1:0".parse().unwrap(), behavior).await
    }

    /// Starts the upstream on a given address (to bring a "down" upstream back up).
    pub async fn spawn_at(addr: SocketAddr, behavior: Behavior) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState {
            behavior: Mutex::new(behavior),
            ..Default::default()
        });
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                st.accepted.fetch_add(1, Ordering::SeqCst);
                let open = st.open.fetch_add(1, Ordering::SeqCst) + 1;
                st.most_open.fetch_max(open, Ordering::SeqCst);
                let idle_close = st.behavior.lock().unwrap().idle_close;
                tokio::spawn(async move {
                    let st2 = Arc::clone(&st);
                    let svc = service_fn(move |req| handle_upstream(Arc::clone(&st2), req));
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Some(idle) = idle_close {
                        // hyper's head timeout also bounds the wait for the next request.
                        builder
                            .http1()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(idle);
                    }
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    st.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Upstream { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The most executions that ran at once.
    pub fn most_in_flight(&self) -> usize {
        self.state.most_in_flight.load(Ordering::SeqCst)
    }

    pub fn executions(&self) -> usize {
        self.state.executions.load(Ordering::SeqCst)
    }

    pub fn charges(&self) -> usize {
        self.state.charges.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests have reached the upstream. The budget is for a loaded
    /// machine (the whole suite on two cores), not a quiet one: the wait ends at the event.
    pub async fn wait_executions(&self, n: usize) {
        let reached = eventually(Duration::from_secs(60), || async {
            (self.executions() >= n).then_some(())
        })
        .await;
        assert!(
            reached.is_some(),
            "the upstream never reached {n} executions"
        );
    }

    pub fn probes(&self) -> usize {
        self.state.probes.load(Ordering::SeqCst)
    }

    pub fn finished(&self) -> usize {
        self.state.finished.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once.
    pub fn most_open_connections(&self) -> usize {
        self.state.most_open.load(Ordering::SeqCst)
    }

    pub fn set(&self, behavior: Behavior) {
        *self.state.behavior.lock().unwrap() = behavior;
    }
}

async fn handle_upstream(
    st: Arc<UpstreamState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if let Some(probed) = parts.uri.path().strip_prefix("/probe/") {
        // A provider's "did the operation with this key happen?" endpoint.
        st.probes.fetch_add(1, Ordering::SeqCst);
        let key = percent_decode(probed);
        let found = st.by_key.lock().unwrap().get(&key).cloned();
        let (status, body) = match (st.behavior.lock().unwrap().probe_status, found) {
            (Some(status), _) => (status, r#"{"error":"lookup unavailable"}"#.to_owned()),
            (None, Some(charge)) => (200, charge),
            (None, None) => (404, r#"{"error":"no such operation"}"#.to_owned()),
        };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        return Ok(resp);
    }
    let behavior = st.behavior.lock().unwrap().clone();
    st.executions.fetch_add(1, Ordering::SeqCst);
    let running = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    st.most_in_flight.fetch_max(running, Ordering::SeqCst);
    let _running = InFlight(Arc::clone(&st));
    st.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The "charge": made once per derived key when deduplicating, else every time.
    let charge = {
        let mut by_key = st.by_key.lock().unwrap();
        match (&key, behavior.dedupe) {
            (Some(k), true) if by_key.contains_key(k) => by_key[k].clone(),
            _ => {
                let n = st.charges.fetch_add(1, Ordering::SeqCst) + 1;
                let charge = format!(
                    r#"{{"charge_id":{n},"request":{}}}"#,
                    serde_json::to_string(&String::from_utf8_lossy(&body)).unwrap()
                );
                if let Some(k) = key {
                    by_key.insert(k, charge.clone());
                }
                charge
            }
        }
    };
    let mut charge = charge;
    if charge.len() < behavior.pad_to {
        charge = format!("{charge}{}", " ".repeat(behavior.pad_to - charge.len()));
    }
    tokio::time::sleep(behavior.delay).await;
    st.finished.fetch_add(1, Ordering::SeqCst);
    let resp = Response::builder()
        .status(behavior.status)
        .header("content-type", "application/json")
        .header("location", "/payments/1")
        .header("set-cookie", "session=secret")
        .header("x-upstream-only", "1")
        .body(Full::new(Bytes::from(charge)))
        .unwrap();
    Ok(resp)
}

/// One execution running; it ends when the handler returns or is dropped.
struct InFlight(Arc<UpstreamState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
