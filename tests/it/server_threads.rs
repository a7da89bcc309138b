//! The binary serves on several threads, each with its own runtime, listening socket and
//! upstream connections (`server::run_threaded`); the guarantees hold across them.

use crate::support;

use std::time::Duration;

use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Ten concurrent duplicates of each of twenty keys, every request on a connection of its
/// own, so that the kernel spreads them over the process's three server threads: twenty
/// executions, one per key, and every duplicate answered.
async fn duplicates_over_server_threads_execute_once(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let proxy = ProxyProcess::spawn(&db.patient_payments(), &upstream, &db).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        for key in 0..20 {
            // A client per request: a connection per request.
            let client = client_for(proxy.addr);
            tasks.spawn(async move {
                let reply = client
                    .post("/payments", "shop-1", &format!("t-{key}"), BODY)
                    .await;
                (key, reply)
            });
        }
    }
    let mut executed = std::collections::HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (key, reply) = done.unwrap();
        assert!(matches!(reply.status.as_u16(), 201 | 409), "{reply:?}");
        if reply.status == 201 && !reply.replayed() {
            *executed.entry(key).or_insert(0) += 1;
        }
    }
    assert_eq!(upstream.executions(), 20);
    assert_eq!(executed.len(), 20);
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");
    // Every key is stored: the retries replay.
    for key in 0..20 {
        let reply = client_for(proxy.addr)
            .post("/payments", "shop-1", &format!("t-{key}"), BODY)
            .await;
        assert_eq!(reply.status, 201);
        assert!(reply.replayed(), "{reply:?}");
    }
    assert_eq!(upstream.executions(), 20);
}

on_both_stores!(duplicates_over_server_threads_execute_once);

/// The server threads share the port with `SO_REUSEPORT`, which would also let a second
/// process share it, silently taking half of the connections. A second process on a taken
/// port must fail to start instead, as it would without the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_process_on_a_taken_port_does_not_start() {
    // PostgreSQL: a second process on one embedded file is refused before it binds.
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let first = ProxyProcess::spawn(&db.patient_payments(), &upstream, &db).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .arg("serve")
        .arg("--config")
        .arg(first.config_file())
        .arg("--listen")
        .arg(first.addr.to_string())
        .env_remove("DATABASE_URL")
        .env("TOKIO_WORKER_THREADS", "3")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("the second process kept running on a taken port")
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("binding {}", first.addr)),
        "{stderr}"
    );
    // The first one still serves.
    let reply = client_for(first.addr)
        .post("/payments", "shop-1", "after", BODY)
        .await;
    assert_eq!(reply.status, 201);
}
