//! What an operator sees and does: metrics, health, the admin API, retention.

use crate::support;

use std::time::Duration;

use idemproxy::store::{
    Completion, Fence, Fenced, KeyStore, Maintenance, Reservation, ReserveRequest, StoredResponse,
};
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// What Prometheus sends when it scrapes.
const OPENMETRICS: &[(&str, &str)] = &[(
    "accept",
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
)];

/// Parses Prometheus/OpenMetrics text into (series, value), failing on any malformed line.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            assert!(
                line.is_empty()
                    || line.starts_with("# HELP ")
                    || line.starts_with("# TYPE ")
                    || line.starts_with("# UNIT ")
                    || line == "# EOF",
                "bad comment line: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels: {line}");
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        samples.push((series.to_owned(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .map_or(0.0, |(_, v)| *v)
}

/// Counters move as the seed's scenarios run, and the text parses as exposition format.
async fn metrics_count_outcomes(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let (a, b) = tokio::join!(
        client.post("/payments", "shop-1", "m", BODY),
        client.post("/payments", "shop-1", "m", BODY)
    );
    assert_eq!(a.status.as_u16() + b.status.as_u16(), 201 + 409);
    client.post("/payments", "shop-1", "m", BODY).await;
    client
        .post("/payments", "shop-1", "m", &BODY.replace("100", "500"))
        .await;
    client.send("GET", "/payments", &[], "").await;
    client
        .send("POST", "/payments", &[("x-client-id", "shop-1")], BODY)
        .await;

    let admin = TestClient::at(proxy.admin);
    let reply = admin.send("GET", "/metrics", OPENMETRICS, "").await;
    assert_eq!(reply.status, 200);
    assert!(
        reply.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let samples = parse_exposition(std::str::from_utf8(&reply.body).unwrap());
    let count = |outcome: &str, route: &str| {
        ["2xx", "4xx", "5xx"]
            .iter()
            .map(|class| {
                sample(
                    &samples,
                    &format!(
                        "idemproxy_requests_total{{route=\"{route}\",outcome=\"{outcome}\",status_class=\"{class}\"}}"
                    ),
                )
            })
            .sum::<f64>()
    };
    let in_class = |outcome: &str, class: &str| {
        sample(
            &samples,
            &format!(
                "idemproxy_requests_total{{route=\"create-payment\",outcome=\"{outcome}\",status_class=\"{class}\"}}"
            ),
        )
    };
    assert_eq!(in_class("executed", "2xx"), 1.0);
    assert_eq!(in_class("conflict", "4xx"), 1.0);
    assert_eq!(count("executed", "create-payment"), 1.0);
    assert_eq!(count("conflict", "create-payment"), 1.0);
    assert_eq!(count("replayed", "create-payment"), 1.0);
    assert_eq!(count("mismatch", "create-payment"), 1.0);
    assert_eq!(count("rejected", "create-payment"), 1.0);
    assert_eq!(count("passed_through", "-"), 1.0);
    assert_eq!(
        sample(
            &samples,
            "idemproxy_store_duration_seconds_count{op=\"reserve\"}"
        ),
        4.0
    );
    assert_eq!(
        sample(
            &samples,
            "idemproxy_upstream_duration_seconds_count{route=\"create-payment\"}"
        ),
        1.0
    );
    // Group commit's counters: every reservation and the completion went in a batch.
    let batches = sample(&samples, "idemproxy_store_batches_total");
    let writes = sample(&samples, "idemproxy_store_batched_writes_total");
    assert!(
        writes >= 5.0,
        "4 reservations and a completion, {writes} batched"
    );
    assert!(
        (1.0..=writes).contains(&batches),
        "{batches} batches for {writes} writes"
    );
    proxy.stop().await;
}

/// Every series an alert rule names exists from the start, at zero, for each configured
/// route; `build_info` names the version; latency buckets reach past the upstream timeout
/// (10 s in `PAYMENTS`), so a request held for all of it is not only in `+Inf`; the pool
/// gauges are there on both stores.
async fn metrics_exist_from_the_start(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let reply = TestClient::at(proxy.admin)
        .send("GET", "/metrics", OPENMETRICS, "")
        .await;
    let samples = parse_exposition(std::str::from_utf8(&reply.body).unwrap());
    let has = |series: &str| samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v);
    for series in [
        "idemproxy_store_errors_total{op=\"reserve\"}",
        "idemproxy_store_errors_total{op=\"complete\"}",
        "idemproxy_upstream_errors_total{kind=\"timeout\"}",
        "idemproxy_upstream_errors_total{kind=\"not_sent\"}",
        "idemproxy_connection_errors_total{kind=\"header_timeout\"}",
        "idemproxy_fenced_off_completions_total{route=\"create-payment\"}",
        "idemproxy_takeovers_total{route=\"orders\"}",
        "idemproxy_leases_lost_total{route=\"create-payment\"}",
        "idemproxy_unresolved_keys{route=\"create-payment\"}",
        "idemproxy_reconciled_total{route=\"create-payment\",outcome=\"inconclusive\"}",
        "idemproxy_requests_total{route=\"create-payment\",outcome=\"store_error\",status_class=\"5xx\"}",
        "idemproxy_requests_total{route=\"orders\",outcome=\"executed\",status_class=\"2xx\"}",
        "idemproxy_lease_renewal_errors_total",
        "idemproxy_completions_abandoned_total",
    ] {
        assert_eq!(has(series), Some(0.0), "{series} at zero from the start");
    }
    assert_eq!(
        has(&format!(
            "idemproxy_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        Some(1.0)
    );
    for gauge in [
        "idemproxy_pool_connections",
        "idemproxy_pool_available",
        "idemproxy_pool_waiting",
        "idemproxy_store_batches_total",
        "idemproxy_store_batched_writes_total",
    ] {
        assert!(has(gauge).is_some(), "{gauge} on this store");
    }
    // Upstream latency buckets go past its timeout; request buckets past twice that.
    let client = TestClient::new(&proxy);
    assert_eq!(
        client.post("/payments", "shop-1", "b", BODY).await.status,
        201
    );
    let reply = TestClient::at(proxy.admin)
        .send("GET", "/metrics", OPENMETRICS, "")
        .await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let top = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.contains("+Inf"))
            .filter_map(|l| {
                l.split("le=\"")
                    .nth(1)?
                    .split('"')
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .fold(0.0, f64::max)
    };
    assert!(
        top("idemproxy_upstream_duration_seconds_bucket") >= 10.0,
        "{text}"
    );
    assert!(
        top("idemproxy_request_duration_seconds_bucket") >= 20.0,
        "{text}"
    );
    proxy.stop().await;
}

/// Health is up; readiness follows the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(
        &PAYMENTS.replace("{store}", &pg_store_yaml(&url)),
        &upstream,
        &db,
    )
    .await;
    let admin = TestClient::at(proxy.admin);
    assert_eq!(admin.send("GET", "/healthz", &[], "").await.status, 200);
    assert_eq!(admin.send("GET", "/readyz", &[], "").await.status, 200);
    relay.cut();
    let down = admin.send("GET", "/readyz", &[], "").await;
    assert_eq!(down.status, 503);
    assert!(down.is_problem());
    assert_eq!(
        admin.send("GET", "/healthz", &[], "").await.status,
        200,
        "the process is still up"
    );
    relay.restore();
    let back = eventually(Duration::from_secs(10), || {
        let admin = admin.clone();
        async move { (admin.send("GET", "/readyz", &[], "").await.status == 200).then_some(()) }
    })
    .await;
    assert!(back.is_some());
    proxy.stop().await;
}

/// The admin API looks a key up, lists stuck keys and evicts them; an evicted key executes
/// afresh. With a token configured, it is required.
async fn admin_api(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!("admin_token: s3cret\n{PAYMENTS}");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let admin = TestClient::at(proxy.admin);
    let auth = [("authorization", "Bearer s3cret")];

    assert_eq!(
        client.post("/payments", "shop/1", "k:1", BODY).await.status,
        201
    );
    let denied = admin
        .send("GET", "/admin/keys/shop%2F1/k%3A1", &[], "")
        .await;
    assert_eq!(denied.status, 401);
    assert!(denied.is_problem());
    let wrong = admin
        .send(
            "GET",
            "/admin/keys/shop%2F1/k%3A1",
            &[("authorization", "Bearer nope")],
            "",
        )
        .await;
    assert_eq!(wrong.status, 401);

    let found = admin
        .send("GET", "/admin/keys/shop%2F1/k%3A1", &auth, "")
        .await;
    assert_eq!(found.status, 200, "{found:?}");
    let v = found.json();
    assert_eq!(v["status"], "done");
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["response_status"], 201);
    assert_eq!(v["route"], "create-payment");
    assert_eq!(v["fingerprint"].as_str().unwrap().len(), 64);
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        admin
            .send("GET", "/admin/keys/shop%2F1/nope", &auth, "")
            .await
            .status,
        404
    );

    // An abandoned reservation shows up as stuck, and evicting it frees the key.
    let store = db.store();
    let fp = [9u8; 32];
    let req = ReserveRequest {
        client_id: "shop-1",
        key: "stuck",
        fingerprint: &fp,
        route: "create-payment",
        lease: Duration::from_millis(1),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    };
    assert!(matches!(
        store.reserve(&req).await.unwrap(),
        Reservation::Reserved(_)
    ));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let stuck = admin.send("GET", "/admin/stuck?limit=10", &auth, "").await;
    assert_eq!(stuck.status, 200);
    let keys = stuck.json()["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["key"], "stuck");
    assert_eq!(keys[0]["lease_expired"], true);

    let evicted = admin
        .send("DELETE", "/admin/keys/shop-1/stuck", &auth, "")
        .await;
    assert_eq!(evicted.status, 200);
    assert_eq!(
        admin
            .send("DELETE", "/admin/keys/shop-1/stuck", &auth, "")
            .await
            .status,
        404
    );
    let fresh = client.post("/payments", "shop-1", "stuck", BODY).await;
    assert_eq!(
        fresh.status, 201,
        "a different body is fine after eviction: {fresh:?}"
    );
    assert!(!fresh.replayed());
    assert_eq!(
        admin.send("GET", "/healthz", &[], "").await.status,
        200,
        "health needs no token"
    );
    proxy.stop().await;
}

/// `idemproxy sweep` deletes completed keys past their retention and keeps the rest;
/// an unresolved key (lease run out, never completed) is kept until
/// `sweep.unresolved_retention` bounds it, and then its deletion is logged.
async fn sweep_command(db: Backend) {
    let store = db.store();
    let fp = [3u8; 32];
    let reserve = |key, lease, retention| ReserveRequest {
        client_id: "c",
        key,
        fingerprint: &fp,
        route: "r",
        lease,
        retention,
        takeover: true,
        derived_key: None,
    };
    let ms = Duration::from_millis(1);
    let hour = Duration::from_secs(3600);
    for (key, retention) in [("old", ms), ("new", hour)] {
        let Reservation::Reserved(lease) = store
            .reserve(&reserve(key, Duration::from_secs(30), retention))
            .await
            .unwrap()
        else {
            panic!("reserved")
        };
        let fence = Fence {
            client_id: "c".into(),
            key: key.into(),
            token: lease.token,
            notify: false,
            retention,
        };
        let done = Completion::Stored(StoredResponse::clear(201, Default::default(), "x".into()));
        assert_eq!(
            store.complete(&fence, &done).await.unwrap(),
            Fenced::Applied
        );
    }
    assert!(matches!(
        store.reserve(&reserve("unresolved", ms, ms)).await.unwrap(),
        Reservation::Reserved(_)
    ));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let dir = TempDir::new("sweep");
    let sweep = |yaml: String| {
        let config = dir.join("sweep.yaml");
        std::fs::write(&config, yaml).unwrap();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
                .args(["sweep", "--config"])
                .arg(&config)
                .env_remove("DATABASE_URL")
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            (
                String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (deleted, _) = sweep(db.store_yaml()).await;
    assert_eq!(deleted, "deleted 1 expired keys");
    assert!(db.lookup("c", "old").await.is_none());
    assert!(db.lookup("c", "new").await.is_some());
    assert!(
        db.lookup("c", "unresolved").await.is_some(),
        "an unresolved key is never swept silently"
    );
    let bounded = format!(
        "upstream:\n  url: http://127.0.0.1:9\nsweep:\n  unresolved_retention: 10ms\n{}",
        db.store_yaml()
    );
    let (deleted, log) = sweep(bounded).await;
    assert_eq!(deleted, "deleted 1 expired keys");
    assert!(db.lookup("c", "unresolved").await.is_none());
    assert!(db.lookup("c", "new").await.is_some());
    assert!(log.contains("unresolved key deleted"), "{log}");
}

/// Retention counts from the completion: a request slower than `retention - lease` still
/// replays after a sweep that runs within `retention` of its completion (counted from the
/// reservation it would already be gone), and is swept once that has passed.
async fn retention_counts_from_completion(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(2_500),
        ..Default::default()
    })
    .await;
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n  retention: 4s\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let started = std::time::Instant::now();
    let first = client.post("/payments", "shop-1", "slow", BODY).await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    tokio::time::sleep(Duration::from_millis(4_500).saturating_sub(started.elapsed())).await;
    assert_eq!(
        db.store().sweep(100).await.unwrap(),
        0,
        "swept 4 s after the reservation"
    );
    let replay = client.post("/payments", "shop-1", "slow", BODY).await;
    assert_eq!((replay.status.as_u16(), replay.replayed()), (201, true));
    tokio::time::sleep(Duration::from_millis(7_000).saturating_sub(started.elapsed())).await;
    assert_eq!(
        db.store().sweep(100).await.unwrap(),
        1,
        "kept past its retention"
    );
    let again = client.post("/payments", "shop-1", "slow", BODY).await;
    assert_eq!((again.status.as_u16(), again.replayed()), (201, false));
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

/// The background sweep removes completed keys once their retention has passed.
async fn background_sweep(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!(
        "sweep:\n  interval: 200ms\n{}",
        PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n  retention: 4s\n")
    );
    // The proxy's own background loops sweep (`sweep.interval: 200ms`), as `serve`'s do.
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client
            .post("/payments", "shop-1", "short-lived", BODY)
            .await
            .status,
        201
    );
    assert!(db.lookup("shop-1", "short-lived").await.is_some());
    let gone = eventually(Duration::from_secs(15), || async {
        db.lookup("shop-1", "short-lived")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "swept after its retention");
    assert!(
        proxy
            .metrics
            .render()
            .contains("idemproxy_swept_rows_total 1")
    );
    proxy.stop().await;
}

/// The `Bearer` scheme is case-insensitive; a method an endpoint does not take gets `405`
/// with the methods it does take in `Allow`, as a problem.
async fn admin_methods_and_schemes(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!("admin_token: s3cret\n{PAYMENTS}");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let admin = TestClient::at(proxy.admin);
    for scheme in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret "] {
        let stuck = admin
            .send("GET", "/admin/stuck", &[("authorization", scheme)], "")
            .await;
        assert_eq!(stuck.status, 200, "{scheme}: {stuck:?}");
    }
    let auth = [("authorization", "Bearer s3cret")];
    for (method, path, allow) in [
        ("POST", "/healthz", "GET"),
        ("DELETE", "/metrics", "GET"),
        ("POST", "/admin/stuck", "GET"),
        ("PUT", "/admin/keys/shop-1/k", "GET, DELETE"),
        ("GET", "/admin/keys/shop-1/k/resolve", "POST"),
    ] {
        let reply = admin.send(method, path, &auth, "").await;
        assert_eq!(reply.status, 405, "{method} {path}: {reply:?}");
        assert!(reply.is_problem());
        assert_eq!(reply.headers["allow"], allow, "{method} {path}");
    }
    proxy.stop().await;
}

/// The request log says what each protected request was answered, and why a rejected
/// one was rejected, at `info`.
async fn request_log_lines(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let client = client_for(proxy.addr);
    assert_eq!(
        client
            .post("/payments", "shop-1", "log-1", BODY)
            .await
            .status,
        201
    );
    let missing = client
        .send("POST", "/payments", &[("x-client-id", "shop-1")], BODY)
        .await;
    assert_eq!(missing.status, 400);
    // The README's recipe: SHA-256 over the client id's length (8 bytes, big-endian), the
    // client id and the key; the first 12 hex characters.
    let recipe: String = {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(("shop-1".len() as u64).to_be_bytes());
        h.update(b"shop-1");
        h.update(b"log-1");
        h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    assert_eq!(recipe, idemproxy::key::key_hash("shop-1", "log-1"));
    let logged = eventually(Duration::from_secs(30), || async {
        let log = proxy.log_text();
        let protected = log.lines().any(|l| {
            l.contains("protected request")
                && l.contains("status=201")
                && l.contains(&format!("key={recipe}"))
        });
        let rejected = log.lines().any(|l| {
            l.contains("INFO")
                && l.contains("request rejected")
                && l.contains("status=400")
                && l.contains("idempotency key")
        });
        (protected && rejected).then_some(())
    })
    .await;
    assert!(logged.is_some(), "{}", proxy.log_text());
}

/// `--log-format json`: one JSON object per line, every field at the top level — the
/// spans' too, so a key's detached work carries `key` where `jq` looks — and work a
/// client left behind is logged with how it ended.
async fn json_log_lines(db: Backend) {
    use tokio::io::AsyncWriteExt;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(700),
        ..Default::default()
    })
    .await;
    let proxy = ProxyProcess::spawn_with(PAYMENTS, &upstream, &db, &["--log-format", "json"]).await;
    let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: left\r\nx-client-id: shop-1\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    raw.write_all(request.as_bytes()).await.unwrap();
    let started = eventually(Duration::from_secs(10), || async {
        (upstream.executions() == 1).then_some(())
    })
    .await;
    assert!(started.is_some(), "{}", proxy.log_text());
    drop(raw);
    let hash = idemproxy::key::key_hash("shop-1", "left");
    let line = eventually(Duration::from_secs(10), || async {
        proxy.log_text().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["message"]
                .as_str()?
                .starts_with("finished after the client left"))
            .then_some(v)
        })
    })
    .await;
    let Some(line) = line else {
        panic!("no line for the work left behind:\n{}", proxy.log_text())
    };
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(
        line["key"],
        hash.as_str(),
        "the span's field at the top level: {line}"
    );
    assert_eq!(line["route"], "create-payment", "{line}");
    assert_eq!(line["status"], 201, "{line}");
    assert_eq!(line["outcome"], "executed", "{line}");
    let log = proxy.log_text();
    for l in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        for field in ["timestamp", "level", "target", "message"] {
            assert!(v[field].is_string(), "{field} in {l}");
        }
        assert!(
            v.get("fields").is_none() && v.get("spans").is_none(),
            "flat: {l}"
        );
    }
}

/// With `client_id: { authorization: sha256 }` the client id is the SHA-256 (hex) of the
/// whole `Authorization` value, and the admin API finds a key under it — the README's
/// `printf '%s' 'Bearer …' | sha256sum` recipe.
async fn admin_paths_for_hashed_credentials(db: Backend) {
    use sha2::Digest;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = format!("admin_token: s3cret\n{PAYMENTS}").replace(
        "client_id:\n  header: X-Client-Id",
        "client_id:\n  authorization: sha256",
    );
    assert!(yaml.contains("authorization: sha256"));
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let credential = "Bearer sk_live_51H";
    let headers = [
        ("content-type", "application/json"),
        ("idempotency-key", "order-7"),
        ("authorization", credential),
    ];
    let first = client.send("POST", "/payments", &headers, BODY).await;
    assert_eq!(first.status, 201, "{first:?}");
    let client_id: String = sha2::Sha256::digest(credential.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let admin = TestClient::at(proxy.admin);
    let auth = [("authorization", "Bearer s3cret")];
    let found = admin
        .send(
            "GET",
            &format!("/admin/keys/{client_id}/order-7"),
            &auth,
            "",
        )
        .await;
    assert_eq!(found.status, 200, "{found:?}");
    assert_eq!(found.json()["status"], "done", "{found:?}");
    proxy.stop().await;
}

on_every_store!(
    metrics_exist_from_the_start,
    admin_paths_for_hashed_credentials,
    json_log_lines,
    request_log_lines,
    admin_methods_and_schemes,
    retention_counts_from_completion,
    metrics_count_outcomes,
    admin_api,
    sweep_command,
    background_sweep
);

/// A fatal start-up error is said in the log's own format: one JSON line when the logs
/// are JSON.
#[test]
fn fatal_start_up_errors_are_json_too() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args([
            "serve",
            "--log-format",
            "json",
            "--config",
            "/nonexistent/idemproxy.yaml",
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["level"], "ERROR", "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot read /nonexistent/idemproxy.yaml")),
        "{v}"
    );
}
