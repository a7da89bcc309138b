//! Test harness, by what it provides: databases ([`db`]: a real PostgreSQL schema or an
//! embedded file per test), upstreams ([`upstream`]: a real HTTP server on an ephemeral
//! port that counts executions), proxies ([`proxies`]: the library's server in this
//! process, or the binary in its own), clients ([`clients`]), faults ([`relay`]: a cuttable
//! TCP relay; [`cluster`]: throwaway PostgreSQL clusters), stored bytes ([`at_rest`]), payment
//! APIs' providers ([`provider`]); and
//! here what many tests share (the usual configuration, polling with a budget).

pub mod at_rest;
pub mod citus;
pub mod clients;
pub mod cluster;
pub mod db;
pub mod h2raw;
pub mod provider;
pub mod proxies;
pub mod relay;
pub mod upstream;
pub mod volume;
pub mod webdriver;
pub mod wire;

pub use clients::*;
pub use db::*;
pub use proxies::*;
pub use relay::*;
pub use upstream::*;
pub use wire::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A directory of its own under the system's temporary directory, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "idemproxy-{label}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The usual configuration: one payments route with fingerprint fields, keys per client.
pub const PAYMENTS: &str = r#"
upstream:
  url: {upstream}
  timeout: 10s
{store}
client_id:
  header: X-Client-Id
defaults:
  lease: 30s
routes:
  - name: create-payment
    methods: [POST]
    path: /payments
    require_key: true
    fingerprint:
      fields: [/amount, /currency, /recipient, /purpose]
  - name: orders
    methods: [POST]
    path: /orders/*
    max_body: 1KiB
"#;

/// A payment body for `/payments` of [`PAYMENTS`].
pub const PAYMENT_BODY: &str =
    r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// The fingerprint `/payments` of [`PAYMENTS`] gives [`PAYMENT_BODY`].
pub fn payment_fingerprint() -> idemproxy::fingerprint::Fingerprint {
    let fields: Vec<String> = ["/amount", "/currency", "/recipient", "/purpose"]
        .map(String::from)
        .to_vec();
    idemproxy::fingerprint::fingerprint(&idemproxy::fingerprint::Request {
        method: "POST",
        path: "/payments",
        query: None,
        content_type: Some(b"application/json"),
        body: PAYMENT_BODY.as_bytes(),
        fields: Some(&fields),
    })
    .unwrap()
}

/// Polls `f` until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
