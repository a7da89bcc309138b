//! The tail at full speed (issue 57): every completion leaves its key's old version in the
//! index of keys in progress by lease end until vacuum reaches the table, and the
//! unresolved-keys count (every 15 s) asks that index for `locked_until < now()` — which
//! every completed key's old version matches. A bitmap scan re-reads all of their heap
//! pages on every run, a cost that grows with the completion rate until autovacuum runs;
//! a plain index scan marks each entry dead once (LP_DEAD) and later runs skip it. The
//! count must leave the entries it found dead marked so: read with `pageinspect` in a
//! database of this test's own (no other session holding back what counts as dead).

use crate::support;

use idemproxy::store::{Maintenance, PgStore};
use support::{admin_url, migrate_store, pg_store_yaml};

/// Completed keys whose old versions the count meets.
const KEYS: i64 = 50_000;

/// Entries of the unresolved-keys index marked dead, and all its entries (leaf items that
/// point at a row: not the pages' high keys).
async fn index_entries(db: &tokio_postgres::Client) -> (i64, i64) {
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE dead), count(*) \
             FROM generate_series(1, (pg_relation_size('idempotency_keys_unresolved') / 8192)::int - 1) AS b, \
                  LATERAL bt_page_items('idempotency_keys_unresolved', b) \
             WHERE (SELECT btpo_flags & 1 FROM bt_page_stats('idempotency_keys_unresolved', b)) = 1 \
               AND htid IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_unresolved_keys_marks_completed_versions_dead() {
    // A database of its own: in the shared one, another test's open transaction would keep
    // the old versions from being dead to everyone, and nothing could be marked.
    let name = format!(
        "idemproxy_dead_versions_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let admin_url = admin_url();
    let (admin, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = format!("{}/{name}", admin_url.rsplit_once('/').unwrap().0);
    let store_yaml = pg_store_yaml(&url);
    migrate_store(&store_yaml).await;

    let (check, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // Keys reserved with leases that have run out, then completed as the store completes
    // them: `status`, `locked_until` and `expires_at` change, so each completion is a new
    // version and the old one stays in the index. Many of them, as a minute at full speed
    // leaves (the planner reads a few hundred with a plain index scan anyway), each lease
    // ending at its own moment as real ones do (equal ones would share one index entry).
    check
        .batch_execute(&format!(
            "INSERT INTO idempotency_keys (client_id, key, route, fingerprint, lease_token, locked_until, expires_at) \
             SELECT 'shop-1', 'k' || g, 'payments', '\\x00', g, \
               now() - interval '1 minute' + g * interval '1 microsecond', now() + interval '1 day' \
             FROM generate_series(1, {KEYS}) g; \
             UPDATE idempotency_keys SET status = 'done', locked_until = NULL, expires_at = now() + interval '1 day', \
               response_status = 201, completed_at = now()"
        ))
        .await
        .unwrap();
    check
        .batch_execute("CREATE EXTENSION pageinspect")
        .await
        .unwrap();
    let (dead, all) = index_entries(&check).await;
    assert_eq!((dead, all), (0, KEYS), "nothing marked before the count");

    let text = format!("upstream:\n  url: http://127.0.0.1:1\n{store_yaml}");
    let config = idemproxy::config::load_str(&text, &Default::default()).unwrap();
    let idemproxy::config::StoreConfig::Postgres(pg) = &config.store else {
        unreachable!()
    };
    let store = PgStore::new(pg).unwrap();
    assert_eq!(store.unresolved_counts().await.unwrap(), vec![]);
    let (dead, all) = index_entries(&check).await;
    assert_eq!(
        (dead, all),
        (KEYS, KEYS),
        "the count marks the completed keys' old entries dead, so the next one skips them"
    );

    drop(store);
    drop(check);
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
}
