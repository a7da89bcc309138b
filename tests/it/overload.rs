//! Bounded under abuse: a client that sends keyed requests and leaves (HTTP/1.1
//! connect-send-close, HTTP/2 streams reset as soon as sent), HTTP/2 connections left idle
//! or never read, and a full upstream pool — each beside a well-behaved client paying
//! throughout. The process stays up, its memory bounded, the bystander served, and the
//! upstream sees at most the admitted work.

use crate::support;

use std::time::Duration;

use support::h2raw::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BODY: &str = PAYMENT_BODY;

/// `PAYMENTS` with `limits:` added.
fn with_limits(limits: &str) -> String {
    format!("{PAYMENTS}limits:\n{limits}")
}

/// A bystander paying every 50 ms until `stop`: its statuses.
fn bystander(
    addr: std::net::SocketAddr,
    stop: tokio::time::Instant,
) -> tokio::task::JoinHandle<Vec<u16>> {
    tokio::spawn(async move {
        let client = client_for(addr);
        let mut statuses = Vec::new();
        let mut i = 0;
        while tokio::time::Instant::now() < stop {
            let reply = client
                .post("/payments", "shop-1", &format!("by-{i}"), BODY)
                .await;
            statuses.push(reply.status.as_u16());
            i += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        statuses
    })
}

/// The process's peak resident memory, from `/proc`.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The documented bound (docs/security.md) for this attack on a test build's proxy.
const PEAK_RSS_BOUND_KIB: u64 = 64 * 1024;

/// HTTP/1.1: connect, send a keyed POST, close — from four tasks for four seconds. The
/// attacker's detached executions stay within its client's bound, the bystander's
/// payments all succeed, and memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_http1_requests_are_bounded() {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let db = Backend::embedded();
    let yaml = with_limits("  detached:\n    max: 48\n    per_client: 24\n");
    let proxy = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let stop = tokio::time::Instant::now() + Duration::from_secs(4);
    let by = bystander(proxy.addr, stop);
    let mut attackers = tokio::task::JoinSet::new();
    for t in 0..4 {
        let addr = proxy.addr;
        attackers.spawn(async move {
            let mut sent = 0u32;
            while tokio::time::Instant::now() < stop {
                let Ok(mut conn) = TcpStream::connect(addr).await else {
                    continue;
                };
                let request = format!(
                    "POST /payments HTTP/1.1\r\nHost: x\r\nX-Client-Id: attacker\r\nIdempotency-Key: a-{t}-{sent}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
                    BODY.len()
                );
                let _ = conn.write_all(request.as_bytes()).await;
                drop(conn);
                sent += 1;
            }
            sent
        });
    }
    let sent: u32 = attackers.join_all().await.into_iter().sum();
    let statuses = by.await.unwrap();
    assert!(sent > 200, "the attack sent {sent} requests");
    assert!(
        statuses.iter().all(|s| *s == 201),
        "the bystander's payments: {statuses:?}"
    );
    // The attacker's at most 24 and the bystander's one.
    assert!(
        upstream.most_in_flight() <= 25,
        "{} executions at once",
        upstream.most_in_flight()
    );
    let refused = metric(
        proxy.admin,
        "idemproxy_admission_refused_total{kind=\"client\"}",
    )
    .await;
    assert!(refused > 0.0, "the attacker was refused");
    let peak = peak_rss_kib(proxy.pid());
    eprintln!("peak RSS under the attack: {peak} KiB");
    assert!(peak < PEAK_RSS_BOUND_KIB, "peak RSS {peak} KiB");
    // Still up and serving.
    let after = client_for(proxy.addr)
        .post("/payments", "shop-1", "after", BODY)
        .await;
    assert_eq!(after.status, 201);
}

/// HTTP/2's paced Rapid Reset: one stream per write, each reset right after its request.
/// A reset stream's work still counts against its connection, so the upstream never runs
/// more than the connection's bound of them at once; the bystander keeps paying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_http2_streams_count_against_their_connection() {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let db = Backend::embedded();
    let yaml = with_limits("  detached:\n    per_connection: 8\n");
    let proxy = ProxyProcess::spawn(&yaml, &upstream, &db).await;
    let stop = tokio::time::Instant::now() + Duration::from_secs(4);
    let by = bystander(proxy.addr, stop);

    let conn = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut rd, mut wr) = conn.into_split();
    // Whatever the server sends is read and dropped: the attack is the resets.
    let reader = tokio::spawn(async move {
        let mut sink = vec![0u8; 64 * 1024];
        while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    wr.write_all(&hello).await.unwrap();
    let mut streams = 0u32;
    while tokio::time::Instant::now() < stop {
        let id = 2 * streams + 1;
        let key = format!("r-{streams}");
        let len = BODY.len().to_string();
        let head = block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/payments"),
            (":authority", "api.example"),
            ("x-client-id", "attacker"),
            ("idempotency-key", &key),
            ("content-type", "application/json"),
            ("content-length", &len),
        ]);
        let mut out = frame(HEADERS, END_HEADERS, id, &head);
        out.extend(frame(DATA, END_STREAM, id, BODY.as_bytes()));
        out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        if wr.write_all(&out).await.is_err() {
            break; // the server ended the connection
        }
        streams += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(wr);
    let statuses = by.await.unwrap();
    reader.abort();
    assert!(streams > 100, "the attack opened {streams} streams");
    assert!(
        statuses.iter().all(|s| *s == 201),
        "the bystander's payments: {statuses:?}"
    );
    // The connection's 8 and the bystander's one.
    assert!(
        upstream.most_in_flight() <= 9,
        "{} executions at once",
        upstream.most_in_flight()
    );
    let peak = peak_rss_kib(proxy.pid());
    eprintln!("peak RSS under the attack: {peak} KiB");
    assert!(peak < PEAK_RSS_BOUND_KIB, "peak RSS {peak} KiB");
}

/// Reads frames from `conn` until a GOAWAY or the end; whether one came and the
/// connection then ended, within `limit`.
async fn goaway_then_end(conn: &mut TcpStream, limit: Duration) -> (bool, bool) {
    let mut buf = Vec::new();
    let mut goaway = false;
    let read = async {
        loop {
            while let Some((kind, flags, _, _)) = take_frame(&mut buf) {
                match kind {
                    GOAWAY => goaway = true,
                    SETTINGS if flags & 1 == 0 => {
                        let _ = conn.write_all(&frame(SETTINGS, 1, 0, &[])).await;
                    }
                    PING if flags & 1 == 0 => {}
                    _ => {}
                }
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let ended = tokio::time::timeout(limit, read).await.unwrap_or(false);
    (goaway, ended)
}

/// An HTTP/2 connection with no stream is closed with GOAWAY after
/// `limits.http2_idle_timeout`; with `limits.max_connections` all held by idle HTTP/2
/// clients, a new client is served once they are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let db = Backend::embedded();
    let yaml =
        with_limits("  max_connections: 4\n  http2_idle_timeout: 1s\n  http2_ping_timeout: 1s\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        conn.write_all(&hello).await.unwrap();
        idle.push(conn);
    }
    // Every slot is held: a new client waits for one.
    let waiting = {
        let client = TestClient::new(&proxy);
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    let started = tokio::time::Instant::now();
    for conn in &mut idle {
        let (goaway, ended) = goaway_then_end(conn, Duration::from_secs(10)).await;
        assert!(goaway, "GOAWAY sent to an idle connection");
        assert!(ended, "the idle connection was closed");
    }
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting client was served")
        .unwrap();
    assert_eq!(reply.status, 201);
    assert!(started.elapsed() < Duration::from_secs(10));
    proxy.stop().await;
}

/// A peer that floods PINGs and never reads the answers is disconnected once what the
/// proxy sends it has waited unread for `limits.send_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_http2_connections_are_closed() {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let db = Backend::embedded();
    let yaml = with_limits("  send_timeout: 1s\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    conn.write_all(&hello).await.unwrap();
    let pings: Vec<u8> = (0..1000u64)
        .flat_map(|i| frame(PING, 0, 0, &i.to_be_bytes()))
        .collect();
    let flood = async {
        loop {
            if conn.write_all(&pings).await.is_err() {
                return;
            }
        }
    };
    // The flood blocks once the proxy stops reading (it cannot send its answers); it
    // ends with an error once the proxy closes the connection.
    let _ = tokio::time::timeout(Duration::from_secs(20), flood).await;
    let closed = eventually(Duration::from_secs(20), || async {
        (metric(
            proxy.admin,
            "idemproxy_connection_errors_total{kind=\"send_timeout\"}",
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert!(closed.is_some(), "the unread connection was closed");
    // The proxy goes on serving others.
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 201);
    proxy.stop().await;
}

/// One upstream connection, a slow upstream, six keys at once: only what reached the
/// upstream is an unknown outcome (`504`, kept in progress); the requests that timed out
/// waiting for the connection sent nothing — `502` `upstream-unreachable`, their keys
/// released, and a retry executes once the upstream is free. With `takeover: never` none
/// of them is left for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_wait_is_not_an_unknown_outcome() {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(6),
        ..Default::default()
    })
    .await;
    let db = Backend::embedded();
    let yaml = PAYMENTS
        .replace("  timeout: 10s\n", "  timeout: 2s\n  max_connections: 1\n")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    takeover: never\n",
        );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let replies = client
        .post_each_key_at_once(6, "/payments", "shop-1", "k", BODY)
        .await;
    let unknown = replies.iter().filter(|r| r.status == 504).count();
    let not_sent: Vec<_> = replies.iter().filter(|r| r.status == 502).collect();
    assert_eq!(unknown + not_sent.len(), 6, "{replies:?}");
    assert_eq!(
        unknown,
        upstream.executions(),
        "only what reached the upstream is an unknown outcome"
    );
    assert!(!not_sent.is_empty(), "some waited for the connection");
    for reply in &not_sent {
        assert!(
            reply.json()["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("upstream-unreachable")),
            "{reply:?}"
        );
    }
    let mut released = 0;
    for i in 0..6 {
        if db.lookup("shop-1", &format!("k{i}")).await.is_none() {
            released += 1;
        }
    }
    assert_eq!(released, not_sent.len(), "their keys were released");
    upstream.set(Behavior::default());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut retried = 0;
    for i in 0..6 {
        if db.lookup("shop-1", &format!("k{i}")).await.is_none() {
            let reply = client
                .post("/payments", "shop-1", &format!("k{i}"), BODY)
                .await;
            assert_eq!(reply.status, 201, "a released key executes");
            retried += 1;
        }
    }
    assert_eq!(retried, not_sent.len());
    proxy.stop().await;
}
