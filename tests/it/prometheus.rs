//! What plugs into Prometheus and Grafana, checked against the real thing (Debian's
//! `prometheus` package, which ships `promtool`): the alerting rules pass `promtool check
//! rules` and their unit tests, a live `/metrics` passes `promtool check metrics`, every
//! query of the dashboard and the rules names a metric the proxy exports, and a real
//! Prometheus scraping a proxy sees the counters move and the fail-closed alert fire when
//! the store is cut.

use crate::support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// Runs a Prometheus tool; a missing one fails loudly (`.ci/run` installs them).
fn tool(name: &str) -> std::process::Command {
    let found = ["/usr/bin", "/usr/local/bin", "/usr/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not installed (apt-get install prometheus)"));
    std::process::Command::new(found)
}

fn ok(out: &std::process::Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn alert_rules_pass_promtool() {
    let dir = deploy("prometheus");
    ok(&tool("promtool")
        .args(["check", "rules", "alerts.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap());
    let tested = ok(&tool("promtool")
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap());
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The metric names a live proxy exports (classic text: a histogram's series too).
fn exported(text: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        names.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The `idemproxy_*` metric names a PromQL expression uses.
fn metrics_in(expr: &str) -> Vec<String> {
    expr.match_indices("idemproxy_")
        .map(|(at, _)| {
            expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(deploy("grafana/idemproxy.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        for target in panel["targets"].as_array().unwrap() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    queries
}

fn rule_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("prometheus/alerts.yaml")).unwrap();
    let rules: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_owned(),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A live `/metrics` (as `curl` and `promtool` read it: the classic text format) passes
/// `promtool check metrics`, and every metric the dashboard and the rules name exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_metrics_pass_promtool_and_every_query_names_one() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "p", BODY).await.status,
        201
    );
    let reply = TestClient::at(proxy.admin)
        .send("GET", "/metrics", &[], "")
        .await;
    assert!(
        reply.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    let mut check = tool("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = check.wait_with_output().unwrap();
    let said = ok(&out);
    assert!(said.trim().is_empty(), "promtool's lint: {said}");

    let names = exported(&text);
    let queries: Vec<String> = dashboard_queries()
        .into_iter()
        .chain(rule_queries().into_iter().map(|(_, e)| e))
        .collect();
    assert!(queries.len() >= 20, "{}", queries.len());
    for query in &queries {
        let used = metrics_in(query);
        assert!(!used.is_empty(), "{query}");
        for name in used {
            assert!(
                names.contains(&name),
                "`{name}` in `{query}` is not exported"
            );
        }
    }
    proxy.stop().await;
}

/// `GET /api/v1/query` on a Prometheus: the result vector.
async fn query(prometheus: &TestClient, promql: &str) -> Vec<serde_json::Value> {
    let encoded = percent_encoding::utf8_percent_encode(promql, percent_encoding::NON_ALPHANUMERIC);
    let reply = prometheus
        .send("GET", &format!("/api/v1/query?query={encoded}"), &[], "")
        .await;
    let v = reply.json();
    assert_eq!(v["status"], "success", "{promql}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// A real Prometheus scrapes a running proxy with the shipped rules loaded: the counters
/// move after requests, every dashboard query is valid PromQL it can run, and when the
/// store is cut the fail-closed alert's expression fires and the alert goes pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_and_the_store_alert_fires() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(
        &PAYMENTS.replace("{store}", &pg_store_yaml(&url)),
        &upstream,
        &db,
    )
    .await;
    let dir = TempDir::new("prometheus");
    let port = free_port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: idemproxy\n    static_configs:\n      - targets: ['{}']\n",
            deploy("prometheus/alerts.yaml").display(),
            proxy.admin
        ),
    )
    .unwrap();
    let _prometheus = tokio::process::Command::from(tool("prometheus"))
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=error")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let prometheus = TestClient::at(format!("127.0.0.1:{port}").parse().unwrap());
    let scraping = eventually(Duration::from_secs(30), || async {
        let up = prometheus.try_send("GET", "/-/ready", &[], "").await.ok()?;
        if up.status != 200 {
            return None;
        }
        let result = query(&prometheus, "up{job=\"idemproxy\"} == 1").await;
        (!result.is_empty()).then_some(())
    })
    .await;
    assert!(scraping.is_some(), "Prometheus never scraped the proxy");

    let client = TestClient::new(&proxy);
    for i in 0..3 {
        let key = format!("prom-{i}");
        assert_eq!(
            client.post("/payments", "shop-1", &key, BODY).await.status,
            201
        );
    }
    let moved = eventually(Duration::from_secs(15), || async {
        let r = query(
            &prometheus,
            "sum(idemproxy_requests_total{outcome=\"executed\",status_class=\"2xx\"}) >= 3",
        )
        .await;
        (!r.is_empty()).then_some(())
    })
    .await;
    assert!(
        moved.is_some(),
        "the executed counter never reached 3 in Prometheus"
    );
    for q in dashboard_queries() {
        query(
            &prometheus,
            &q.replace("$__rate_interval", "1m").replace("$job", ".*"),
        )
        .await;
    }

    let (_, failing_closed) = rule_queries()
        .into_iter()
        .find(|(name, _)| name == "IdemproxyFailingClosed")
        .unwrap();
    assert!(
        query(&prometheus, &failing_closed).await.is_empty(),
        "quiet while the store is up"
    );
    relay.cut();
    let fired = eventually(Duration::from_secs(30), || async {
        let reply = client.post("/payments", "shop-1", "while-cut", BODY).await;
        assert_eq!(reply.status, 503, "fail closed: {reply:?}");
        let expr = query(&prometheus, &failing_closed).await;
        let pending = query(
            &prometheus,
            "ALERTS{alertname=\"IdemproxyFailingClosed\",alertstate=\"pending\"}",
        )
        .await;
        (!expr.is_empty() && !pending.is_empty()).then_some(())
    })
    .await;
    assert!(fired.is_some(), "the fail-closed alert never went pending");
    assert_eq!(
        upstream.executions(),
        3,
        "nothing forwarded while the store was cut"
    );
    relay.restore();
    proxy.stop().await;
}
