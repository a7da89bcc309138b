//! `idemproxy demo`: plays the seed article's scenarios end to end — a real idemproxy
//! process (this binary) in front of the demo provider — and prints what the article
//! prints, with the charge count after each step. It fails (non-zero exit) if a count
//! differs from the article's, so CI can run it as a check.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use super::provider;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One answer, printed the way the article prints it: `(status, body)` or `(status, title)`.
struct Printed {
    status: u16,
    body: serde_json::Value,
    replayed: bool,
}

impl std::fmt::Display for Printed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.body.get("title") {
            Some(title) => write!(f, "({}, {title})", self.status)?,
            None => write!(f, "({}, {})", self.status, self.body)?,
        }
        if self.replayed {
            write!(f, "  [Idempotent-Replayed]")?;
        }
        Ok(())
    }
}

struct Demo {
    http: HttpClient,
    exe: PathBuf,
    dir: PathBuf,
    provider: SocketAddr,
    run: String,
}

impl Demo {
    async fn pay(
        &self,
        proxy: SocketAddr,
        client: &str,
        key: &str,
        amount: u64,
    ) -> anyhow::Result<Printed> {
        let body = format!(
            r#"{{"amount":{amount},"currency":"RUB","recipient":"shop","purpose":"order"}}"#
        );
        let req = http::Request::post(format!("http://{proxy}/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("{key}-{}", self.run))
            .header("x-client-id", client)
            .body(Full::new(Bytes::from(body)))?;
        let resp = self.http.request(req).await.context("calling the proxy")?;
        let status = resp.status().as_u16();
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let bytes = resp.into_body().collect().await?.to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Ok(Printed {
            status,
            body,
            replayed,
        })
    }

    async fn charges(&self) -> anyhow::Result<u64> {
        let req = http::Request::get(format!("http://{}/charges", self.provider))
            .body(Full::new(Bytes::new()))?;
        let bytes = self
            .http
            .request(req)
            .await?
            .into_body()
            .collect()
            .await?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        v["charges"].as_u64().context("provider answer")
    }

    async fn start_proxy(&self) -> anyhow::Result<(Child, SocketAddr)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let config = self.dir.join("demo.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {addr}\nadmin_listen: 127.0.0.1:0\nupstream:\n  url: http://{}\n\
                 store:\n  embedded:\n    path: \"{}\"\n    timeout: 1s\n\
                 client_id:\n  header: X-Client-Id\ndefaults:\n  lease: 3s\n\
                 routes:\n  - name: create-payment\n    methods: [POST]\n    path: /payments\n    require_key: true\n\
                 \x20   fingerprint:\n      fields: [/amount, /currency, /recipient, /purpose]\n",
                self.provider,
                self.dir.join("keys.db").display()
            ),
        )?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("idemproxy.log"))?;
        let child = Command::new(&self.exe)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting idemproxy")?;
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok((child, addr));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "idemproxy did not start; see {}",
            self.dir.join("idemproxy.log").display()
        )
    }
}

/// Runs the demo; `Err` when an outcome differs from the article's.
pub async fn run() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let provider_addr = listener.local_addr()?;
    tokio::spawn(provider::run(listener, provider::CHARGE_TIME));
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let dir = std::env::temp_dir().join(format!("idemproxy-demo-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let demo = Demo {
        http: Client::builder(TokioExecutor::new()).build_http(),
        exe: std::env::current_exe()?,
        dir: dir.clone(),
        provider: provider_addr,
        run: stamp.to_string(),
    };
    let result = scenarios(&demo).await;
    if result.is_err() {
        eprintln!("(idemproxy's log: {})", log_path(&dir).display());
    }
    result
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("idemproxy.log")
}

async fn scenarios(demo: &Demo) -> anyhow::Result<()> {
    let (mut proxy, addr) = demo.start_proxy().await?;
    println!("idemproxy demo: the seed article's scenarios through a real idemproxy process");
    println!(
        "provider {} (charges in 300 ms, deduplicates by key), proxy {addr}\n",
        demo.provider
    );

    println!("two concurrent requests with one key:");
    let (a, b) = tokio::join!(
        demo.pay(addr, "shop-1", "order-1", 100),
        demo.pay(addr, "shop-1", "order-1", 100)
    );
    let (a, b) = (a?, b?);
    let (first, second) = if a.status == 409 { (a, b) } else { (b, a) };
    println!("  {first}\n  {second}");
    ensure!(
        first.status == 409 && second.status == 201,
        "expected one 409 and one 201"
    );
    let charge_id = second.body["charge_id"].clone();

    let after = demo.pay(addr, "shop-1", "order-1", 100).await?;
    println!("retry after:                    {after}");
    ensure!(
        after.replayed && after.body["charge_id"] == charge_id,
        "expected the stored answer"
    );
    let other = demo.pay(addr, "shop-1", "order-1", 500).await?;
    println!("another amount:                 {other}");
    ensure!(other.status == 422, "expected 422");
    let tenant = demo.pay(addr, "shop-2", "order-1", 100).await?;
    println!("the same key, another client:   {tenant}");
    ensure!(
        tenant.status == 201 && !tenant.replayed,
        "expected a new charge"
    );
    let charges = demo.charges().await?;
    println!("charges: {charges}\n");
    ensure!(
        charges == 2,
        "expected 2 charges (one per client), got {charges}"
    );

    println!("the proxy is killed (SIGKILL) while the provider charges:");
    let crash = {
        let (http, key, run) = (demo.http.clone(), "crash-1", demo.run.clone());
        tokio::spawn(async move {
            let req = http::Request::post(format!("http://{addr}/payments"))
                .header("content-type", "application/json")
                .header("idempotency-key", format!("{key}-{run}"))
                .header("x-client-id", "shop-1")
                .body(Full::new(Bytes::from_static(
                    br#"{"amount":100,"currency":"RUB","recipient":"shop","purpose":"order"}"#,
                )));
            match req {
                Ok(req) => http.request(req).await.is_ok(),
                Err(_) => false,
            }
        })
    };
    let mut waited = 0;
    while demo.charges().await? < 3 {
        ensure!(waited < 200, "the provider never received the payment");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    proxy.kill().await.context("killing idemproxy")?;
    let lost = !crash.await.unwrap_or(false);
    println!("  the client lost its connection: {lost}");
    let (mut proxy, addr) = demo.start_proxy().await?;
    let at_once = demo.pay(addr, "shop-1", "crash-1", 100).await?;
    println!("retry at once:                  {at_once}");
    ensure!(
        at_once.status == 409,
        "expected 409 while the dead worker's lease holds"
    );
    let mut later = demo.pay(addr, "shop-1", "crash-1", 100).await?;
    for _ in 0..40 {
        if later.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        later = demo.pay(addr, "shop-1", "crash-1", 100).await?;
    }
    println!("retry after the lease:          {later}");
    ensure!(later.status == 201, "expected the takeover to answer 201");
    let charges = demo.charges().await?;
    println!(
        "charges: {charges} (the interrupted payment was charged once: the derived key reached the provider again)"
    );
    ensure!(charges == 3, "expected 3 charges in all, got {charges}");
    let _ = proxy.kill().await;
    Ok(())
}
