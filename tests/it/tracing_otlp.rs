//! Traces by OTLP: a receiver started by the test decodes what the proxy exports. Each
//! protected request is one trace — the caller's when it sent a `traceparent`, with the
//! proxy's span the child of the caller's — whose stages are children of the proxy's span;
//! `traceparent` and `tracestate` reach the upstream untouched; unprotected requests are
//! not traced.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver: every span it was sent, decoded, with its service name.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Value)>>>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> (Receiver, std::net::SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = Receiver::default();
        let r = receiver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let r = r.clone();
                            async move {
                                assert_eq!(req.uri().path(), "/v1/traces");
                                let kind = req
                                    .headers()
                                    .get("content-type")
                                    .map(|v| v.to_str().unwrap().to_owned())
                                    .unwrap_or_default();
                                r.content_types.lock().unwrap().push(kind);
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let export: Value = serde_json::from_slice(&body).unwrap();
                                for resource in export["resourceSpans"].as_array().unwrap() {
                                    let service = resource["resource"]["attributes"]
                                        .as_array()
                                        .unwrap()
                                        .iter()
                                        .find(|a| a["key"] == "service.name")
                                        .map(|a| {
                                            a["value"]["stringValue"].as_str().unwrap().to_owned()
                                        })
                                        .unwrap();
                                    for scope in resource["scopeSpans"].as_array().unwrap() {
                                        for span in scope["spans"].as_array().unwrap() {
                                            r.spans
                                                .lock()
                                                .unwrap()
                                                .push((service.clone(), span.clone()));
                                        }
                                    }
                                }
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from_static(b"{}")),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (receiver, addr)
    }

    fn spans(&self) -> Vec<Value> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

async fn spans_in_traces(db: Backend) {
    let (receiver, addr) = Receiver::start().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!(
        "tracing:\n  otlp_endpoint: http://{addr}\n  service_name: payments-edge\n{PAYMENTS}"
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    // Joins the caller's trace; its trace headers go upstream as they came.
    let traceparent = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let headers = [
        ("content-type", "application/json"),
        ("idempotency-key", "traced"),
        ("x-client-id", "shop-1"),
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=opaque"),
    ];
    assert_eq!(
        client
            .send("POST", "/payments", &headers, BODY)
            .await
            .status,
        201
    );
    let seen = upstream.seen();
    assert_eq!(seen[0].headers["traceparent"], traceparent.as_str());
    assert_eq!(seen[0].headers["tracestate"], "vendor=opaque");
    // A new trace of its own; then a replay, a trace of its own too.
    assert_eq!(
        client
            .post("/payments", "shop-1", "untraced", BODY)
            .await
            .status,
        201
    );
    assert!(
        client
            .post("/payments", "shop-1", "untraced", BODY)
            .await
            .replayed()
    );
    // Unprotected: no trace.
    assert_eq!(client.send("GET", "/payments", &[], "").await.status, 201);

    let complete = eventually(Duration::from_secs(10), || async {
        let roots = receiver
            .spans()
            .into_iter()
            .filter(|s| s["name"] == "idemproxy request")
            .count();
        (roots >= 3).then_some(())
    })
    .await;
    assert!(complete.is_some(), "{:?}", receiver.spans());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spans = receiver.spans();
    let mut traces: HashMap<String, Vec<&Value>> = HashMap::new();
    for span in &spans {
        traces
            .entry(span["traceId"].as_str().unwrap().to_owned())
            .or_default()
            .push(span);
    }
    assert_eq!(
        traces.len(),
        3,
        "one trace per protected request: {spans:#?}"
    );
    for (trace, spans) in &traces {
        let roots: Vec<&&Value> = spans
            .iter()
            .filter(|s| s["name"] == "idemproxy request")
            .collect();
        assert_eq!(roots.len(), 1, "{trace}: {spans:#?}");
        let root = roots[0];
        assert_eq!(root["kind"], 2, "the proxy's span is a server span");
        let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
        for child in spans.iter().filter(|s| s["name"] != "idemproxy request") {
            assert_eq!(child["parentSpanId"], root["spanId"], "{trace}: {child}");
            let (start, end) = (
                child["startTimeUnixNano"]
                    .as_str()
                    .unwrap()
                    .parse::<u128>()
                    .unwrap(),
                child["endTimeUnixNano"]
                    .as_str()
                    .unwrap()
                    .parse::<u128>()
                    .unwrap(),
            );
            assert!(start <= end && start > 0, "{child}");
        }
        if trace == TRACE {
            assert_eq!(
                root["parentSpanId"], CALLER_SPAN,
                "the caller's span is the parent"
            );
            for stage in ["route", "reserve", "upstream", "complete"] {
                assert!(names.contains(&stage), "{stage} in {names:?}");
            }
            let upstream_span = spans.iter().find(|s| s["name"] == "upstream").unwrap();
            assert_eq!(upstream_span["kind"], 3, "a client span");
            assert_eq!(
                attr(upstream_span, "http.response.status_code").unwrap()["intValue"],
                "201"
            );
        } else {
            assert!(
                root.get("parentSpanId").is_none(),
                "a trace of its own: {root}"
            );
            assert_eq!(root["traceId"].as_str().unwrap().len(), 32);
        }
        assert_eq!(root["spanId"].as_str().unwrap().len(), 16);
    }
    let replay = traces
        .values()
        .find(|spans| spans.iter().any(|s| s["name"] == "replay"))
        .expect("the replay's trace");
    assert!(
        !replay.iter().any(|s| s["name"] == "upstream"),
        "a replay calls nobody"
    );
    let root = replay
        .iter()
        .find(|s| s["name"] == "idemproxy request")
        .unwrap();
    assert_eq!(
        attr(root, "idemproxy.outcome").unwrap()["stringValue"],
        "replayed"
    );
    assert!(
        receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .all(|(service, _)| service == "payments-edge")
    );
    assert!(
        receiver
            .content_types
            .lock()
            .unwrap()
            .iter()
            .all(|c| c == "application/json")
    );
    proxy.stop().await;
}

on_both_stores!(spans_in_traces);
