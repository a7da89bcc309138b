//! Stored answers sealed at rest (`encryption:`), on both stores: what is stored is not the
//! answer's bytes, a replay is the answer exactly, keys rotate (old rows keep replaying,
//! `rekey` moves them, then the old key can go), and an answer that cannot be opened — its
//! key gone, or its ciphertext copied from another row — is a `500` problem and never a
//! second execution.

use crate::support;

use std::path::Path;

use support::at_rest::*;
use support::*;

/// What the upstream echoes back in its answer: found in the table only if it was stored in
/// clear.
const MARKER: &str = "Jane-Q-Cardholder-4242";

fn body(purpose: &str) -> String {
    format!(r#"{{"amount":100,"currency":"RUB","recipient":"{MARKER}","purpose":"{purpose}"}}"#)
}

/// `PAYMENTS` with an `encryption:` section of `keys` (id, file) and `active`.
fn config(keys: &[(&str, &Path)], active: Option<&str>) -> String {
    if keys.is_empty() {
        return PAYMENTS.to_owned();
    }
    let mut yaml = format!("{PAYMENTS}encryption:\n  keys:\n");
    for (id, path) in keys {
        yaml.push_str(&format!("    {id}: {{ file: \"{}\" }}\n", path.display()));
    }
    if let Some(active) = active {
        yaml.push_str(&format!("  active: {active}\n"));
    }
    yaml
}

/// With encryption on, neither the answer's body nor its headers are in the store, yet the
/// retry gets them back exactly; the admin API shows which key sealed the row and the
/// answer's own length, never the answer. Without encryption the same check finds the
/// marker, so the check itself can fail.
async fn answers_are_sealed_at_rest(db: Backend) {
    let dir = TempDir::new("sealed");
    let k1 = key_file(&dir, "k1", 1);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client
        .post("/payments", "shop-1", "s-1", &body("s-1"))
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(String::from_utf8_lossy(&first.body).contains(MARKER));
    let again = client
        .post("/payments", "shop-1", "s-1", &body("s-1"))
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(
        again.body, first.body,
        "the replay is the answer, byte for byte"
    );
    assert_eq!(again.headers.get("location"), first.headers.get("location"));
    assert_eq!(
        again.headers.get("content-type"),
        first.headers.get("content-type")
    );
    assert_eq!(upstream.executions(), 1);
    assert!(
        !stored_in_clear(&db, MARKER).await,
        "the body is stored sealed"
    );
    assert!(
        !stored_in_clear(&db, "/payments/1").await,
        "the stored headers are sealed too"
    );
    let row = db.lookup("shop-1", "s-1").await.unwrap();
    assert_eq!(row.sealed_with.as_deref(), Some("k1"));
    assert_eq!(row.response_body_bytes, Some(first.body.len() as i64));
    let admin = TestClient::at(proxy.admin)
        .send("GET", "/admin/keys/shop-1/s-1", &[], "")
        .await;
    assert_eq!(admin.json()["encryption_key"], "k1");
    assert!(!String::from_utf8_lossy(&admin.body).contains(MARKER));
    proxy.stop().await;

    // The control: the same answer stored without encryption is found by the same check.
    let clear = TestProxy::spawn(&config(&[], None), &upstream, &db).await;
    let reply = TestClient::new(&clear)
        .post("/payments", "shop-1", "s-2", &body("s-2"))
        .await;
    assert_eq!(reply.status, 201);
    assert!(stored_in_clear(&db, MARKER).await);
    assert_eq!(db.lookup("shop-1", "s-2").await.unwrap().sealed_with, None);
    clear.stop().await;
}

/// Rotation: a second key becomes active; rows sealed with the first (and rows stored in
/// clear before encryption was on) still replay; `POST /admin/rekey` seals them all with
/// the active key; then the first key can be removed and everything still replays. No
/// operation runs twice.
async fn keys_rotate_and_rekey_moves_rows(db: Backend) {
    let dir = TempDir::new("rotate");
    let (k1, k2) = (key_file(&dir, "k1", 1), key_file(&dir, "k2", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let replay = async |proxy: &TestProxy, key: &str| {
        let reply = TestClient::new(proxy)
            .post("/payments", "shop-1", key, &body(key))
            .await;
        assert!(reply.replayed(), "{key}: {reply:?}");
        assert!(String::from_utf8_lossy(&reply.body).contains(key));
    };

    let clear = TestProxy::spawn(&config(&[], None), &upstream, &db).await;
    let r0 = TestClient::new(&clear)
        .post("/payments", "shop-1", "r-0", &body("r-0"))
        .await;
    assert_eq!(r0.status, 201);
    clear.stop().await;

    let first = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let r1 = TestClient::new(&first)
        .post("/payments", "shop-1", "r-1", &body("r-1"))
        .await;
    assert_eq!(r1.status, 201);
    replay(&first, "r-0").await;
    first.stop().await;

    let both = config(&[("k1", &k1), ("k2", &k2)], Some("k2"));
    let rotated = TestProxy::spawn(&both, &upstream, &db).await;
    let r2 = TestClient::new(&rotated)
        .post("/payments", "shop-1", "r-2", &body("r-2"))
        .await;
    assert_eq!(r2.status, 201);
    for key in ["r-0", "r-1", "r-2"] {
        replay(&rotated, key).await;
    }
    let sealed_with = async |key: &str| db.lookup("shop-1", key).await.unwrap().sealed_with;
    assert_eq!(sealed_with("r-0").await, None);
    assert_eq!(sealed_with("r-1").await.as_deref(), Some("k1"));
    assert_eq!(sealed_with("r-2").await.as_deref(), Some("k2"));

    let rekey = TestClient::at(rotated.admin)
        .send("POST", "/admin/rekey", &[], "")
        .await;
    assert_eq!(rekey.status, 200, "{rekey:?}");
    let report = rekey.json();
    assert_eq!(report["resealed"], 2, "{report}");
    assert_eq!(report["active"], "k2");
    for key in ["r-0", "r-1", "r-2"] {
        assert_eq!(sealed_with(key).await.as_deref(), Some("k2"), "{key}");
    }
    let again = TestClient::at(rotated.admin)
        .send("POST", "/admin/rekey", &[], "")
        .await;
    assert_eq!(again.json()["resealed"], 0, "nothing left to move");
    rotated.stop().await;

    let only_new = TestProxy::spawn(&config(&[("k2", &k2)], None), &upstream, &db).await;
    for key in ["r-0", "r-1", "r-2"] {
        replay(&only_new, key).await;
    }
    assert!(!stored_in_clear(&db, MARKER).await);
    assert_eq!(upstream.executions(), 3, "each operation ran once");
    only_new.stop().await;
}

/// An answer whose key is no longer in the ring is a `500` problem naming no secret, counted
/// and logged — and the operation is not executed again. With the key back, it replays.
async fn a_missing_key_is_a_problem_not_a_second_execution(db: Backend) {
    let dir = TempDir::new("missing");
    let (k1, k2) = (key_file(&dir, "k1", 1), key_file(&dir, "k2", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let first = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let reply = TestClient::new(&first)
        .post("/payments", "shop-1", "m-1", &body("m-1"))
        .await;
    assert_eq!(reply.status, 201);
    first.stop().await;

    for (yaml, what) in [
        (config(&[("k2", &k2)], None), "key removed from the ring"),
        (config(&[], None), "encryption turned off"),
    ] {
        let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
        let retry = TestClient::new(&proxy)
            .post("/payments", "shop-1", "m-1", &body("m-1"))
            .await;
        assert_eq!(retry.status, 500, "{what}: {retry:?}");
        assert_eq!(
            retry.headers.get("content-type").unwrap(),
            "application/problem+json"
        );
        assert_eq!(
            retry.json()["type"],
            "urn:idemproxy:problem:stored-answer-unreadable"
        );
        assert!(!retry.detail().contains("k1"), "no key id to clients");
        assert!(!String::from_utf8_lossy(&retry.body).contains(MARKER));
        let counted = metric(
            proxy.admin,
            "idemproxy_stored_answers_unreadable_total{route=\"create-payment\"}",
        )
        .await;
        assert_eq!(counted, 1.0, "{what}");
        proxy.stop().await;
    }
    assert_eq!(upstream.executions(), 1, "never executed again");

    let back = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let retry = TestClient::new(&back)
        .post("/payments", "shop-1", "m-1", &body("m-1"))
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, reply.body);
    back.stop().await;
}

/// A sealed answer copied onto another row (another key's, or the same key's after it was
/// evicted and executed again) does not open there: associated data binds it to its row's
/// client, key and lease token. Nothing is replayed from it and nothing executes again.
async fn a_copied_answer_does_not_open(db: Backend) {
    let dir = TempDir::new("copied");
    let k1 = key_file(&dir, "k1", 1);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let yaml = config(&[("k1", &k1)], None);
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    for key in ["c-1", "c-2"] {
        assert_eq!(
            client
                .post("/payments", "shop-1", key, &body(key))
                .await
                .status,
            201
        );
    }
    copy_answer(&db, "c-1", "c-2").await;
    let retry = client
        .post("/payments", "shop-1", "c-2", &body("c-2"))
        .await;
    assert_eq!(retry.status, 500, "{retry:?}");
    assert_eq!(
        retry.json()["type"],
        "urn:idemproxy:problem:stored-answer-unreadable"
    );
    let original = client
        .post("/payments", "shop-1", "c-1", &body("c-1"))
        .await;
    assert!(original.replayed(), "the original row still opens");
    assert_eq!(upstream.executions(), 2);
    // The same answer put back on its own key after a new execution: another lease token.
    let before = raw_answer(&db, "c-1").await;
    let evict = TestClient::at(proxy.admin)
        .send("DELETE", "/admin/keys/shop-1/c-1", &[], "")
        .await;
    assert_eq!(evict.status, 200);
    proxy.stop().await;
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    assert_eq!(
        client
            .post("/payments", "shop-1", "c-1", &body("c-1"))
            .await
            .status,
        201
    );
    put_answer(&db, "c-1", &before).await;
    let retry = client
        .post("/payments", "shop-1", "c-1", &body("c-1"))
        .await;
    assert_eq!(
        retry.status, 500,
        "an older answer of the same key: {retry:?}"
    );
    assert_eq!(upstream.executions(), 3);
    proxy.stop().await;
}

/// A row's stored answer columns: headers, body, sealed_with.
type RawAnswer = (Vec<u8>, Vec<u8>, Option<String>);

async fn raw_answer(db: &Backend, key: &str) -> RawAnswer {
    let sql =
        "SELECT response_headers, response_body, sealed_with FROM idempotency_keys WHERE key = ";
    match db {
        Backend::Postgres(_) => {
            let row = db
                .client()
                .await
                .query_one(&format!("{sql}$1"), &[&key])
                .await
                .unwrap();
            (row.get(0), row.get(1), row.get(2))
        }
        Backend::Embedded(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.query_row(&format!("{sql}?1"), [key], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap()
        }
    }
}

async fn put_answer(db: &Backend, key: &str, answer: &RawAnswer) {
    let (headers, body, sealed_with) = answer;
    match db {
        Backend::Postgres(_) => {
            db.client()
                .await
                .execute(
                    "UPDATE idempotency_keys SET response_headers = $2, response_body = $3, \
                     sealed_with = $4 WHERE key = $1",
                    &[&key, headers, body, sealed_with],
                )
                .await
                .unwrap();
        }
        Backend::Embedded(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute(
                "UPDATE idempotency_keys SET response_headers = ?2, response_body = ?3, \
                 sealed_with = ?4 WHERE key = ?1",
                rusqlite::params![key, headers, body, sealed_with],
            )
            .unwrap();
        }
    }
}

async fn copy_answer(db: &Backend, from: &str, to: &str) {
    let answer = raw_answer(db, from).await;
    put_answer(db, to, &answer).await;
}

/// Rekey from two places at once while a proxy keeps replaying: every row is resealed
/// exactly once between them, no replay fails meanwhile, and every row then opens with the
/// new key alone.
async fn concurrent_rekeys_split_the_rows(db: Backend) {
    let dir = TempDir::new("concurrent-rekey");
    let (k1, k2) = (key_file(&dir, "k1", 1), key_file(&dir, "k2", 2));
    let upstream = Upstream::spawn(Behavior::default()).await;
    let first = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let client = TestClient::new(&first);
    let keys: Vec<String> = (0..120).map(|i| format!("cr-{i}")).collect();
    for key in &keys {
        assert_eq!(
            client
                .post("/payments", "shop-1", key, &body(key))
                .await
                .status,
            201
        );
    }
    first.stop().await;
    let both = config(&[("k1", &k1), ("k2", &k2)], Some("k2"));
    let proxy = TestProxy::spawn(&both, &upstream, &db).await;
    let ring = idemproxy::config::load_str(
        &both
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url()),
        &Default::default(),
    )
    .unwrap()
    .encryption
    .unwrap()
    .vault();
    let ring = std::sync::Arc::new(ring);
    let passes = (0..2).map(|_| {
        let (store, ring) = (db.store(), std::sync::Arc::clone(&ring));
        tokio::spawn(async move {
            idemproxy::background::rekey::once(&store, &ring, 7)
                .await
                .unwrap()
        })
    });
    let passes: Vec<_> = passes.collect();
    let replays = {
        let client = TestClient::new(&proxy);
        let keys = keys.clone();
        tokio::spawn(async move {
            for key in keys.iter().cycle().take(240) {
                let reply = client.post("/payments", "shop-1", key, &body(key)).await;
                assert!(reply.replayed(), "{key}: {reply:?}");
            }
        })
    };
    let mut resealed = 0;
    for pass in passes {
        let report = pass.await.unwrap();
        assert!(report.unreadable.is_empty(), "{report:?}");
        resealed += report.resealed;
    }
    replays.await.unwrap();
    assert_eq!(resealed, keys.len() as u64, "each row resealed once");
    proxy.stop().await;
    let only_new = TestProxy::spawn(&config(&[("k2", &k2)], None), &upstream, &db).await;
    let client = TestClient::new(&only_new);
    for key in &keys {
        assert!(
            client
                .post("/payments", "shop-1", key, &body(key))
                .await
                .replayed()
        );
    }
    assert_eq!(upstream.executions(), keys.len());
    only_new.stop().await;
}

/// A sealed answer replayed from memory (the replay cache keeps what the store returned,
/// sealed) is opened like one read from the store: the retry gets the answer, never the
/// ciphertext.
async fn replays_from_memory_are_opened(db: Backend) {
    let dir = TempDir::new("sealed-cache");
    let k1 = key_file(&dir, "k1", 1);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = client
        .post("/payments", "shop-1", "m-1", &body("m-1"))
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let before = cache_hits(&proxy).await;
    // PostgreSQL's cache serves once its notification connection is up.
    let from_memory = eventually(std::time::Duration::from_secs(30), || async {
        let again = client
            .post("/payments", "shop-1", "m-1", &body("m-1"))
            .await;
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, first.body, "the replay is the answer, opened");
        assert_eq!(again.headers.get("location"), first.headers.get("location"));
        (cache_hits(&proxy).await > before).then_some(())
    })
    .await;
    assert!(from_memory.is_some(), "no replay was answered from memory");
    assert_eq!(upstream.executions(), 1);
    proxy.stop().await;
}

on_every_store!(
    answers_are_sealed_at_rest,
    replays_from_memory_are_opened,
    keys_rotate_and_rekey_moves_rows,
    a_missing_key_is_a_problem_not_a_second_execution,
    a_copied_answer_does_not_open,
    concurrent_rekeys_split_the_rows,
);

/// A binary from before migration 0007 calls `idempotency_reserve` without saying it opens
/// sealed answers: for a sealed row it gets an error (so it fails closed, `503`), never the
/// ciphertext as the answer to replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_replica_cannot_replay_a_sealed_answer() {
    let db = Backend::postgres().await;
    let dir = TempDir::new("old-replica");
    let k1 = key_file(&dir, "k1", 1);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(&config(&[("k1", &k1)], None), &upstream, &db).await;
    let reply = TestClient::new(&proxy)
        .post("/payments", "shop-1", "o-1", &body("o-1"))
        .await;
    assert_eq!(reply.status, 201);
    proxy.stop().await;
    let fingerprint: Vec<u8> = payment_fingerprint_of(&body("o-1"));
    let client = db.client().await;
    // The call as migration 0006's binaries make it: eight arguments.
    let old = client
        .query(
            "SELECT o_outcome, o_response_body FROM idempotency_reserve($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &"shop-1",
                &"o-1",
                &fingerprint,
                &"create-payment",
                &30_000i64,
                &86_400_000i64,
                &true,
                &None::<String>,
            ],
        )
        .await;
    let err = old.expect_err("an old caller must not get the sealed answer");
    assert!(
        err.to_string().contains("encrypted") || format!("{err:?}").contains("encrypted"),
        "{err:?}"
    );
}

/// The fingerprint `/payments` gives `body`.
fn payment_fingerprint_of(body: &str) -> Vec<u8> {
    let fields: Vec<String> = ["/amount", "/currency", "/recipient", "/purpose"]
        .map(String::from)
        .to_vec();
    idemproxy::fingerprint::fingerprint(&idemproxy::fingerprint::Request {
        method: "POST",
        path: "/payments",
        query: None,
        content_type: Some(b"application/json"),
        body: body.as_bytes(),
        fields: Some(&fields),
    })
    .unwrap()
    .to_vec()
}

/// `idemproxy rekey` from outside, as a Kubernetes Job would run it: the key ring from the
/// environment (`{ env: NAME }`), PostgreSQL from the file; a clear row and a row under the
/// old key are resealed with the active key. A row under a key the ring no longer has makes
/// the command fail (it is left as it is), so an operator never removes a key still needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rekey_command_reseals_from_outside() {
    let db = Backend::postgres().await;
    let dir = TempDir::new("rekey-command");
    let k1 = key_file(&dir, "k1", 1);
    let upstream = Upstream::spawn(Behavior::default()).await;
    let store_once = async |yaml: String, key: &str| {
        let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
        let reply = TestClient::new(&proxy)
            .post("/payments", "shop-1", key, &body(key))
            .await;
        assert_eq!(reply.status, 201);
        proxy.stop().await;
    };
    store_once(config(&[], None), "x-0").await;
    store_once(config(&[("k1", &k1)], None), "x-1").await;
    let k1_text = std::fs::read_to_string(&k1).unwrap();
    let k2_text = std::fs::read_to_string(key_file(&dir, "k2", 2)).unwrap();
    let file = |name: &str, ring: &str| {
        let yaml = format!("{PAYMENTS}encryption:\n  keys:\n{ring}  active: k2\n")
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url());
        let path = dir.join(name);
        std::fs::write(&path, yaml).unwrap();
        path
    };
    let both = file(
        "both.yaml",
        "    k1: { env: TEST_KEY_ONE }\n    k2: { env: TEST_KEY_TWO }\n",
    );
    let only_new = file("new.yaml", "    k2: { env: TEST_KEY_TWO }\n");
    let rekey = |config: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
            .args(["rekey", "--batch", "1", "--config"])
            .arg(config)
            // CI exports DATABASE_URL, which would take the place of the file's URL.
            .env_remove("DATABASE_URL")
            .env_remove("IDEMPROXY_CONFIG")
            .env("TEST_KEY_ONE", k1_text.trim())
            .env("TEST_KEY_TWO", k2_text.trim())
            .output()
            .unwrap()
    };
    let out = rekey(&both);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("resealed 2 stored answers with key `k2`"),
        "{stdout}"
    );
    for key in ["x-0", "x-1"] {
        let row = db.lookup("shop-1", key).await.unwrap();
        assert_eq!(row.sealed_with.as_deref(), Some("k2"), "{key}");
    }

    store_once(config(&[("k1", &k1)], None), "x-2").await;
    let out = rekey(&only_new);
    assert!(
        !out.status.success(),
        "a row under k1 cannot be moved without k1"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("1 could not be opened with key `k1`"),
        "{stdout}"
    );
    assert!(stderr.contains("keep those keys"), "{stderr}");
    let row = db.lookup("shop-1", "x-2").await.unwrap();
    assert_eq!(row.sealed_with.as_deref(), Some("k1"), "left as it was");
    assert_eq!(upstream.executions(), 3);
}
