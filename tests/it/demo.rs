//! The demo tells the seed's story, and its charge counts are the article's.

use crate::support;

use support::*;

/// `idemproxy demo` runs end to end (a real proxy process, SIGKILL included) and prints the
/// article's outcomes: one charge per client for the concurrent pair, the replay, 422 for
/// another amount, and one charge for the interrupted payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_plays_the_seed() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .arg("demo")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "(409, \"Request in progress\")",
        "retry after:                    (201, {\"amount\":100,\"charge_id\":1})  [Idempotent-Replayed]",
        "another amount:                 (422, \"Idempotency key already used\")",
        "the same key, another client:   (201, {\"amount\":100,\"charge_id\":2})",
        "charges: 2\n",
        "retry at once:                  (409, \"Request in progress\")",
        "retry after the lease:          (201, {\"amount\":100,\"charge_id\":3})",
        "charges: 3 ",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The image declares a volume for the embedded store, owned by its user, and every
/// example configuration's embedded store path lies in it (relative paths resolve against
/// the image's working directory, which is that volume).
#[test]
fn example_store_paths_live_in_the_image_volume() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let directive = |name: &str| {
        runtime
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in the runtime stage"))
            .to_owned()
    };
    let volume = directive("VOLUME ");
    let volume = volume.trim_matches(|c| c == '[' || c == ']' || c == '"');
    assert_eq!(
        directive("WORKDIR "),
        volume,
        "relative paths land in the volume"
    );
    let user = directive("USER ");
    assert!(user.starts_with("nonroot"), "{user}");
    assert!(
        runtime
            .lines()
            .any(|l| l.contains("--chown=65532:65532") && l.trim_end().ends_with(volume)),
        "the volume's directory is owned by the image's user (nonroot is 65532)"
    );
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("config")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let file = idemproxy::config::parse_file(&text).unwrap();
        let Some(embedded) = file.store.and_then(|s| s.embedded) else {
            continue;
        };
        let store = embedded.path.unwrap_or_else(|| "./idemproxy.db".into());
        let resolved = std::path::Path::new(volume).join(&store);
        let normal: std::path::PathBuf = resolved
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        assert!(
            normal.starts_with(volume) && !store.contains(".."),
            "{}: store path {store} is outside the image's volume {volume}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 2, "the embedded examples were found");
}

/// Every example configuration in `config/` is valid (`idemproxy check-config`).
#[test]
fn example_configs_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"));
            command
                .arg("check-config")
                .arg("--config")
                .arg(&path)
                .env("IDEMPROXY_ADMIN_TOKEN", "example");
            // PostgreSQL configurations take their URL from the environment, as deployed;
            // an embedded one next to DATABASE_URL would be refused as a conflict.
            if std::fs::read_to_string(&path)
                .unwrap()
                .contains("postgres:")
            {
                command.env(
                    "DATABASE_URL",
                    "postgres://postgres@127.0.0.1:5432/idemproxy",
                );
            } else {
                command.env_remove("DATABASE_URL");
            }
            let out = command.output().unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("routes:"));
            checked += 1;
        }
    }
    assert!(checked >= 3, "expected the three example configurations");
}

/// What docker-compose.yml runs works without Docker: `migrate` on an empty database
/// (twice: it is idempotent), the demo provider, and `probe` as the health check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_commands_work() {
    let db = TestDb::empty().await;
    for _ in 0..2 {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .arg("migrate")
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tables: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM idempotency_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);

    let port = free_port();
    let _provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["demo-provider", "--listen", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let probe = |url: String| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .args(["probe", &url])
            .output()
            .await
            .unwrap()
            .status
            .success()
    };
    let healthy = eventually(std::time::Duration::from_secs(10), || {
        let url = format!("http://127.0.0.1:{port}/charges");
        async move { probe(url).await.then_some(()) }
    })
    .await;
    assert!(healthy.is_some(), "the provider answers the health check");
    assert!(
        !probe(format!("http://127.0.0.1:{}/charges", free_port())).await,
        "a closed port is unhealthy"
    );
}

/// The demo provider can be told to fail or hang, and back to normal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_provider_fails_and_hangs_on_request() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(idemproxy::demo::provider::run(
        listener,
        std::time::Duration::ZERO,
    ));
    let client = TestClient::at(addr);
    let pay = |key: &'static str| {
        let client = client.clone();
        async move {
            client
                .send(
                    "POST",
                    "/payments",
                    &[("idempotency-key", key)],
                    r#"{"amount":1}"#,
                )
                .await
        }
    };
    assert_eq!(pay("a").await.status, 201);
    client
        .send("POST", "/control", &[], r#"{"mode":"fail"}"#)
        .await;
    assert_eq!(pay("b").await.status, 503);
    client
        .send("POST", "/control", &[], r#"{"mode":"hang"}"#)
        .await;
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), pay("c"))
            .await
            .is_err(),
        "hangs"
    );
    client
        .send("POST", "/control", &[], r#"{"mode":"normal"}"#)
        .await;
    assert_eq!(pay("d").await.status, 201);
    let charges = client.send("GET", "/charges", &[], "").await.json();
    assert_eq!(
        charges["charges"], 2,
        "failed and hung requests charged nothing"
    );
}

/// `check-config` on a broken file prints every error with its key and exits non-zero.
#[test]
fn check_config_reports_errors() {
    let dir = TempDir::new("bad-config");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "upstream:\n  url: http://127.0.0.1:1\ndefaults:\n  lease: 1s\n  retention: 1s\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("defaults.lease") && stderr.contains("defaults.retention"),
        "{stderr}"
    );
}

/// docker-compose.yml, read as Docker would: the image is built by one service and only
/// run by the others (never pulled), every command it gives our image is one the binary
/// takes, the keys' volumes are declared, and the image's store volume is mounted.
#[test]
fn compose_builds_once_and_runs_what_the_binary_takes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    let compose: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let services = compose["services"].as_object().unwrap();
    let ours: Vec<(&String, &serde_json::Value)> = services
        .iter()
        .filter(|(_, s)| s["image"] == "idemproxy:local")
        .collect();
    assert!(ours.len() >= 3, "{ours:?}");
    let builders: Vec<&String> = ours
        .iter()
        .filter(|(_, s)| s.get("build").is_some())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        builders.len(),
        1,
        "built by exactly one service: {builders:?}"
    );
    for (name, service) in &ours {
        if service.get("build").is_none() {
            assert_eq!(service["pull_policy"], "never", "{name} would try to pull");
        }
        let command: Vec<&str> = service["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        // Flags before `--help` are still parsed: an unknown one fails.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .args(&command)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for check in service["healthcheck"]["test"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(url) = check.as_str().filter(|c| c.starts_with("http://")) {
                let port = url.rsplit(':').next().unwrap().split('/').next().unwrap();
                let ports = service["ports"].to_string();
                assert!(
                    ports.contains(port),
                    "{name}: health check on {url}, ports {ports}"
                );
            }
        }
    }
    let declared = compose["volumes"].as_object().unwrap();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let volume = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("VOLUME "))
        .unwrap()
        .trim_matches(|c| c == '[' || c == ']' || c == '"' || c == ' ');
    let mounts = |service: &str| -> Vec<(String, String)> {
        services[service]["volumes"]
            .as_array()
            .unwrap_or_else(|| panic!("{service} mounts no volume"))
            .iter()
            .map(|v| {
                let (name, at) = v.as_str().unwrap().split_once(':').unwrap();
                assert!(declared.contains_key(name), "volume {name} is not declared");
                (name.to_owned(), at.to_owned())
            })
            .collect()
    };
    assert!(
        mounts("idemproxy").iter().any(|(_, at)| at == volume),
        "the image's store volume {volume} is mounted"
    );
    assert!(
        mounts("postgres")
            .iter()
            .any(|(_, at)| at == "/var/lib/postgresql/data"),
        "PostgreSQL keeps the keys on a volume"
    );
}

/// The image's default command serves on every interface, the admin listener too, and
/// so refuses to start without a token, saying which variable to set.
#[test]
fn the_images_default_command_needs_an_admin_token() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let cmd: Vec<String> = serde_json::from_str(
        dockerfile
            .lines()
            .find_map(|l| l.strip_prefix("CMD "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cmd[0], "serve");
    // `check-config` takes serve's flags and says what serve would run; the image's
    // /etc/idemproxy is the repository's config/ (COPY config /etc/idemproxy).
    let args: Vec<String> = std::iter::once("check-config".to_owned())
        .chain(
            cmd[1..]
                .iter()
                .map(|a| a.replace("/etc/idemproxy", &root.join("config").display().to_string())),
        )
        .collect();
    let run = |token: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"));
        command.args(&args).env_remove("DATABASE_URL");
        match token {
            Some(t) => command.env("IDEMPROXY_ADMIN_TOKEN", t),
            None => command.env_remove("IDEMPROXY_ADMIN_TOKEN"),
        };
        command.output().unwrap()
    };
    let without = run(None);
    assert!(!without.status.success());
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(stderr.contains("IDEMPROXY_ADMIN_TOKEN"), "{stderr}");
    let with = run(Some("t0ken"));
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let printed = String::from_utf8_lossy(&with.stdout);
    assert!(printed.contains("admin_listen: 0.0.0.0:9090"), "{printed}");
    assert!(printed.contains("listen: 0.0.0.0:8080"), "{printed}");
}

/// The README's quick start, as written: the demo provider on its default address and
/// the proxy in front of it with no configuration file answer the README's `curl` with a
/// charge, the same command again with the same charge replayed, another amount under the
/// key with 422 — and the provider charged once. (On free ports: the defaults would
/// collide with tests running beside this one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_works() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.split("## Quick start").nth(1).unwrap();
    let command = start
        .lines()
        .find(|l| l.contains("demo-provider &"))
        .expect("the quick start starts the demo provider");
    let upstream_flag = "--upstream http://127.0.0.1:3000";
    assert!(command.contains(upstream_flag), "{command}");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["demo-provider", "--help"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("[default: 127.0.0.1:3000]"),
        "the provider's default address is the one the quick start proxies to"
    );

    let dir = TempDir::new("quick-start");
    let provider_port = free_port();
    let _provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args([
            "demo-provider",
            "--listen",
            &format!("127.0.0.1:{provider_port}"),
        ])
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let [port, admin] = [free_port(), free_port()];
    let _proxy = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args([
            "--upstream",
            &format!("http://127.0.0.1:{provider_port}"),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ])
        .current_dir(&dir.0)
        .env_remove("DATABASE_URL")
        .env_remove("IDEMPROXY_CONFIG")
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = TestClient::at(format!("127.0.0.1:{port}").parse().unwrap());
    let headers = [
        ("idempotency-key", "7c1f"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"amount":100,"currency":"RUB"}"#;
    let first = eventually(std::time::Duration::from_secs(10), || async {
        let reply = client
            .try_send("POST", "/payments", &headers, body)
            .await
            .ok()?;
        (reply.status != 502).then_some(reply)
    })
    .await
    .expect("the proxy answers");
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    let again = client.send("POST", "/payments", &headers, body).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let other = client
        .send(
            "POST",
            "/payments",
            &headers,
            r#"{"amount":500,"currency":"RUB"}"#,
        )
        .await;
    assert_eq!(other.status, 422, "{other:?}");
    let charges = TestClient::at(format!("127.0.0.1:{provider_port}").parse().unwrap())
        .send("GET", "/charges", &[], "")
        .await;
    assert_eq!(charges.json()["charges"], 1);
    assert!(dir.join("idemproxy.db").exists(), "keys in ./idemproxy.db");
}

/// Every configuration the README and the docs show (a ```yaml block that starts at the
/// top level) is one the proxy accepts: documentation that cannot run is a trap.
#[test]
fn documented_configurations_are_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for doc in [
        "README.md",
        "docs/configuration.md",
        "docs/stores.md",
        "docs/operations.md",
        "docs/security.md",
        "docs/console.md",
        "docs/apis/stripe.md",
        "docs/apis/adyen.md",
        "docs/apis/paypal.md",
        "docs/apis/checkout.md",
        "docs/apis/square.md",
    ] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        for block in text.split("```yaml\n").skip(1) {
            let yaml = block.split("```").next().unwrap();
            if yaml.starts_with([' ', '\t']) {
                continue; // a fragment of a route, shown in its place
            }
            // Each key ring secret the example names (`{ env: NAME }`), as an operator
            // would have set it.
            let env = yaml
                .split("{ env: ")
                .skip(1)
                .filter_map(|rest| rest.split([' ', '}']).next())
                .map(|name| {
                    let key = "2rLQmMHK8U2n0M1cQ0QmYvXq2oN7l3tq9Q3Z0ZqY1kM=";
                    (name.to_owned(), key.to_owned())
                })
                .collect();
            let overrides = idemproxy::config::Overrides {
                upstream: Some("http://127.0.0.1:3000".into()),
                env: Some(env),
                ..Default::default()
            };
            if let Err(e) = idemproxy::config::load_str(yaml, &overrides) {
                panic!("{doc}: a documented configuration is refused: {e}\n{yaml}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked}");
}
