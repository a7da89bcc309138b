//! TLS to PostgreSQL, against a throwaway cluster that accepts only TLS connections
//! (`hostssl` lines alone in `pg_hba.conf`) with a certificate from a private CA made
//! here: each `sslmode` does what libpq's does, a certificate that does not verify is
//! refused at start naming the host, a plain connection fails closed, and a client
//! certificate authenticates.

use crate::support;

use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use support::cluster::Cluster;
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// A CA, a server certificate for 127.0.0.1 signed by it, a client certificate for the
/// database user `certuser`, and a second CA that signed nothing here.
struct Pki {
    dir: TempDir,
    server_pem: String,
    server_key: String,
    ca_pem: String,
}

impl Pki {
    fn new() -> Self {
        let dir = TempDir::new("pg-pki");
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let (ca, other) = (ca("idemproxy test CA"), ca("another CA"));
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("other-ca.pem"), other.pem()).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&server_key, &ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "certuser");
        let client = client.signed_by(&client_key, &ca).unwrap();
        std::fs::write(dir.join("client.pem"), client.pem()).unwrap();
        std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();
        Pki {
            server_pem: server.pem(),
            server_key: server_key.serialize_pem(),
            ca_pem: ca.pem(),
            dir,
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

/// A cluster that takes TLS connections only: `certuser` by client certificate, every
/// other user by trust. The schema is migrated.
fn tls_cluster(pki: &Pki) -> Cluster {
    let cluster = Cluster::init(
        "tls",
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n",
        "hostssl all certuser 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 trust\n",
    );
    cluster.put_file("server.crt", pki.server_pem.as_bytes());
    cluster.put_file("server.key", pki.server_key.as_bytes());
    cluster.put_file("root.crt", pki.ca_pem.as_bytes());
    cluster.start();
    cluster.psql("postgres", "CREATE ROLE certuser LOGIN");
    cluster.psql("postgres", "CREATE DATABASE pay OWNER certuser");
    cluster
}

fn store_yaml(url: &str, extra: &str) -> String {
    format!("store:\n  postgres:\n    url: \"{url}\"\n    timeout: 2s\n    pool_size: 2\n{extra}")
}

async fn migrate_over(url: &str, extra: &str) {
    migrate_store(&store_yaml(url, extra)).await;
}

fn payments(store: &str) -> String {
    PAYMENTS.replace("{store}", store)
}

/// `verify-full` (from the URL) and `require` both work, and replays are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_and_require_work() {
    let pki = Pki::new();
    let cluster = tls_cluster(&pki);
    let full = cluster.url(
        "postgres",
        "pay",
        &format!("sslmode=verify-full&sslrootcert={}", pki.path("ca.pem")),
    );
    migrate_over(&full, "").await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    for (i, url) in [full, cluster.url("postgres", "pay", "sslmode=require")]
        .iter()
        .enumerate()
    {
        let proxy = TestProxy::spawn(&payments(&store_yaml(url, "")), &upstream, &dummy).await;
        let client = TestClient::new(&proxy);
        let key = format!("tls-{i}");
        let first = client.post("/payments", "shop-1", &key, BODY).await;
        assert_eq!(first.status, 201, "{url}: {first:?}");
        let again = client.post("/payments", "shop-1", &key, BODY).await;
        assert!(again.replayed(), "{url}");
        assert_eq!(again.body, first.body);
        proxy.stop().await;
    }
    assert_eq!(upstream.executions(), 2);
}

/// A server certificate from another CA is refused: `serve` does not start, naming the
/// host and the reason; an in-process store answers `503` and forwards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_verify_is_refused() {
    let pki = Pki::new();
    let cluster = tls_cluster(&pki);
    let wrong = cluster.url("postgres", "pay", "sslmode=verify-full");
    let extra = format!("    sslrootcert: \"{}\"\n", pki.path("other-ca.pem"));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let stderr = serve_refuses(&payments(&store_yaml(&wrong, &extra)), &upstream).await;
    assert!(
        stderr.contains("127.0.0.1") && stderr.contains("certificate"),
        "{stderr}"
    );

    let dummy = Backend::embedded();
    let proxy = TestProxy::spawn(&payments(&store_yaml(&wrong, &extra)), &upstream, &dummy).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(upstream.executions(), 0, "nothing forwarded");
    proxy.stop().await;
}

/// A plain connection to a TLS-only server fails closed: `503`, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_connection_fails_closed() {
    let pki = Pki::new();
    let cluster = tls_cluster(&pki);
    let plain = cluster.url("postgres", "pay", "sslmode=disable");
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    let proxy = TestProxy::spawn(&payments(&store_yaml(&plain, "")), &upstream, &dummy).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(upstream.executions(), 0);
    assert!(
        cluster.log().contains("no encryption"),
        "the server refused the plain connection: {}",
        cluster.log()
    );
    proxy.stop().await;
}

/// A client certificate (given in the YAML section) authenticates `certuser`, whose only
/// `pg_hba.conf` line is `cert`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_authenticates() {
    let pki = Pki::new();
    let cluster = tls_cluster(&pki);
    let url = cluster.url("certuser", "pay", "");
    let extra = format!(
        "    sslmode: verify-full\n    sslrootcert: \"{}\"\n    sslcert: \"{}\"\n    sslkey: \"{}\"\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    migrate_over(&url, &extra).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    let proxy = TestProxy::spawn(&payments(&store_yaml(&url, &extra)), &upstream, &dummy).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "cert", BODY)
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(
        cluster
            .psql("pay", "SELECT count(*) FROM idempotency_keys")
            .trim()
            == "1"
    );
    // Without the certificate the same user cannot log in at all.
    let store = TestProxy::spawn(
        &payments(&store_yaml(
            &url,
            &format!(
                "    sslmode: verify-full\n    sslrootcert: \"{}\"\n",
                pki.path("ca.pem")
            ),
        )),
        &upstream,
        &dummy,
    )
    .await;
    let reply = TestClient::new(&store)
        .post("/payments", "shop-1", "nocert", BODY)
        .await;
    assert_eq!(reply.status, 503);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
    store.stop().await;
}

/// A self-signed X.509 v1 certificate for 127.0.0.1 (`openssl x509 -req` adds no
/// extensions, so no version 3: what Citus generates and older hand-made setups have), in
/// `dir` as `v1.crt` and `v1.key`.
fn v1_certificate(dir: &TempDir) -> (String, String) {
    let (crt, key, csr) = (dir.join("v1.crt"), dir.join("v1.key"), dir.join("v1.csr"));
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let s = |p: &std::path::Path| p.display().to_string();
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &s(&key),
        "-out",
        &s(&csr),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-days",
        "30",
        "-in",
        &s(&csr),
        "-signkey",
        &s(&key),
        "-out",
        &s(&crt),
    ]);
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &s(&crt)])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("Version: 1 (0x0)"),
        "not a v1 certificate"
    );
    (
        std::fs::read_to_string(crt).unwrap(),
        std::fs::read_to_string(key).unwrap(),
    )
}

/// A server whose certificate is X.509 v1: `require` and the default `prefer` connect over
/// TLS and serve, as psql does — on TLS 1.3 and on a server that offers at most TLS 1.2;
/// `verify-full` refuses at start, naming the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_x509_v1_certificate_is_accepted_where_libpq_accepts_it() {
    let dir = TempDir::new("pg-v1");
    let (crt, key) = v1_certificate(&dir);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    for (i, max) in ["", "ssl_max_protocol_version = 'TLSv1.2'\n"]
        .iter()
        .enumerate()
    {
        // TLS only: a connection that fell back to plain would be refused.
        let cluster = Cluster::init(
            "v1",
            &format!("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n{max}"),
            "hostssl all all 127.0.0.1/32 trust\n",
        );
        cluster.put_file("server.crt", crt.as_bytes());
        cluster.put_file("server.key", key.as_bytes());
        cluster.start();
        let require = cluster.url("postgres", "postgres", "sslmode=require");
        migrate_over(&require, "").await;
        for url in [require, cluster.url("postgres", "postgres", "")] {
            let proxy = TestProxy::spawn(&payments(&store_yaml(&url, "")), &upstream, &dummy).await;
            let reply = TestClient::new(&proxy)
                .post("/payments", "shop-1", &format!("v1-{i}-{url}"), BODY)
                .await;
            assert_eq!(reply.status, 201, "{url} {max}: {reply:?}");
            proxy.stop().await;
        }
        assert_eq!(
            cluster
                .psql("postgres", "SELECT count(*) FROM idempotency_keys")
                .trim(),
            "2"
        );
    }
    assert_eq!(upstream.executions(), 4);

    let cluster = Cluster::init(
        "v1-full",
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        "hostssl all all 127.0.0.1/32 trust\n",
    );
    cluster.put_file("server.crt", crt.as_bytes());
    cluster.put_file("server.key", key.as_bytes());
    cluster.start();
    let full = cluster.url(
        "postgres",
        "postgres",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            dir.join("v1.crt").display()
        ),
    );
    let stderr = serve_refuses(&payments(&store_yaml(&full, "")), &upstream).await;
    assert!(stderr.contains("X.509 v1"), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", cluster.port)),
        "{stderr}"
    );
}

/// `prefer` falls back to a plain connection when the TLS handshake fails (here, a server
/// that offers at most TLS 1.1, which rustls refuses), as libpq documents; `require` does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_falls_back_to_plain_when_the_handshake_fails() {
    let pki = Pki::new();
    let cluster = Cluster::init(
        "tls11",
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_min_protocol_version = 'TLSv1'\nssl_max_protocol_version = 'TLSv1.1'\n",
        "host all all 127.0.0.1/32 trust\n",
    );
    cluster.put_file("server.crt", pki.server_pem.as_bytes());
    cluster.put_file("server.key", pki.server_key.as_bytes());
    cluster.start();
    let prefer = cluster.url("postgres", "postgres", "sslmode=prefer");
    migrate_over(&cluster.url("postgres", "postgres", "sslmode=disable"), "").await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dummy = Backend::embedded();
    let proxy = TestProxy::spawn(&payments(&store_yaml(&prefer, "")), &upstream, &dummy).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "prefer", BODY)
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
    proxy.stop().await;
    let require = cluster.url("postgres", "postgres", "sslmode=require");
    let proxy = TestProxy::spawn(&payments(&store_yaml(&require, "")), &upstream, &dummy).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "require", BODY)
        .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Runs `serve` on `config_yaml` and returns its stderr, asserting that it refused to start.
async fn serve_refuses(config_yaml: &str, upstream: &Upstream) -> String {
    let dir = TempDir::new("pg-tls-config");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\n{}",
            free_port(),
            free_port(),
            config_yaml.replace("{upstream}", &upstream.url())
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("serve should refuse to start")
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}
