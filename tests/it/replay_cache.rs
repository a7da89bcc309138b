//! The replay cache answers retries of completed keys from memory, and never in a way the
//! store would not: not past the row's retention, not after an eviction on any replica,
//! not for a different request under the key (that stays a `422`).

use crate::support;

use std::time::Duration;

use idemproxy::store::Maintenance;
use support::*;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;
const OTHER: &str = r#"{"amount":500,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// Replays `key` on `proxy` until one is answered from memory (PostgreSQL's cache serves
/// only once its notification connection is up).
async fn replay_until_cached(proxy: &TestProxy, key: &str) {
    let client = TestClient::new(proxy);
    let before = cache_hits(proxy).await;
    let cached = eventually(Duration::from_secs(30), || async {
        let reply = client.post("/payments", "shop-1", key, BODY).await;
        assert_eq!(reply.status, 201, "{reply:?}");
        assert!(reply.replayed(), "{reply:?}");
        (cache_hits(proxy).await > before).then_some(())
    })
    .await;
    assert!(cached.is_some(), "no replay was answered from memory");
}

/// A key evicted through one replica's admin API is dropped from every replica's cache:
/// the next retry on another replica executes instead of replaying from memory (which,
/// without the eviction notice, it would for up to a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_on_one_replica_reaches_every_cache() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let a = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let b = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let first = TestClient::new(&a)
        .post("/payments", "shop-1", "evicted", BODY)
        .await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    replay_until_cached(&b, "evicted").await;

    let evicted = TestClient::at(a.admin)
        .send("DELETE", "/admin/keys/shop-1/evicted", &[], "")
        .await;
    assert_eq!(evicted.status, 200, "{evicted:?}");
    let client = TestClient::new(&b);
    let executed = eventually(Duration::from_secs(30), || async {
        let reply = client.post("/payments", "shop-1", "evicted", BODY).await;
        assert_eq!(reply.status, 201, "{reply:?}");
        (!reply.replayed()).then_some(())
    })
    .await;
    assert!(executed.is_some(), "replica b still replays an evicted key");
    assert_eq!(upstream.executions(), 2);
    a.stop().await;
    b.stop().await;
}

/// An answer is served from memory no longer than its row's retention: once the row is
/// swept, a retry executes afresh.
async fn never_past_the_retention(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = PAYMENTS.replace("  lease: 30s\n", "  lease: 3s\n  retention: 4s\n");
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client
            .post("/payments", "shop-1", "brief", BODY)
            .await
            .status,
        201
    );
    replay_until_cached(&proxy, "brief").await;
    tokio::time::sleep(Duration::from_millis(4_200)).await;
    assert_eq!(db.store().sweep(100).await.unwrap(), 1);
    let again = client.post("/payments", "shop-1", "brief", BODY).await;
    assert_eq!((again.status.as_u16(), again.replayed()), (201, false));
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

/// A different request under a cached key is still the store's `422`, and another
/// client's same key is its own operation.
async fn a_cached_key_keeps_its_422_and_its_client(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client
            .post("/payments", "shop-1", "mine", BODY)
            .await
            .status,
        201
    );
    replay_until_cached(&proxy, "mine").await;
    let other = client.post("/payments", "shop-1", "mine", OTHER).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert!(other.is_problem());
    let theirs = client.post("/payments", "shop-2", "mine", BODY).await;
    assert_eq!((theirs.status.as_u16(), theirs.replayed()), (201, false));
    assert_eq!(upstream.executions(), 2);
    proxy.stop().await;
}

on_every_store!(
    never_past_the_retention,
    a_cached_key_keeps_its_422_and_its_client
);
