//! The official Stripe SDKs — stripe-node and stripe-python, installed by `.ci/run` into
//! `tests/sdk/` — each with its automatic retries, against a Stripe-shaped upstream behind
//! the proxy with `errors: stripe`: a timeout retried with the SDK's own key charges once
//! and returns the first answer; concurrent calls each charge once; the same key with
//! another amount raises the SDK's idempotency error class; a key in progress is retried by
//! the SDK and ends in the first answer; a `410` stops the SDK's retries.
//!
//! Why real SDKs: they decide what is a success from the body's shape, not the status
//! (stripe-node took a problem document for a successful charge), so only they can say
//! whether an error dialect is read right.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use support::*;

const CONFIG: &str = r#"
upstream:
  url: {upstream}
  timeout: 10s
{store}
client_id:
  authorization: sha256
defaults:
  lease: 30s
  errors: stripe
routes:
  - name: charges
    methods: [POST]
    path: /v1/charges
    require_key: true
  - name: big
    methods: [POST]
    path: /v1/big
    max_stored_response: 16B
"#;

fn sdk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk")
}

/// Runs one SDK's script against a fresh proxy and upstream; its results, and the upstream.
async fn run(program: PathBuf, script: &str) -> (serde_json::Value, Upstream) {
    assert!(
        program.exists() || program.components().count() == 1,
        "{} is missing: `.ci/run` installs the SDKs (npm install --prefix tests/sdk; python3 -m venv tests/sdk/.venv && tests/sdk/.venv/bin/pip install stripe)",
        program.display()
    );
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(1000),
        ..Default::default()
    })
    .await;
    let db = Backend::embedded();
    let proxy = TestProxy::spawn(CONFIG, &upstream, &db).await;
    let out = tokio::process::Command::new(&program)
        .arg(sdk_dir().join(script))
        .env("PROXY", proxy.addr.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the SDK script finished")
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Answers `409 in progress` that the SDK retried past (the timeout's and the
    // in-progress call's).
    let conflicts = metric(
        proxy.admin,
        "idemproxy_requests_total{route=\"charges\",outcome=\"conflict\",status_class=\"4xx\"}",
    )
    .await;
    proxy.stop().await;
    let results: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{script} printed no results ({e}): {stdout}"));
    assert!(
        conflicts >= 2.0,
        "{script}: {conflicts} answers in progress: {results}"
    );
    (results, upstream)
}

/// What both SDKs must show.
fn check(sdk: &str, r: &serde_json::Value, upstream: &Upstream) {
    // The timeout: the SDK retried (past `409`s, counted by `run`) and got the first
    // answer, charged once.
    assert!(
        r["timeout"]["charge"]["charge_id"].is_number(),
        "{sdk}: {r}"
    );
    // Five concurrent charges, five charges.
    let mut ids: Vec<i64> = r["concurrent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 5, "{sdk}: {r}");
    // The reused key: the idempotency error class, on a 400.
    assert_eq!(r["reused"]["status"], 400, "{sdk}: {r}");
    assert!(
        r["reused"]["class"]
            .as_str()
            .unwrap()
            .contains("IdempotencyError"),
        "{sdk}: {r}"
    );
    // The key in progress: both calls end in the first answer.
    assert_eq!(
        r["in_progress"]["first"], r["in_progress"]["second"],
        "{sdk}: {r}"
    );
    // The 410: one request, no retries.
    assert_eq!(r["gone"]["status"], 410, "{sdk}: {r}");
    assert_eq!(r["gone"]["requests"], 1, "{sdk}: {r}");
    // Charges: the timeout's one, five, the reused key's first, the in-progress one, and
    // the big one's first — each once.
    assert_eq!(upstream.executions(), 1 + 5 + 1 + 1 + 1, "{sdk}: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_node_reads_the_stripe_dialect() {
    let (results, upstream) = run(PathBuf::from("node"), "stripe_node.mjs").await;
    check("stripe-node", &results, &upstream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_python_reads_the_stripe_dialect() {
    let python = std::env::var_os("IDEMPROXY_SDK_PYTHON")
        .map_or_else(|| sdk_dir().join(".venv/bin/python"), PathBuf::from);
    let (results, upstream) = run(python, "stripe_python.py").await;
    check("stripe-python", &results, &upstream);
}
