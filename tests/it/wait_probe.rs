//! Waiting duplicates (`on_conflict: wait`) and the recovery probe after a takeover.

use crate::support;

use std::time::Duration;

use idemproxy::store::{
    Completion, Fence, Fenced, KeyStore, Reservation, ReserveRequest, StoredResponse, key_id,
};
use support::*;

const BODY: &str = PAYMENT_BODY;

fn waiting(limit: &str) -> String {
    PAYMENTS.replace(
        "    require_key: true\n",
        &format!("    require_key: true\n    on_conflict: {{ wait: {limit} }}\n"),
    )
}

/// Twenty concurrent duplicates on a wait-mode route all receive the first answer; the
/// upstream runs once.
async fn waiting_duplicates_get_the_first_answer(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(&waiting("10s"), &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.post("/payments", "shop-1", "w", BODY).await })
        })
        .collect();
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    assert!(replies.iter().all(|r| r.status == 201), "{replies:?}");
    assert_eq!(replies.iter().filter(|r| !r.replayed()).count(), 1);
    assert!(replies.iter().all(|r| r.body == replies[0].body));
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// Past the wait bound a duplicate gets 409 like in reject mode.
async fn waiting_is_bounded(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_secs(3),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(&waiting("300ms"), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "w", BODY).await })
    };
    upstream.wait_executions(1).await;
    let dup = client.post("/payments", "shop-1", "w", BODY).await;
    assert_eq!(dup.status, 409);
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// A completion on one store instance (one replica) wakes a waiter subscribed on another,
/// through PostgreSQL's LISTEN/NOTIFY, with no polling involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_notifies_other_replicas() {
    completion_wakes_a_waiter_on_another_replica(Backend::postgres().await).await;
}

/// The same on Citus: the completion runs on the worker holding the key, where nobody
/// listens, so the notification must come from the coordinator the replicas listen on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_notifies_other_replicas_on_citus() {
    completion_wakes_a_waiter_on_another_replica(Backend::citus().await).await;
}

async fn completion_wakes_a_waiter_on_another_replica(db: Backend) {
    let (a, b) = (db.store(), db.store());
    let fp = [7u8; 32];
    let notify = a.subscribe(key_id("c", "k"));
    // Every waiter is woken once when the LISTEN connection is up (anything may have been
    // missed before); after that, only a notification can wake it.
    let connected = notify.notified();
    tokio::pin!(connected);
    connected.as_mut().enable();
    tokio::time::timeout(Duration::from_secs(10), connected)
        .await
        .expect("LISTEN connection established");
    let notified = notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();

    let req = ReserveRequest {
        client_id: "c",
        key: "k",
        fingerprint: &fp,
        route: "r",
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    };
    let Reservation::Reserved(lease) = b.reserve(&req).await.unwrap() else {
        panic!("reserved")
    };
    let fence = Fence {
        client_id: "c".into(),
        key: "k".into(),
        token: lease.token,
        notify: true,
        retention: Duration::from_secs(3600),
    };
    let done = Completion::Stored(StoredResponse::clear(200, Default::default(), "x".into()));
    assert_eq!(b.complete(&fence, &done).await.unwrap(), Fenced::Applied);
    let woken = tokio::time::timeout(Duration::from_secs(10), notified).await;
    assert!(
        woken.is_ok(),
        "the waiter on the other instance was notified"
    );
}

fn probing() -> String {
    PAYMENTS.replace(
        "    require_key: true\n",
        "    require_key: true\n    recovery_probe:\n      method: GET\n      path: /probe/{key}\n",
    )
}

/// A takeover asks the probe first; when the provider says the operation happened, its
/// answer is stored and nothing executes again.
async fn probe_found_prevents_reexecution(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    crashed_reservation(&db, "shop-1", "p").await;
    // The crashed worker had already reached the provider, which cannot deduplicate.
    let direct = TestClient::at(upstream.addr);
    let charged = direct
        .send(
            "POST",
            "/payments",
            &[("idempotency-key", "shop-1:p")],
            BODY,
        )
        .await;
    assert_eq!(charged.status, 201);

    let proxy = TestProxy::spawn(&probing(), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let reply = client.post("/payments", "shop-1", "p", BODY).await;
    assert_eq!(reply.status, 200, "the probe's answer: {reply:?}");
    assert_eq!(reply.json()["charge_id"], 1);
    assert_eq!(upstream.probes(), 1);
    assert_eq!(upstream.executions(), 1, "not executed again");
    let replay = client.post("/payments", "shop-1", "p", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.json()["charge_id"], 1);
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

/// When the probe says the operation never happened, the takeover executes it.
async fn probe_not_found_executes(db: Backend) {
    let upstream = Upstream::spawn(Behavior::default()).await;
    crashed_reservation(&db, "shop-1", "q").await;
    let proxy = TestProxy::spawn(&probing(), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let reply = client.post("/payments", "shop-1", "q", BODY).await;
    assert_eq!(reply.status, 201);
    assert_eq!(upstream.probes(), 1);
    assert_eq!(upstream.executions(), 1);
    // A first attempt (no takeover) never probes.
    let fresh = client.post("/payments", "shop-1", "fresh", BODY).await;
    assert_eq!(fresh.status, 201);
    assert_eq!(upstream.probes(), 1);
    proxy.stop().await;
}

on_both_stores!(
    waiting_duplicates_get_the_first_answer,
    waiting_is_bounded,
    probe_found_prevents_reexecution,
    probe_not_found_executes
);
