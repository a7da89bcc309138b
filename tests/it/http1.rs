//! HTTP/1.1 as the proxy speaks it on both sides, with raw sockets: pipelining, chunked
//! and `100-continue` request bodies, refused framing, HTTP/1.0 clients, `HEAD`, and the
//! ways an upstream can frame its answers. Executions are counted throughout: a framing
//! mistake here is how a request would be read twice, or two requests as one.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BODY: &str = PAYMENT_BODY;

fn keyed(key: &str, extra: &str, body: &str) -> String {
    format!(
        "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\nx-client-id: shop-1\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn proxy_on(db: &Backend) -> (Upstream, TestProxy) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, db).await;
    (upstream, proxy)
}

/// Three requests in one write are answered in order on one connection: an execution, its
/// replay, and a pass-through — the second never mistaken for part of the first's body.
async fn pipelined_requests_are_answered_in_order(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let all = format!(
        "{}{}POST /orders/1 HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}",
        keyed("pipe", "", BODY),
        keyed("pipe", "", BODY)
    );
    conn.write_all(all.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let first = read_answer(&mut conn, &mut buf, false).await.unwrap();
    let second = read_answer(&mut conn, &mut buf, false).await.unwrap();
    let third = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(
        (first.status, first.header("idempotent-replayed")),
        (201, Some("false"))
    );
    assert_eq!(
        (second.status, second.header("idempotent-replayed")),
        (201, Some("true"))
    );
    assert_eq!(first.body, second.body);
    assert_eq!(
        (third.status, third.header("idempotent-replayed")),
        (201, None)
    );
    assert_eq!(upstream.executions(), 2, "one payment, one order");
    proxy.stop().await;
}

/// A chunked body (with a chunk extension and a trailer field) is the same request as the
/// same bytes sent with a length: replayed, not refused as another body; the upstream sees
/// it re-framed with a length, never chunked.
async fn chunked_bodies_are_the_same_request(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    let (a, b) = BODY.split_at(10);
    let chunked = format!(
        "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: ch\r\nx-client-id: shop-1\r\ntransfer-encoding: chunked\r\n\r\n{:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\nx-trailer: t\r\n\r\n",
        a.len(),
        b.len()
    );
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = Vec::new();
    // The chunks arrive in separate writes, as a streaming client sends them.
    for piece in chunked.as_bytes().chunks(17) {
        conn.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    conn.write_all(keyed("ch", "", BODY).as_bytes())
        .await
        .unwrap();
    let again = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (201, Some("true"))
    );
    assert_eq!(upstream.executions(), 1);
    let seen = &upstream.seen()[0];
    assert_eq!(seen.body, BODY.as_bytes());
    assert!(
        seen.headers.get("transfer-encoding").is_none(),
        "{:?}",
        seen.headers
    );
    assert_eq!(
        seen.headers.get("content-length").unwrap(),
        &BODY.len().to_string()
    );
    proxy.stop().await;
}

/// `Expect: 100-continue`: the go-ahead comes when the proxy reads the body, and a request
/// refused before its body is read gets its final answer with no go-ahead and the
/// connection closed (the client may or may not send the body it was holding back).
async fn expect_continue(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let request = keyed("ec", "expect: 100-continue\r\n", BODY);
    let (head, body) = request.split_at(request.len() - BODY.len());
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let go = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(go.status, 100);
    conn.write_all(body.as_bytes()).await.unwrap();
    let done = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(done.status, 201, "{done:?}");

    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(
        b"POST /payments HTTP/1.1\r\nhost: x\r\nx-client-id: shop-1\r\nexpect: 100-continue\r\ncontent-length: 500\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let refused = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(refused.status, 400, "no key: refused without a go-ahead");
    assert!(
        closed(&mut conn).await,
        "the unsent body leaves the framing unknown"
    );
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// A body that could be read two ways, or in a coding the proxy does not decode, is
/// refused with a problem document, reaches nothing, and ends the connection.
async fn ambiguous_framing_is_refused(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    for (extra, status, kind) in [
        (
            "content-length: 5\r\ntransfer-encoding: chunked\r\n",
            400,
            "malformed-request",
        ),
        (
            "content-length: 5\r\ncontent-length: 6\r\n",
            400,
            "malformed-request",
        ),
        ("content-length: -5\r\n", 400, "malformed-request"),
        (
            "transfer-encoding: gzip, chunked\r\n",
            501,
            "unsupported-transfer-coding",
        ),
    ] {
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        let request = format!(
            "POST /payments HTTP/1.1\r\nhost: x\r\nidempotency-key: amb\r\nx-client-id: shop-1\r\n{extra}\r\n0\r\n\r\n"
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let answer = read_answer(&mut conn, &mut buf, false).await.unwrap();
        assert_eq!(answer.status, status, "{extra}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        let doc: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(doc["type"], format!("urn:idemproxy:problem:{kind}"));
        assert!(!doc["detail"].as_str().unwrap().is_empty());
        assert!(closed(&mut conn).await, "{extra}");
    }
    assert_eq!(upstream.executions(), 0);
    assert_eq!(db.rows().await, 0);
    proxy.stop().await;
}

/// HTTP/1.0 clients: closed after the answer unless they ask to keep the connection, and
/// then answered with a length on a connection that stays open.
async fn http10_clients(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"POST /orders/1 HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let answer = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(answer.status, 201);
    assert!(closed(&mut conn).await);

    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..2 {
        conn.write_all(
            b"POST /orders/1 HTTP/1.0\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await
        .unwrap();
        let answer = read_answer(&mut conn, &mut buf, false).await.unwrap();
        assert_eq!(answer.status, 201);
        assert_eq!(answer.header("connection"), Some("keep-alive"));
        assert!(answer.header("content-length").is_some());
    }
    assert_eq!(upstream.executions(), 3);
    proxy.stop().await;
}

/// An answer to HEAD carries the upstream's length and no body, and the next request on
/// the same connection is read from the right place.
async fn head_answers_have_no_body(db: Backend) {
    let (upstream, proxy) = proxy_on(&db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"HEAD /status HTTP/1.1\r\nhost: x\r\n\r\nPOST /orders/1 HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = read_answer(&mut conn, &mut buf, true).await.unwrap();
    assert_eq!(head.status, 201);
    assert!(
        head.header("content-length").is_some_and(|n| n != "0"),
        "{head:?}"
    );
    let next = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(next.status, 201);
    assert!(!next.body.is_empty());
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

on_both_stores!(
    pipelined_requests_are_answered_in_order,
    chunked_bodies_are_the_same_request,
    expect_continue,
    ambiguous_framing_is_refused,
    http10_clients,
    head_answers_have_no_body,
);

/// An upstream that answers every request with `answer` (raw bytes, then closes the
/// connection when `close`), counting requests and connections.
struct RawUpstream {
    addr: std::net::SocketAddr,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn spawn(answer: &'static str, close: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (r, c) = (Arc::clone(&requests), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = Arc::clone(&r);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // One request: its head, then its Content-Length body.
                        let (head_len, body_len) = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                                let len = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length:"))
                                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                                break (i + 4, len);
                            }
                            let mut chunk = [0u8; 4096];
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        while buf.len() < head_len + body_len {
                            let mut chunk = [0u8; 4096];
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_len + body_len);
                        r.fetch_add(1, Ordering::SeqCst);
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        if close {
                            let _ = conn.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        RawUpstream {
            addr,
            requests,
            connections,
        }
    }
}

/// Every way an upstream may frame its answer reaches the client whole and is stored
/// whole (the replay is the same bytes); a connection is reused only when the answer's
/// framing and fields allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_framings_are_read_whole() {
    for (answer, close, reused) in [
        (
            "HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"id\":\"c1\"}",
            false,
            true,
        ),
        (
            "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"id\r\n7\r\n\":\"c1\"}\r\n0\r\n\r\n",
            false,
            true,
        ),
        (
            "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 11\r\n\r\n{\"id\":\"c1\"}",
            true,
            false,
        ),
        ("HTTP/1.0 201 Created\r\n\r\n{\"id\":\"c1\"}", true, false),
        (
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"id\":\"c1\"}",
            false,
            true,
        ),
    ] {
        let raw = RawUpstream::spawn(answer, close).await;
        let db = Backend::embedded();
        let yaml = PAYMENTS.replace("{upstream}", &format!("http://{}", raw.addr));
        let placeholder = Upstream::spawn(Behavior::default()).await;
        let proxy = TestProxy::spawn(&yaml, &placeholder, &db).await;
        let client = TestClient::new(&proxy);
        for i in 0..3 {
            let first = client
                .post("/payments", "shop-1", &format!("f{i}"), BODY)
                .await;
            assert_eq!(first.status, 201, "{answer:?}: {first:?}");
            assert_eq!(&first.body[..], br#"{"id":"c1"}"#, "{answer:?}");
            let replay = client
                .post("/payments", "shop-1", &format!("f{i}"), BODY)
                .await;
            assert!(replay.replayed());
            assert_eq!(replay.body, first.body);
            let passed = client.send("POST", "/orders/1", &[], "{}").await;
            assert_eq!(&passed.body[..], br#"{"id":"c1"}"#, "{answer:?}");
        }
        assert_eq!(raw.requests.load(Ordering::SeqCst), 6, "{answer:?}");
        let connections = raw.connections.load(Ordering::SeqCst);
        if reused {
            assert_eq!(connections, 1, "{answer:?}");
        } else {
            assert_eq!(connections, 6, "{answer:?}");
        }
        proxy.stop().await;
    }
}

/// An upstream that reads the request and closes without answering may have acted: the
/// client gets `502 upstream-failed`, the key stays in progress (a retry gets `409`, not a
/// second execution). Only a request of which not a byte was written counts as not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_written_then_cut_off_keeps_its_key() {
    let raw = RawUpstream::spawn("", true).await;
    let db = Backend::embedded();
    let yaml = PAYMENTS.replace("{upstream}", &format!("http://{}", raw.addr));
    let placeholder = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&yaml, &placeholder, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "cut", BODY).await;
    assert_eq!(first.status, 502, "{first:?}");
    assert_eq!(
        first.json()["type"],
        "urn:idemproxy:problem:upstream-failed"
    );
    let retry = client.post("/payments", "shop-1", "cut", BODY).await;
    assert_eq!(retry.status, 409, "{retry:?}");
    assert_eq!(raw.requests.load(Ordering::SeqCst), 1);
    proxy.stop().await;
}
