//! HTTPS upstreams (private CA, mTLS) and TLS on the listener, with certificates made here;
//! and the protocols a plain listener speaks.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// A private CA with a server certificate for 127.0.0.1 and a client certificate, as files.
struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idemproxy-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        for (who, names) in [
            (
                "server",
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ),
            ("client", vec!["idemproxy".to_owned()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            std::fs::write(dir.join(format!("{who}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{who}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTPS upstream that counts executions and echoes what it saw; with `require_client`
/// it demands a client certificate from the private CA (mTLS).
async fn tls_upstream(pki: &Pki, require_client: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&pki.dir.join("ca.pem")) {
            roots.add(c).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(
            certs(&pki.dir.join("server.pem")),
            PrivateKeyDer::from_pem_file(pki.dir.join("server.key")).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, c) = (acceptor.clone(), Arc::clone(&c));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                    let proto = req.headers().get("x-forwarded-proto").cloned();
                    async move {
                        let body = format!(
                            r#"{{"charge_id":{n},"proto":{:?}}}"#,
                            proto.map(|p| p.to_str().unwrap().to_owned())
                        );
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .status(201)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, count)
}

fn https_config(addr: SocketAddr, tls: &str) -> String {
    PAYMENTS.replace(
        "  url: {upstream}\n",
        &format!("  url: https://{addr}\n{tls}"),
    )
}

/// An HTTPS upstream with a certificate from a private CA: trusted through `ca_file`, the
/// protected flow works end to end; without it, the certificate is refused, nothing is
/// sent, and the key is released (502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_with_private_ca() {
    let pki = Pki::new("ca");
    let db = Backend::embedded();
    let placeholder = Upstream::spawn(Behavior::default()).await;
    let (addr, count) = tls_upstream(&pki, false).await;

    let untrusted = TestProxy::spawn(&https_config(addr, ""), &placeholder, &db).await;
    let refused = TestClient::new(&untrusted)
        .post("/payments", "shop-1", "tls", BODY)
        .await;
    assert_eq!(refused.status, 502, "{refused:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    assert_eq!(db.rows().await, 0, "released: nothing was sent");
    untrusted.stop().await;

    let tls = format!("  tls:\n    ca_file: \"{}\"\n", pki.path("ca.pem"));
    let proxy = TestProxy::spawn(&https_config(addr, &tls), &placeholder, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", "tls", BODY).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = client.post("/payments", "shop-1", "tls", BODY).await;
    assert!(again.replayed());
    assert_eq!(count.load(Ordering::SeqCst), 1);
    proxy.stop().await;
}

/// mTLS to the provider: with the configured client certificate the call goes through;
/// without one the provider refuses the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_the_upstream() {
    let pki = Pki::new("mtls");
    let db = Backend::embedded();
    let placeholder = Upstream::spawn(Behavior::default()).await;
    let (addr, count) = tls_upstream(&pki, true).await;

    let no_cert = format!("  tls:\n    ca_file: \"{}\"\n", pki.path("ca.pem"));
    let anonymous = TestProxy::spawn(&https_config(addr, &no_cert), &placeholder, &db).await;
    let refused = TestClient::new(&anonymous)
        .post("/payments", "shop-1", "m", BODY)
        .await;
    assert!(refused.status.is_server_error(), "{refused:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    anonymous.stop().await;

    let with_cert = format!(
        "  tls:\n    ca_file: \"{}\"\n    client_cert: \"{}\"\n    client_key: \"{}\"\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let proxy = TestProxy::spawn(&https_config(addr, &with_cert), &placeholder, &db).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "m2", BODY)
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    proxy.stop().await;
}

/// TLS on the listener: HTTP/1.1 and HTTP/2 (by ALPN) clients are served, and the upstream
/// is told the client came over https.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_speaks_http1_and_http2() {
    let pki = Pki::new("listener");
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!(
        "tls:\n  cert_file: \"{}\"\n  key_file: \"{}\"\n{PAYMENTS}",
        pki.path("server.pem"),
        pki.path("server.key")
    );
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;

    let mut roots = rustls::RootCertStore::empty();
    for c in certs(&pki.dir.join("ca.pem")) {
        roots.add(c).unwrap();
    }
    for (alpn, key) in [(&b"http/1.1"[..], "h1"), (&b"h2"[..], "h2")] {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let tls = connector
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        let mut req = payment("https", proxy.addr, key);
        if key != "h2" {
            // HTTP/1.1 requires Host (RFC 9112 §3.2); hyper's connection-level client
            // sends only what it is given.
            let host = format!("127.0.0.1:{}", proxy.addr.port());
            req.headers_mut().insert("host", host.parse().unwrap());
        }
        let resp = if key == "h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            sender.send_request(req).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender.send_request(req).await.unwrap()
        };
        let version = resp.version();
        assert_eq!(resp.status(), 201);
        let _ = resp.into_body().collect().await.unwrap();
        assert_eq!(
            version,
            if key == "h2" {
                http::Version::HTTP_2
            } else {
                http::Version::HTTP_11
            }
        );
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|s| s.headers["x-forwarded-proto"] == "https")
    );
    proxy.stop().await;
}

/// A plain listener serves HTTP/2 with prior knowledge (told apart from HTTP/1 by the
/// preface, even when the preface arrives in pieces) and HTTP/1.1 on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_listener_speaks_http1_and_http2_prior_knowledge() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    for (key, split) in [("h2", false), ("h2-split", true)] {
        let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let io = SplitFirstWrite {
            inner: tcp,
            split,
            pause: None,
        };
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = payment("http", proxy.addr, key);
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 201, "{key}");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let _ = resp.into_body().collect().await.unwrap();
    }
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "h1", BODY)
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.headers["x-forwarded-proto"] == "http")
    );
    proxy.stop().await;
}

/// `POST /payments` with `BODY`, as client `shop-1` with key `key`, for a client built
/// by hand on `scheme` to `addr`.
fn payment(scheme: &str, addr: SocketAddr, key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("{scheme}://127.0.0.1:{}/payments", addr.port()))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-client-id", "shop-1")
        .body(Full::new(Bytes::from(BODY)))
        .unwrap()
}

/// A client transport that, when `split`, sends its first 10 bytes (a part of HTTP/2's
/// preface) and pauses 50 ms before it writes anything more.
struct SplitFirstWrite {
    inner: tokio::net::TcpStream,
    split: bool,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for SplitFirstWrite {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SplitFirstWrite {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Some(pause) = self.pause.as_mut() {
            std::task::ready!(pause.as_mut().poll(cx));
            self.pause = None;
        }
        if self.split {
            self.split = false;
            let part = &buf[..buf.len().min(10)];
            let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, part);
            self.pause = Some(Box::pin(tokio::time::sleep(
                std::time::Duration::from_millis(50),
            )));
            return polled;
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A listener certificate that cannot be read is a start-up error naming the key.
#[test]
fn broken_certificates_are_configuration_errors() {
    let err = idemproxy::config::load_str(
        "upstream:\n  url: http://127.0.0.1:1\ntls:\n  cert_file: /nonexistent.pem\n  key_file: /nonexistent.key\n",
        &idemproxy::config::Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tls: cannot read /nonexistent.pem"), "{err}");
    let err = idemproxy::config::load_str(
        "upstream:\n  url: https://127.0.0.1:1\n  tls:\n    ca_file: /nonexistent.pem\n",
        &idemproxy::config::Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("upstream.tls"), "{err}");
}
