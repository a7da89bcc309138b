//! The HTTP/2 side refuses what RFC 9113 §8.2.2 and §8.3.1 call malformed: connection-
//! specific fields, and a `Host` naming another authority than `:authority`. Client
//! libraries will not send such requests, so the frames are written by hand (HPACK
//! literals without indexing or Huffman coding), with prior knowledge on a plain socket.

use crate::support;

use std::time::Duration;

use support::h2raw::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How the server ended stream 1.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// A response head; the status when it is one of the static table's.
    Answered(Option<u16>),
    Reset(u32),
    GoAway(u32),
    Nothing,
}

/// Sends one GET with `fields` (after the pseudo-fields) on stream 1 and reads how the
/// server ends it.
async fn send(proxy: std::net::SocketAddr, fields: &[(&str, &str)]) -> Outcome {
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/orders/1"),
        (":authority", "api.example"),
    ]
    .iter()
    .chain(fields)
    {
        literal(&mut block, n, v);
    }
    let mut conn = TcpStream::connect(proxy).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x1 | 0x4, 1, &block));
    conn.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    let read = async {
        loop {
            while let Some((kind, flags, stream, payload)) = take_frame(&mut buf) {
                match kind {
                    0x4 if flags & 0x1 == 0 => {
                        conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                    }
                    0x1 if stream == 1 => {
                        // Static table indexes 8..=14 are :status 200, 204, 206, 304, 400, 404, 500.
                        let status = match payload.first() {
                            Some(b) if (0x88..=0x8e).contains(b) => {
                                Some([200, 204, 206, 304, 400, 404, 500][usize::from(b - 0x88)])
                            }
                            _ => None,
                        };
                        return Outcome::Answered(status);
                    }
                    0x3 if stream == 1 => {
                        return Outcome::Reset(u32::from_be_bytes(
                            payload[..4].try_into().unwrap(),
                        ));
                    }
                    0x7 => {
                        return Outcome::GoAway(u32::from_be_bytes(
                            payload[4..8].try_into().unwrap(),
                        ));
                    }
                    _ => {}
                }
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return Outcome::Nothing,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or(Outcome::Nothing)
}

/// Connection-specific fields (`connection`, `transfer-encoding`, `keep-alive`, `upgrade`,
/// `te` other than `trailers`) make a request malformed: hyper resets the stream with
/// PROTOCOL_ERROR, and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_specific_fields_are_refused() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    assert!(matches!(send(proxy.addr, &[]).await, Outcome::Answered(_)));
    assert_eq!(upstream.executions(), 1);
    for field in [
        ("connection", "close"),
        ("transfer-encoding", "chunked"),
        ("keep-alive", "timeout=5"),
        ("upgrade", "websocket"),
        ("te", "gzip"),
    ] {
        let outcome = send(proxy.addr, &[field]).await;
        assert!(
            matches!(outcome, Outcome::Reset(1) | Outcome::GoAway(1)),
            "{field:?}: {outcome:?}"
        );
    }
    assert_eq!(
        upstream.executions(),
        1,
        "nothing more reached the upstream"
    );
    proxy.stop().await;
}

/// A `Host` naming another authority than `:authority` is refused with `400`, as is a
/// second `Host`; a `Host` equal to `:authority` is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_must_agree_with_authority() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    assert!(matches!(
        send(proxy.addr, &[("host", "api.example")]).await,
        Outcome::Answered(_)
    ));
    assert_eq!(upstream.executions(), 1);
    for fields in [
        &[("host", "evil.example")][..],
        &[("host", "api.example"), ("host", "evil.example")],
    ] {
        let outcome = send(proxy.addr, fields).await;
        assert_eq!(outcome, Outcome::Answered(Some(400)), "{fields:?}");
    }
    assert_eq!(
        upstream.executions(),
        1,
        "nothing more reached the upstream"
    );
    proxy.stop().await;
}
