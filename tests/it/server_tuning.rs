//! The start-up log names the server settings far from what the key table's churn needs
//! (issue 33: autovacuum, WAL spacing, durable commits, the table's vacuum threshold), and
//! says nothing about a server set as `docs/stores.md` recommends. A throwaway cluster of
//! its own, so that the shared server's settings decide nothing here.

use crate::support;

use std::time::Duration;

use support::cluster::Cluster;
use support::*;

const ADVICE: &str = "a database server setting is far off";

/// One proxy process on `url` (the schema is migrated by `--migrate`), its start-up log
/// once the store connection was made and the settings were read.
async fn startup_log(url: &str, upstream: &Upstream) -> String {
    let store =
        format!("store:\n  postgres:\n    url: \"{url}\"\n    timeout: 2s\n    pool_size: 2\n");
    let db = Backend::embedded();
    let mut proxy = ProxyProcess::spawn_with(
        &PAYMENTS.replace("{store}", &store),
        upstream,
        &db,
        &["--migrate"],
    )
    .await;
    let read = eventually(Duration::from_secs(10), || {
        let log = proxy.log_text();
        async move {
            log.contains("database server settings checked")
                .then_some(())
        }
    })
    .await;
    assert!(read.is_some(), "{}", proxy.log_text());
    let log = proxy.log_text();
    proxy.kill().await;
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_far_off_are_named_at_start_and_a_tuned_server_is_quiet() {
    let cluster = Cluster::start_new(
        "tuning",
        "autovacuum = off\nmax_wal_size = 256MB\nmin_wal_size = 64MB\nsynchronous_commit = off\nfsync = off\n",
        "host all all 127.0.0.1/32 trust\n",
    );
    cluster.psql("postgres", "CREATE DATABASE pay");
    let url = cluster.url("postgres", "pay", "");
    let upstream = Upstream::spawn(Behavior::default()).await;

    let log = startup_log(&url, &upstream).await;
    for named in [
        "fsync = off",
        "autovacuum = off",
        "max_wal_size is 256 MB",
        "synchronous_commit = off",
    ] {
        assert!(
            log.lines().any(|l| l.contains(ADVICE) && l.contains(named)),
            "the start-up log should name {named}:\n{log}"
        );
    }

    // Autovacuum on, but the table left at the server's default threshold.
    cluster.psql("postgres", "ALTER SYSTEM SET autovacuum = on");
    cluster.psql("postgres", "ALTER SYSTEM SET max_wal_size = '4GB'");
    cluster.psql("postgres", "ALTER SYSTEM SET synchronous_commit = on");
    cluster.psql("postgres", "ALTER SYSTEM SET fsync = on");
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    let log = startup_log(&url, &upstream).await;
    let advice: Vec<&str> = log.lines().filter(|l| l.contains(ADVICE)).collect();
    assert_eq!(advice.len(), 1, "{log}");
    assert!(
        advice[0].contains("autovacuum_vacuum_scale_factor is 0.2"),
        "{log}"
    );

    // The table's own threshold, as docs/stores.md recommends: nothing to say.
    cluster.psql(
        "pay",
        "ALTER TABLE idempotency_keys SET (autovacuum_vacuum_scale_factor = 0.01)",
    );
    let log = startup_log(&url, &upstream).await;
    assert!(!log.contains(ADVICE), "{log}");
    assert_eq!(upstream.executions(), 0);
}
