//! Hostile and broken clients: the proxy stays up, answers as HTTP expects, loses nothing.

use crate::support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

fn hostile_config() -> String {
    format!(
        "limits:\n  header_read_timeout: 1s\n  body_read_timeout: 1s\n  max_header_bytes: 16KiB\n{PAYMENTS}"
    )
}

/// A tiny deterministic PRNG (xorshift), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One malformed or truncated request of kind `i`.
fn payload(rng: &mut Rng, i: usize) -> Vec<u8> {
    let valid = format!(
        "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: f{i}\r\nx-client-id: flood\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    match i % 8 {
        0 => {
            let n = 1 + (rng.next() % 2048) as usize;
            rng.bytes(n)
        }
        1 => valid.as_bytes()[..(rng.next() as usize % valid.len())].to_vec(),
        2 => format!("POST /payments HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n", "a".repeat(40_000)).into_bytes(),
        3 => b"POST /payments HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\nx-client-id: c\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n".to_vec(),
        4 => b"POST /payments HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello!!".to_vec(),
        5 => b"POST /payments HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
        6 => {
            let mut headers = String::from("GET / HTTP/1.1\r\nhost: x\r\n");
            for h in 0..500 {
                headers.push_str(&format!("x-h{h}: {}\r\n", "v".repeat(40)));
            }
            headers.push_str("\r\n");
            headers.into_bytes()
        }
        _ => {
            let mut v = valid.into_bytes();
            let at = rng.next() as usize % v.len();
            v[at] = rng.next() as u8;
            v
        }
    }
}

/// What came back is nothing (the connection was closed) or a well-formed HTTP answer.
fn assert_http_or_closed(answer: &[u8]) {
    if answer.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(answer);
    assert!(
        text.starts_with("HTTP/1.1 ") || text.starts_with("HTTP/1.0 "),
        "not HTTP: {text:?}"
    );
    let status: u16 = text[9..12]
        .parse()
        .unwrap_or_else(|_| panic!("no status: {text:?}"));
    assert!((100..600).contains(&status), "{text:?}");
}

async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = conn.write_all(bytes).await;
    let _ = conn.shutdown().await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer)).await;
    answer
}

/// Two thousand malformed, truncated and absurd requests from eight connections at once:
/// every answer is valid HTTP (or a closed connection), the process stays up, nothing
/// malformed reaches the upstream with conflicting framing, and a good request right after
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_flood_leaves_the_proxy_standing() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&hostile_config(), &upstream, &db).await;
    let addr = proxy.addr;
    let mut workers = Vec::new();
    for w in 0..8u64 {
        workers.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w + 1));
            for i in 0..250 {
                let bytes = payload(&mut rng, i);
                let answer = exchange(addr, &bytes).await;
                assert_http_or_closed(&answer);
                if i % 8 == 2 || i % 8 == 6 {
                    let text = String::from_utf8_lossy(&answer);
                    assert!(
                        text.is_empty() || text.starts_with("HTTP/1.1 431"),
                        "huge heads get 431: {text}"
                    );
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    for seen in upstream.seen() {
        let has_te = seen.headers.contains_key("transfer-encoding");
        let lengths = seen.headers.get_all("content-length").iter().count();
        assert!(
            !(has_te && lengths > 0) && lengths <= 1,
            "conflicting framing reached the upstream: {:?}",
            seen.headers
        );
    }
    let client = TestClient::new(&proxy);
    let ok = client
        .post("/payments", "shop-1", "after-the-flood", BODY)
        .await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
    proxy.stop().await;
}

/// A client that sends its head a byte at a time (slowloris) is cut off after the header
/// timeout; one that stalls mid-body on a protected route gets 408 and reserves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&hostile_config(), &upstream, &db).await;

    let mut slow = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = b"POST /payments HTTP/1.1\r\nhost: x\r\nx-a: b\r\n";
    let mut cut = false;
    for b in head {
        if slow.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
    assert!(cut || read.is_ok(), "the server closed the slow connection");
    assert_http_or_closed(&rest);
    let counted = eventually(Duration::from_secs(30), || async {
        proxy
            .metrics
            .render()
            .contains("idemproxy_connection_errors_total{kind=\"header_timeout\"}")
            .then_some(())
    })
    .await;
    assert!(counted.is_some(), "the slow head is counted");

    let mut stall = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stall
        .write_all(
            format!(
                "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: stall\r\nx-client-id: c\r\ncontent-length: {}\r\n\r\n{}",
                BODY.len(),
                &BODY[..10]
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stall.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"));
    assert_eq!(db.rows().await, 0, "nothing reserved");
    assert_eq!(upstream.executions(), 0);
    proxy.stop().await;
}

/// Past `limits.max_connections`, further connections wait instead of being served, and
/// are served as soon as a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_queues_extra_clients() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(
        &format!("limits:\n  max_connections: 2\n{PAYMENTS}"),
        &upstream,
        &db,
    )
    .await;
    let hold1 = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let hold2 = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = tokio::spawn(async move {
        TestClient::at(addr_of(&proxy))
            .send("GET", "/payments", &[], "")
            .await
            .status
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !third.is_finished(),
        "the third connection waits while two are held"
    );
    drop(hold1);
    let status = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 201);
    drop(hold2);
}

fn addr_of(proxy: &TestProxy) -> std::net::SocketAddr {
    proxy.addr
}

/// A connection that never sends a byte is closed after the header timeout and counted,
/// like a slow head: silent clients cannot pin connection slots either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&hostile_config(), &upstream, &db).await;
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection was closed: {closed:?}"
    );
    let counted = proxy
        .metrics
        .render()
        .contains("idemproxy_connection_errors_total{kind=\"header_timeout\"}");
    assert!(counted, "the silent connection is counted");
    proxy.stop().await;
}

/// Draining does not wait for a connection that has not sent a request yet: shutdown with
/// a silent client connected ends well within the (default, 10 s) header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_hold_up_shutdown() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let _silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // Accepted before the drain starts.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopped = tokio::time::timeout(Duration::from_secs(5), proxy.stop()).await;
    assert!(stopped.is_ok(), "shutdown waited for a silent connection");
}

/// An idle keep-alive connection is closed once it has sent nothing for the header timeout,
/// so idle clients cannot pin connection slots forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&hostile_config(), &upstream, &db).await;
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"GET /payments HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 201"));
    // Now idle: the server must hang up within a few header timeouts (1 s here).
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection was closed");
    proxy.stop().await;
}
