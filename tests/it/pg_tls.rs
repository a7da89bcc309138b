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
    let dir = TempDir::new("pg-tls-config");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\n{}",
            free_port(),
            free_port(),
            payments(&store_yaml(&wrong, &extra)).replace("{upstream}", &upstream.url())
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
    let stderr = String::from_utf8_lossy(&out.stderr);
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
