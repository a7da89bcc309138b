//! Idempotency keys stored as keyed hashes (`encryption.hash_keys`), on both stores: the
//! key is not in the store's bytes, retries replay (and a changed request is still `422`),
//! the provider still gets the derived key made of the clear key, and the admin API finds,
//! resolves and evicts a row by the clear key. The store records which form its keys are
//! in, and a proxy configured for another form — or another hash secret — is refused while
//! keys are stored: it would find none of them and execute every retry again.

use crate::support;

use std::path::Path;
use std::time::Duration;

use idemproxy::store::{Inspect, KeyFormAgreement, KeyStore, SettleKeyForm};
use support::at_rest::*;
use support::*;

/// A client's order number, used as its idempotency key: what the table must not reveal.
const ORDER: &str = "order-7731-ZQX";

/// `PAYMENTS` sealing with `ring` and, when `hash_key` is given, hashing keys with it.
fn config(ring: &Path, hash_key: Option<&Path>) -> String {
    let mut yaml = format!(
        "{PAYMENTS}encryption:\n  keys:\n    k1: {{ file: \"{}\" }}\n",
        ring.display()
    );
    if let Some(h) = hash_key {
        yaml.push_str(&format!(
            "  hash_keys: true\n  hash_key: {{ file: \"{}\" }}\n",
            h.display()
        ));
    }
    yaml
}

fn body(purpose: &str) -> String {
    format!(r#"{{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"{purpose}"}}"#)
}

/// Hashed keys: the order number is nowhere in the store, yet the retry replays, a changed
/// request is refused, the provider got `client:key` in clear, and the admin API looks the
/// row up, and evicts it, by the key the client sent. The same check on a clear-key store
/// finds the order number, so it can fail.
async fn hashed_keys_replay_and_admin_lookups_work(db: Backend) {
    let dir = TempDir::new("hashed");
    let (ring, hash) = (key_file(&dir, "ring", 1), key_file(&dir, "hash", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(&ring, Some(&hash)), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client.post("/payments", "shop-1", ORDER, &body("a")).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = client.post("/payments", "shop-1", ORDER, &body("a")).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    let changed = client.post("/payments", "shop-1", ORDER, &body("b")).await;
    assert_eq!(changed.status, 422, "{changed:?}");
    assert_eq!(upstream.executions(), 1);
    let sent = upstream.seen();
    assert_eq!(
        sent[0].headers.get("idempotency-key").unwrap(),
        &format!("shop-1:{ORDER}"),
        "the provider deduplicates on the clear derived key"
    );
    assert!(
        !stored_in_clear(&db, ORDER).await,
        "the key is stored hashed"
    );
    assert!(db.lookup("shop-1", ORDER).await.is_none());

    let admin = TestClient::at(proxy.admin);
    let path = format!("/admin/keys/shop-1/{ORDER}");
    let found = admin.send("GET", &path, &[], "").await;
    assert_eq!(found.status, 200, "{found:?}");
    assert_eq!(found.json()["status"], "done", "{}", found.json());
    let evicted = admin.send("DELETE", &path, &[], "").await;
    assert_eq!(evicted.status, 200, "{evicted:?}");
    let afresh = client.post("/payments", "shop-1", ORDER, &body("b")).await;
    assert_eq!(afresh.status, 201, "an evicted key executes afresh");
    assert_eq!(upstream.executions(), 2);

    // Concurrent duplicates of one key hash alike, so the unique index still picks one
    // winner: one execution, the others 409 or the replay.
    let racing: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .post("/payments", "shop-1", "race-1", &body("r"))
                    .await
            })
        })
        .collect();
    for task in racing {
        let status = task.await.unwrap().status.as_u16();
        assert!(matches!(status, 201 | 409), "{status}");
    }
    assert_eq!(
        upstream.executions(),
        3,
        "sixteen duplicates, one execution"
    );
    proxy.stop().await;

    // The control: the same request on a store of clear keys leaves the order number in it.
    let clear_db = match &db {
        Backend::Postgres(_) => Backend::postgres().await,
        Backend::Embedded(_) => Backend::embedded(),
    };
    let clear = TestProxy::spawn(&config(&ring, None), &upstream, &clear_db).await;
    let reply = TestClient::new(&clear)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert_eq!(reply.status, 201);
    assert!(stored_in_clear(&clear_db, ORDER).await);
    clear.stop().await;
}

/// A worker crashed holding a hashed key; the client's retry takes it over, and the
/// re-execution sends the provider the derived key made of the clear key — which the row
/// cannot give back — exactly once.
async fn a_takeover_of_a_hashed_key_sends_the_clear_derived_key(db: Backend) {
    let dir = TempDir::new("hashed-takeover");
    let (ring, hash) = (key_file(&dir, "ring", 1), key_file(&dir, "hash", 2));
    let stored =
        idemproxy::key::KeyForm::hashed(&key_material(&hash)).stored("shop-1", ORDER.to_owned());
    crashed_reservation(&db, "shop-1", &stored).await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(&ring, Some(&hash)), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    // The operator's listing shows the stored (hashed) key, and it looks the row up too.
    let admin = TestClient::at(proxy.admin);
    let stuck = admin.send("GET", "/admin/stuck", &[], "").await.json();
    assert_eq!(stuck["keys"][0]["key"], stored.as_str(), "{stuck}");
    let by_stored = admin
        .send("GET", &format!("/admin/keys/shop-1/{stored}"), &[], "")
        .await;
    assert_eq!(by_stored.status, 200, "{by_stored:?}");
    let by_clear = admin
        .send("GET", &format!("/admin/keys/shop-1/{ORDER}"), &[], "")
        .await;
    assert_eq!(by_clear.json()["key"], stored.as_str());
    let retry = client
        .post("/payments", "shop-1", ORDER, PAYMENT_BODY)
        .await;
    assert_eq!(retry.status, 201, "{retry:?}");
    let replay = client
        .post("/payments", "shop-1", ORDER, PAYMENT_BODY)
        .await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(upstream.executions(), 1);
    let seen = upstream.seen();
    assert_eq!(
        seen[0].headers.get("idempotency-key").unwrap(),
        &format!("shop-1:{ORDER}")
    );
    let row = db.lookup("shop-1", &stored).await.unwrap();
    assert_eq!(row.attempts, 2, "taken over, not reserved afresh");
    proxy.stop().await;
}

/// The store's key form: recorded on an empty store, agreed by the same form, refused for
/// another one (or another secret) while keys are stored — rows written before the form
/// was recorded count as clear — and changeable again once the store is empty.
async fn the_store_keeps_its_key_form(db: Backend) {
    let store = db.store();
    let dir = TempDir::new("key-form");
    let hashed = idemproxy::key::KeyForm::hashed(&key_material(&key_file(&dir, "h", 2)));
    let other = idemproxy::key::KeyForm::hashed(&key_material(&key_file(&dir, "o", 3)));
    let settle = async |marker: &str| store.settle_key_form(marker).await.unwrap();
    assert_eq!(settle("clear").await, KeyFormAgreement::Agreed);
    // Empty: the form may change.
    assert_eq!(settle(hashed.marker()).await, KeyFormAgreement::Agreed);
    crashed_reservation(&db, "shop-1", "h1:stored").await;
    assert_eq!(settle(hashed.marker()).await, KeyFormAgreement::Agreed);
    assert_eq!(
        settle("clear").await,
        KeyFormAgreement::Differs {
            stored: hashed.marker().to_owned()
        }
    );
    assert_eq!(
        settle(other.marker()).await,
        KeyFormAgreement::Differs {
            stored: hashed.marker().to_owned()
        },
        "another secret is another form"
    );
    assert!(store.evict("shop-1", "h1:stored").await.unwrap());
    assert_eq!(settle("clear").await, KeyFormAgreement::Agreed);

    // Rows from before the form was recorded are clear ones.
    crashed_reservation(&db, "shop-1", "legacy").await;
    forget_key_form(&db).await;
    assert_eq!(
        settle(hashed.marker()).await,
        KeyFormAgreement::Differs {
            stored: "clear".to_owned()
        }
    );
    assert_eq!(settle("clear").await, KeyFormAgreement::Agreed);
}

/// The store as an older release left it: keys, and no key form recorded.
async fn forget_key_form(db: &Backend) {
    match db {
        Backend::Postgres(_) => {
            db.client()
                .await
                .execute("DELETE FROM idemproxy_settings", &[])
                .await
                .unwrap();
        }
        Backend::Embedded(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute("DELETE FROM idemproxy_settings", []).unwrap();
        }
    }
}

/// A store of clear keys moved in place: refused (and nothing changed) while a lease is
/// held; then every key is hashed at once — sealed answers sealed again for their new key,
/// a crashed worker's reservation moved too — and a proxy hashing keys replays the stored
/// answers, takes the crashed one over, and executes nothing twice. Run again: nothing to
/// do.
async fn rehash_keys_moves_a_clear_store(db: Backend) {
    use idemproxy::store::RehashKeys;
    let dir = TempDir::new("rehash");
    let (ring, hash) = (key_file(&dir, "ring", 1), key_file(&dir, "hash", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let clear = TestProxy::spawn(&config(&ring, None), &upstream, &db).await;
    let mut first = Vec::new();
    for key in ["order-A-1", "order-B-2"] {
        let reply = TestClient::new(&clear)
            .post("/payments", "shop-1", key, &body(key))
            .await;
        assert_eq!(reply.status, 201);
        first.push(reply.body);
    }
    clear.stop().await;
    crashed_reservation(&db, "shop-1", "order-C-3").await;
    let fp = payment_fingerprint();
    let live = idemproxy::store::ReserveRequest {
        client_id: "shop-1",
        key: "order-L-4",
        fingerprint: &fp,
        route: "create-payment",
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        takeover: true,
        derived_key: None,
    };
    db.store().reserve(&live).await.unwrap();

    let hashed_config = config(&ring, Some(&hash));
    let loaded = idemproxy::config::load_str(
        &hashed_config
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url()),
        &idemproxy::config::Overrides::default(),
    )
    .unwrap();
    let encryption = loaded.encryption.unwrap();
    let (form, vault) = (encryption.key_form(), encryption.vault());
    let store = db.store();
    let refused = store.rehash_keys(&form, Some(&vault)).await.unwrap_err();
    assert!(
        refused.to_string().contains("1 keys are in flight"),
        "{refused}"
    );
    assert!(
        db.lookup("shop-1", "order-A-1").await.is_some(),
        "nothing changed"
    );
    assert!(store.evict("shop-1", "order-L-4").await.unwrap());

    let done = store.rehash_keys(&form, Some(&vault)).await.unwrap();
    assert_eq!((done.keys, done.resealed, done.already), (3, 2, false));
    assert!(db.lookup("shop-1", "order-A-1").await.is_none());
    assert!(!stored_in_clear(&db, "order-A-1").await);
    let again = store.rehash_keys(&form, Some(&vault)).await.unwrap();
    assert!(again.already);

    let proxy = TestProxy::spawn(&hashed_config, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for (key, body_first) in ["order-A-1", "order-B-2"].iter().zip(&first) {
        let replay = client.post("/payments", "shop-1", key, &body(key)).await;
        assert!(replay.replayed(), "{key}: {replay:?}");
        assert_eq!(&replay.body, body_first, "{key}");
    }
    let taken_over = client
        .post("/payments", "shop-1", "order-C-3", PAYMENT_BODY)
        .await;
    assert_eq!(taken_over.status, 201, "{taken_over:?}");
    assert_eq!(
        upstream.executions(),
        3,
        "A and B once each, C once on takeover"
    );
    proxy.stop().await;
    // The store's form is the hashed one now: a clear-key proxy would be refused.
    assert_eq!(
        store.settle_key_form("clear").await.unwrap(),
        KeyFormAgreement::Differs {
            stored: form.marker().to_owned()
        }
    );
}

on_every_store!(
    rehash_keys_moves_a_clear_store,
    hashed_keys_replay_and_admin_lookups_work,
    a_takeover_of_a_hashed_key_sends_the_clear_derived_key,
    the_store_keeps_its_key_form,
);

/// `idemproxy serve` refuses to start on a store whose keys are in another form, naming
/// the setting: a rolling deploy that turned `hash_keys` on beside running replicas, or a
/// changed hash secret, stops there instead of executing every retry again. With the
/// replicas stopped, `idemproxy rehash-keys` moves the store, and hashing replicas replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_store_of_another_key_form() {
    let db = Backend::postgres().await;
    let dir = TempDir::new("form-refused");
    let (ring, hash) = (key_file(&dir, "ring", 1), key_file(&dir, "hash", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    // A replica of the release before: clear keys, one stored.
    let proxy = ProxyProcess::spawn(&config(&ring, None), &upstream, &db).await;
    let reply = client_for(proxy.addr)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert_eq!(reply.status, 201);

    let file = dir.join("hashed.yaml");
    let yaml = format!(
        "admin_listen: \"127.0.0.1:0\"\n{}",
        config(&ring, Some(&hash))
    )
    .replace("{store}", &db.store_yaml())
    .replace("{upstream}", &upstream.url());
    std::fs::write(&file, yaml).unwrap();
    let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .env_remove("DATABASE_URL")
        .env_remove("IDEMPROXY_CONFIG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), refused)
        .await
        .expect("serve refuses instead of serving")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("encryption.hash_keys"), "{stderr}");
    assert!(stderr.contains("kept as sent"), "{stderr}");
    // The running replica is untouched: its key still replays.
    let again = client_for(proxy.addr)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert!(again.replayed());
    assert_eq!(upstream.executions(), 1);

    // The way there: stop the replicas, `rehash-keys`, start them hashing.
    drop(proxy);
    let rehash = |config: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .args(["rehash-keys", "--config"])
            .arg(config)
            .env_remove("DATABASE_URL")
            .env_remove("IDEMPROXY_CONFIG")
            .output()
            .unwrap()
    };
    let clear_file = dir.join("clear.yaml");
    std::fs::write(
        &clear_file,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace("  hash_keys: true\n", "")
            .lines()
            .filter(|l| !l.contains("hash_key:"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let out = rehash(&clear_file);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not hash keys"));
    let out = rehash(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("hashed 1 keys (1 stored answers sealed again"),
        "{stdout}"
    );
    let hashed = ProxyProcess::spawn(&config(&ring, Some(&hash)), &upstream, &db).await;
    let replay = client_for(hashed.addr)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(upstream.executions(), 1);
}

/// A proxy that starts while the store cannot be reached has not agreed the key form yet:
/// keyed requests get `503` (and nothing is forwarded) until the store answers and agrees;
/// a store of another form keeps them refused, said in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_wait_for_the_key_form_when_the_store_was_down_at_start() {
    let db = Backend::postgres().await;
    let dir = TempDir::new("form-later");
    let (ring, hash) = (key_file(&dir, "ring", 1), key_file(&dir, "hash", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let through_relay = |yaml: String| yaml.replace("{store}", &pg_store_yaml(&url));

    // Agreed once the store is back: served.
    relay.cut();
    let proxy =
        ProxyProcess::spawn(&through_relay(config(&ring, Some(&hash))), &upstream, &db).await;
    let held = client_for(proxy.addr)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert_eq!(held.status, 503, "{held:?}");
    relay.restore();
    let served = eventually(Duration::from_secs(15), || async {
        let r = client_for(proxy.addr)
            .post("/payments", "shop-1", ORDER, &body("a"))
            .await;
        (r.status == 201).then_some(r)
    })
    .await;
    assert!(served.is_some(), "{}", proxy.log_text());
    assert_eq!(upstream.executions(), 1);
    // Log lines name the key by the hash of what the client sent, as without hash_keys,
    // so an operator still finds a customer's lines from their key.
    let logged = idemproxy::key::key_hash("shop-1", ORDER);
    assert!(proxy.log_text().contains(&logged), "{}", proxy.log_text());
    drop(proxy);

    // Another form: held for good, and the log says why.
    relay.cut();
    let wrong = ProxyProcess::spawn(&through_relay(config(&ring, None)), &upstream, &db).await;
    relay.restore();
    let said = eventually(Duration::from_secs(15), || async {
        wrong
            .log_text()
            .contains("encryption.hash_keys: the store's idempotency keys are kept as keyed hashes")
            .then_some(())
    })
    .await;
    assert!(said.is_some(), "{}", wrong.log_text());
    let refused = client_for(wrong.addr)
        .post("/payments", "shop-1", ORDER, &body("a"))
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    let other = client_for(wrong.addr)
        .post("/payments", "shop-1", "another-key", &body("c"))
        .await;
    assert_eq!(other.status, 503, "{other:?}");
    assert_eq!(
        upstream.executions(),
        1,
        "nothing executed twice, nothing new"
    );
}
