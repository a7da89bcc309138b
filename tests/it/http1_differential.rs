//! Differential testing of the proxy's HTTP/1 front against a second parser, hyper's.
//!
//! Valid requests are generated, then damaged byte by byte (CR, LF, space, tab, NUL,
//! obs-text, `;`, `,`, `:` insertions, deletions, case changes, duplicated lines), and sent
//! with a closing sentinel request after them, both through the proxy (to an upstream that
//! records what hyper parses from the bytes the proxy forwards) and straight into a hyper
//! server. Whatever the proxy forwards must be what hyper reads from the client's bytes:
//! no more messages, and each one the same method, target, fields and body. A
//! disagreement is how a request is smuggled past a gateway that parses like hyper.
//!
//! The case budget is `IDEMPROXY_DIFFERENTIAL_CASES` (256 by default, about 20 s here);
//! `IDEMPROXY_DIFFERENTIAL_CASES=200000` runs for about an hour (`docs/security.md`).

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as a parser read it, body complete.
#[derive(Debug, Clone, PartialEq)]
struct Parsed {
    method: String,
    target: String,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// Fields the proxy sets, strips or re-frames by design: not compared.
const NOT_COMPARED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
];

fn parsed(parts: &http::request::Parts, body: Bytes) -> Parsed {
    let named: Vec<String> = parts
        .headers
        .get_all("connection")
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|n| String::from_utf8_lossy(n).trim().to_ascii_lowercase())
        .collect();
    let fields = parts
        .headers
        .iter()
        .filter(|(n, _)| {
            !NOT_COMPARED.contains(&n.as_str()) && !named.iter().any(|c| c == n.as_str())
        })
        .map(|(n, v)| (n.as_str().to_owned(), trim(v.as_bytes()).to_vec()))
        .collect();
    Parsed {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        fields,
        body: body.to_vec(),
    }
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
}

/// A hyper HTTP/1 service recording every request whose body it read whole.
fn recorder(
    log: Arc<Mutex<Vec<Parsed>>>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Clone {
    service_fn(move |req: Request<Incoming>| {
        let log = Arc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            if let Ok(body) = body.collect().await {
                log.lock().unwrap().push(parsed(&parts, body.to_bytes()));
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

/// The upstream behind the proxy: hyper's HTTP/1 server, recording what it parses.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<Parsed>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let svc = recorder(Arc::clone(&log));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, log)
}

/// What hyper's server reads from `bytes` sent on one connection.
async fn hyper_reads(bytes: &[u8]) -> Vec<Parsed> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let serve = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(server), recorder(Arc::clone(&log)));
    let feed = async {
        let _ = client.write_all(bytes).await;
        // Answers are read and dropped so that the server never blocks on writing.
        let mut sink = Vec::new();
        let _ = client.read_to_end(&mut sink).await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(serve, feed) }).await;
    log.lock().unwrap().clone()
}

/// Sends `bytes` to the proxy on one connection and reads until it closes (or a second
/// passes with the connection still open: a body still waited for).
async fn through_proxy(proxy: SocketAddr, bytes: &[u8]) {
    let Ok(mut conn) = TcpStream::connect(proxy).await else {
        return;
    };
    let _ = conn.write_all(bytes).await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.read_to_end(&mut sink)).await;
}

/// A valid request, as bytes.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let method = prop::sample::select(vec!["GET", "POST", "PUT", "PATCH", "DELETE", "PURGE"]);
    let target =
        ("[a-z0-9._~%-]{0,8}", prop::option::of("[a-z0-9=&%]{0,10}")).prop_map(|(p, q)| match q {
            Some(q) => format!("/d/{p}?{q}"),
            None => format!("/d/{p}"),
        });
    let name = prop::sample::select(vec![
        "x-a",
        "x-b",
        "accept",
        "user-agent",
        "content-type",
        "x-client-id",
        "cookie",
    ]);
    let fields = prop::collection::vec((name, "[!-~]([ -~]{0,10}[!-~])?"), 0..5);
    let body = prop_oneof![
        Just(None),
        prop::collection::vec(any::<u8>(), 0..24).prop_map(|b| Some((
            false,
            vec![b],
            String::new()
        ))),
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 1..10), 0..4),
            prop::sample::select(vec!["", ";a", ";a=b", " ; a = \"q d\"", ";x;y=z"]),
        )
            .prop_map(|(chunks, ext)| Some((true, chunks, ext.to_owned()))),
    ];
    (method, target, any::<bool>(), fields, body).prop_map(
        |(method, target, http10, fields, body)| {
            let mut out = Vec::new();
            let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
            out.extend_from_slice(format!("{method} {target} {version}\r\n").as_bytes());
            if !http10 {
                out.extend_from_slice(b"Host: api.example:8080\r\n");
            }
            for (n, v) in fields {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            match body {
                None => out.extend_from_slice(b"\r\n"),
                Some((true, chunks, ext)) if !http10 => {
                    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    for c in chunks {
                        out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
                        out.extend_from_slice(&c);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
                }
                Some((_, chunks, _)) => {
                    let body: Vec<u8> = chunks.concat();
                    out.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    out.extend_from_slice(&body);
                }
            }
            out
        },
    )
}

/// A byte-level damage to a request.
#[derive(Debug, Clone)]
enum Damage {
    Insert(usize, u8),
    Delete(usize),
    Replace(usize, u8),
    FlipCase(usize),
    DuplicateLine(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    let byte = prop::sample::select(b"\r\n \t\0\x80\xff;,:\"=\x0b/a0".to_vec());
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(at, b)| Damage::Insert(at, b)),
        any::<usize>().prop_map(Damage::Delete),
        (any::<usize>(), byte).prop_map(|(at, b)| Damage::Replace(at, b)),
        any::<usize>().prop_map(Damage::FlipCase),
        any::<usize>().prop_map(Damage::DuplicateLine),
    ]
}

fn apply(bytes: &mut Vec<u8>, damage: &Damage) {
    if bytes.is_empty() {
        return;
    }
    let at = |i: usize| i % bytes.len();
    match *damage {
        Damage::Insert(i, b) => bytes.insert(at(i), b),
        Damage::Delete(i) => {
            bytes.remove(at(i));
        }
        Damage::Replace(i, b) => {
            let i = at(i);
            bytes[i] = b;
        }
        Damage::FlipCase(i) => {
            let i = at(i);
            bytes[i] = if bytes[i].is_ascii_lowercase() {
                bytes[i].to_ascii_uppercase()
            } else {
                bytes[i].to_ascii_lowercase()
            };
        }
        Damage::DuplicateLine(i) => {
            let starts: Vec<usize> = std::iter::once(0)
                .chain(
                    bytes
                        .windows(2)
                        .enumerate()
                        .filter(|(_, w)| *w == b"\r\n")
                        .map(|(j, _)| j + 2),
                )
                .collect();
            let start = starts[i % starts.len()];
            let end = bytes[start..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .map_or(bytes.len(), |j| start + j + 2);
            let line = bytes[start..end].to_vec();
            bytes.splice(end..end, line);
        }
    }
}

const SENTINEL: &[u8] = b"GET /d/sentinel HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n";

/// For valid requests and damaged ones: what the proxy forwards is what hyper reads.
#[test]
fn the_proxy_forwards_what_hyper_reads() {
    let cases = std::env::var("IDEMPROXY_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = Backend::embedded();
    let (proxy, forwarded, upstream) = rt.block_on(async {
        let (addr, forwarded) = recording_upstream().await;
        // The upstream URL is all TestProxy reads of the Upstream it is given.
        let upstream = Upstream::spawn(Behavior::default()).await;
        let yaml = PAYMENTS.replace("{upstream}", &format!("http://{addr}"));
        let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
        (proxy, forwarded, upstream)
    });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (request(), prop::collection::vec(damage(), 0..3));
    let result = runner.run(&strategy, |(request, damages)| {
        let mut bytes = request;
        for d in &damages {
            apply(&mut bytes, d);
        }
        bytes.extend_from_slice(SENTINEL);
        let (sent, read) = rt.block_on(async {
            let before = forwarded.lock().unwrap().len();
            through_proxy(proxy.addr, &bytes).await;
            // The upstream finishes recording what was forwarded.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let sent = forwarded.lock().unwrap()[before..].to_vec();
            (sent, hyper_reads(&bytes).await)
        });
        let shown = String::from_utf8_lossy(&bytes);
        // The proxy may answer a message itself (a refused path, a missing key) and go on
        // with the next, so what it forwards is a subsequence of what hyper reads.
        let mut theirs = read.iter();
        for ours in &sent {
            if !theirs.any(|t| t == ours) {
                return Err(TestCaseError::fail(format!(
                    "{shown:?}\nforwarded {ours:#?}\nnot in what hyper reads, in order: {read:#?}"
                )));
            }
        }
        Ok(())
    });
    rt.block_on(proxy.stop());
    drop(upstream);
    if let Err(e) = result {
        panic!("{e}");
    }
}
