//! Traces of protected requests, exported by OTLP over HTTP (JSON encoding) when
//! `tracing.otlp_endpoint` is set. A request that carries a W3C `traceparent` joins the
//! caller's trace: the proxy's root span is the child of the caller's span, and its stages
//! (route match, reserve, upstream call, completion, replay) are children of the root. The
//! `traceparent` and `tracestate` headers themselves go upstream untouched.
//!
//! Off, nothing is recorded: no context, no clock reads, no allocation. On, spans queue in
//! a bounded channel (a full queue drops spans, it never slows a request) and one task
//! posts them in batches.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::Full;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::Tracing;
use crate::key::hex;

/// Spans queued for export at most; past it, new spans are dropped (and counted).
const QUEUE: usize = 8192;
/// Spans per export request at most.
const BATCH: usize = 512;

/// OTLP span kinds.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// One finished span.
struct SpanRecord {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: &'static str,
    kind: Kind,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

/// The exporter's handle: where finished spans go.
pub struct Tracer {
    queue: mpsc::Sender<SpanRecord>,
    ids: RandomState,
    counter: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl Tracer {
    /// Starts the export task on the current Tokio runtime.
    pub fn start(config: &Tracing) -> Arc<Tracer> {
        let (queue, spans) = mpsc::channel(QUEUE);
        tokio::spawn(export(config.clone(), spans));
        Arc::new(Tracer {
            queue,
            ids: RandomState::new(),
            counter: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
        })
    }

    fn id(&self) -> u64 {
        // Never 0 (an invalid id in W3C trace context).
        self.ids
            .hash_one(self.counter.fetch_add(1, Ordering::Relaxed))
            .max(1)
    }

    fn send(&self, span: SpanRecord) {
        if self.queue.try_send(span).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The trace of one protected request: its root span's identity and where it started.
/// Shared (one pointer), as the request and its detached execution both record stages.
#[derive(Clone)]
pub struct Trace(Arc<TraceInner>);

struct TraceInner {
    tracer: Arc<Tracer>,
    trace_id: [u8; 16],
    root: [u8; 8],
    remote_parent: Option<[u8; 8]>,
    started: SystemTime,
}

impl Trace {
    /// A trace for a request: the caller's, when its `traceparent` is valid, else a new one.
    pub fn start(tracer: &Arc<Tracer>, headers: &HeaderMap) -> Trace {
        let (trace_id, remote_parent) = match traceparent(headers) {
            Some((trace, parent)) => (trace, Some(parent)),
            None => {
                let mut id = [0; 16];
                id[..8].copy_from_slice(&tracer.id().to_be_bytes());
                id[8..].copy_from_slice(&tracer.id().to_be_bytes());
                (id, None)
            }
        };
        Trace(Arc::new(TraceInner {
            tracer: Arc::clone(tracer),
            trace_id,
            root: tracer.id().to_be_bytes(),
            remote_parent,
            started: SystemTime::now(),
        }))
    }

    /// Records a stage that ran from `start` until now, as a child of the request's span.
    pub fn stage(
        &self,
        name: &'static str,
        kind: Kind,
        start: SystemTime,
        attributes: Vec<(&'static str, Value)>,
    ) {
        self.0.tracer.send(SpanRecord {
            trace_id: self.0.trace_id,
            span_id: self.0.tracer.id().to_be_bytes(),
            parent: Some(self.0.root),
            name,
            kind,
            start,
            end: SystemTime::now(),
            attributes,
        });
    }

    /// Ends the request's own span.
    pub fn finish(&self, attributes: Vec<(&'static str, Value)>) {
        let t = &self.0;
        t.tracer.send(SpanRecord {
            trace_id: t.trace_id,
            span_id: t.root,
            parent: t.remote_parent,
            name: "idemproxy request",
            kind: Kind::Server,
            start: t.started,
            end: SystemTime::now(),
            attributes,
        });
    }
}

/// A stage being timed: started now when the request is traced, nothing otherwise.
pub struct Timer(Option<(Trace, SystemTime)>);

impl Timer {
    pub fn start(trace: Option<&Trace>) -> Timer {
        Timer(trace.map(|t| (t.clone(), SystemTime::now())))
    }

    /// Records the stage; its attributes are computed only when it is traced.
    pub fn end(
        self,
        name: &'static str,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<(&'static str, Value)>,
    ) {
        if let Some((trace, start)) = self.0 {
            trace.stage(name, kind, start, attributes());
        }
    }
}

/// A valid W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`): its trace and parent ids.
/// Exactly one header; all-zero ids and unknown versions' malformed forms are ignored.
fn traceparent(headers: &HeaderMap) -> Option<([u8; 16], [u8; 8])> {
    let mut values = headers.get_all("traceparent").iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let text = value.to_str().ok()?.trim();
    let mut parts = text.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || flags.len() != 2 {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace: [u8; 16] = decode_hex(trace)?;
    let parent: [u8; 8] = decode_hex(parent)?;
    (trace != [0; 16] && parent != [0; 8]).then_some((trace, parent))
}

/// Lowercase hex only, as W3C trace context writes it.
fn decode_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    crate::key::from_hex(text)
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
        .to_string()
}

fn attribute(key: &str, value: &Value) -> Value {
    let value = match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({ "intValue": n.to_string() }),
        Value::Number(n) => json!({ "doubleValue": n }),
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::String(s) => json!({ "stringValue": s }),
        other => json!({ "stringValue": other.to_string() }),
    };
    json!({ "key": key, "value": value })
}

/// The OTLP/JSON `ExportTraceServiceRequest` for a batch.
fn encode(service_name: &str, spans: &[SpanRecord]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut span = json!({
                "traceId": hex(&s.trace_id),
                "spanId": hex(&s.span_id),
                "name": s.name,
                "kind": s.kind as u8,
                "startTimeUnixNano": nanos(s.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
            });
            if let Some(parent) = s.parent {
                span["parentSpanId"] = Value::String(hex(&parent));
            }
            span
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [attribute("service.name", &Value::String(service_name.to_owned()))] },
            "scopeSpans": [{
                "scope": { "name": "idemproxy", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

/// Posts queued spans in batches until every sender is gone.
async fn export(config: Tracing, mut spans: mpsc::Receiver<SpanRecord>) {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(std::time::Duration::from_secs(2)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<Bytes>>(connector);
    let mut batch = Vec::with_capacity(BATCH);
    let mut failing = false;
    while spans.recv_many(&mut batch, BATCH).await > 0 {
        let body = encode(&config.service_name, &batch).to_string();
        batch.clear();
        let request = http::Request::post(config.traces_url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let Ok(request) = request else { continue };
        let sent =
            tokio::time::timeout(std::time::Duration::from_secs(10), client.request(request)).await;
        let ok = matches!(&sent, Ok(Ok(resp)) if resp.status().is_success());
        // Said once per outage, not once per batch.
        if !ok && !failing {
            let why = match sent {
                Ok(Ok(resp)) => format!("answered {}", resp.status()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            tracing::warn!(url = %config.traces_url, cause = %why, "cannot export spans; dropping them until the receiver is back");
        } else if ok && failing {
            tracing::info!(url = %config.traces_url, "exporting spans again");
        }
        failing = !ok;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("traceparent", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn traceparent_is_read_as_w3c_says() {
        let (trace, parent) = traceparent(&headers(&[
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ]))
        .unwrap();
        assert_eq!(hex(&trace), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&parent), "00f067aa0ba902b7");
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "garbage",
            "",
        ] {
            assert!(traceparent(&headers(&[bad])).is_none(), "{bad}");
        }
        // A later version may add fields.
        assert!(
            traceparent(&headers(&[
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"
            ]))
            .is_some()
        );
        // Two headers: ambiguous, ignored.
        let two = [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01",
        ];
        assert!(traceparent(&headers(&two)).is_none());
    }

    #[test]
    fn attributes_are_typed_as_otlp_json_says() {
        assert_eq!(
            attribute("http.response.status_code", &json!(201)),
            json!({"key": "http.response.status_code", "value": {"intValue": "201"}})
        );
        assert_eq!(
            attribute("idemproxy.route", &json!("pay")),
            json!({"key": "idemproxy.route", "value": {"stringValue": "pay"}})
        );
    }
}
