//! The store fails under the proxy — cut off, or its disk full — while it holds answers it
//! could not write; and wrong files at start. "Executed once while the proxy held the
//! answer" is the assertion, with `takeover: never` too.

use crate::support;
use idemproxy::store::{EmbeddedStore, KeyState};

use std::time::Duration;

use support::volume::Volume;
use support::*;

const BODY: &str = PAYMENT_BODY;
const KEYS: usize = 6;

/// `PAYMENTS` with a 3 s lease, and `takeover: never` on the payments route when `never`.
fn payments(store: &str, never: bool) -> String {
    let yaml = PAYMENTS
        .replace("{store}", store)
        .replace("  lease: 30s\n", "  lease: 3s\n");
    if never {
        yaml.replace(
            "    require_key: true\n",
            "    require_key: true\n    takeover: never\n",
        )
    } else {
        yaml
    }
}

/// An embedded store file on an 8 MiB volume of the test's own: the volume, the file, and
/// the `store:` section; `None` where no volume can be mounted.
fn embedded_on_a_small_volume() -> Option<(Volume, std::path::PathBuf, String)> {
    let volume = Volume::mount("8m")?;
    let path = volume.join("keys.db");
    let store = format!(
        "store:\n  embedded:\n    path: \"{}\"\n    timeout: 1s\n",
        path.display()
    );
    Some((volume, path, store))
}

/// Retries every key once; each must be the replay of the first answer.
async fn assert_replays(client: &TestClient, first: &[Reply], when: &str) {
    for (i, answered) in first.iter().enumerate() {
        let retry = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(
            retry.status,
            201,
            "{when}: key k{i}: {} {}",
            retry.status,
            String::from_utf8_lossy(&retry.body)
        );
        assert!(retry.replayed(), "{when}: key k{i} is a replay");
        assert_eq!(
            retry.body, answered.body,
            "{when}: key k{i}: the first answer"
        );
    }
}

/// The store is cut while six slow payments run: their answers cannot be written, and
/// their leases run out while it stays away. Retries reaching the same proxy get the held
/// answers while the store is away and the moment it is back — never a takeover that runs
/// the payment again, and with `takeover: never` never a final "outcome unknown" — and the
/// held answers are written once it answers.
async fn held_answers_survive_a_store_outage(never: bool) {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    let yaml = payments(&pg_store_yaml(&url), never);
    let proxy = TestProxy::spawn(&yaml, &upstream, &db).await;
    let client = TestClient::new(&proxy);

    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .post_each_key_at_once(KEYS, "/payments", "shop-1", "k", BODY)
                .await
        })
    };
    upstream.wait_executions(KEYS).await;
    relay.cut();
    let first = first.await.unwrap();
    // `post_each_key_at_once` answers in completion order: each key's retry must equal
    // one of the first answers.
    let bodies: Vec<_> = first.iter().map(|r| r.body.clone()).collect();
    for reply in &first {
        assert_eq!(reply.status, 201, "the clients get the upstream's answers");
    }
    assert_eq!(
        metric(proxy.admin, "idemproxy_held_answers").await,
        KEYS as f64
    );

    // While the store is away, and after the leases ran out.
    let mut held = Vec::new();
    for i in 0..KEYS {
        let retry = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(retry.status, 201, "store away: {:?}", retry.body);
        assert!(retry.replayed());
        assert!(bodies.contains(&retry.body));
        held.push(retry);
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_replays(&client, &held, "store away, leases run out").await;

    // The moment the store is back: the retries race the held writes.
    relay.restore();
    assert_replays(&client, &held, "store back").await;
    assert_eq!(upstream.executions(), KEYS, "nothing executed twice");

    let written = eventually(Duration::from_secs(20), || async {
        let mut done = 0;
        for i in 0..KEYS {
            let record = db.lookup("shop-1", &format!("k{i}")).await?;
            if record.state == KeyState::Done {
                done += 1;
            }
        }
        (done == KEYS).then_some(())
    })
    .await;
    assert!(written.is_some(), "the held answers were written");
    assert_eq!(metric(proxy.admin, "idemproxy_held_answers").await, 0.0);
    assert_replays(&client, &held, "written").await;
    assert_eq!(upstream.executions(), KEYS);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_answers_survive_a_store_outage_takeover_execute() {
    held_answers_survive_a_store_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_answers_survive_a_store_outage_takeover_never() {
    held_answers_survive_a_store_outage(true).await;
}

/// The embedded store's volume fills up while payments run: their answers are held and
/// replayed, new keys are refused with `503` and nothing forwarded, readiness and the
/// metric say the disk is full; once space returns the held answers are written, nothing
/// was executed twice, and new keys work again without a restart.
async fn embedded_disk_full(never: bool) {
    let Some((volume, path, store)) = embedded_on_a_small_volume() else {
        return;
    };
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(800),
        // Answers large enough that writing them needs room the full volume lacks.
        pad_to: 200 * 1024,
        ..Default::default()
    })
    .await;
    let unused = Backend::embedded();
    let proxy = TestProxy::spawn(&payments(&store, never), &upstream, &unused).await;
    let client = TestClient::new(&proxy);
    let warm = client.post("/payments", "shop-1", "warm", BODY).await;
    assert_eq!(warm.status, 201);

    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .post_each_key_at_once(KEYS, "/payments", "shop-1", "k", BODY)
                .await
        })
    };
    upstream.wait_executions(KEYS + 1).await;
    volume.fill();
    let first = first.await.unwrap();
    for reply in &first {
        assert_eq!(reply.status, 201, "the clients get the upstream's answers");
    }
    let held: f64 = metric(proxy.admin, "idemproxy_held_answers").await;
    assert!(
        held > 0.0,
        "some answers could not be written on a full disk"
    );

    let mut replies = Vec::new();
    for i in 0..KEYS {
        let retry = client
            .post("/payments", "shop-1", &format!("k{i}"), BODY)
            .await;
        assert_eq!(retry.status, 201, "disk full: {:?}", retry.body);
        replies.push(retry);
    }
    let refused = client.post("/payments", "shop-1", "new", BODY).await;
    assert_eq!(refused.status, 503, "a new key on a full disk");
    assert!(refused.is_problem());
    assert_eq!(upstream.executions(), KEYS + 1, "nothing forwarded");
    let ready = TestClient::at(proxy.admin)
        .send("GET", "/readyz", &[], "")
        .await;
    assert_eq!(ready.status, 503, "not ready while the disk is full");
    assert!(ready.detail().contains("disk full"), "{}", ready.detail());
    assert_eq!(
        metric(proxy.admin, "idemproxy_store_fault{kind=\"disk_full\"}").await,
        1.0
    );
    let replay = client.post("/payments", "shop-1", "warm", BODY).await;
    assert!(replay.replayed(), "stored answers keep replaying");

    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_replays(&client, &replies, "disk full, leases run out").await;
    volume.free();
    assert_replays(&client, &replies, "space back").await;
    assert_eq!(upstream.executions(), KEYS + 1, "nothing executed twice");

    let written = eventually(Duration::from_secs(20), || async {
        (metric(proxy.admin, "idemproxy_held_answers").await == 0.0).then_some(())
    })
    .await;
    assert!(written.is_some(), "the held answers were written");
    let fresh = client.post("/payments", "shop-1", "after", BODY).await;
    assert_eq!(fresh.status, 201, "new keys work again");
    assert_replays(&client, &replies, "written").await;
    assert_eq!(upstream.executions(), KEYS + 2);
    let ready = eventually(Duration::from_secs(15), || async {
        let r = TestClient::at(proxy.admin)
            .send("GET", "/readyz", &[], "")
            .await;
        (r.status == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "ready again");
    proxy.stop().await;
    let store = EmbeddedStore::open(&path, Duration::from_secs(1)).unwrap();
    for i in 0..KEYS {
        use idemproxy::store::Inspect;
        let record = store.lookup("shop-1", &format!("k{i}")).await.unwrap();
        assert_eq!(record.map(|r| r.state), Some(KeyState::Done), "k{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_disk_full_takeover_execute() {
    embedded_disk_full(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_disk_full_takeover_never() {
    embedded_disk_full(true).await;
}

/// A file that is not an SQLite database is refused at start, named, with the cause once.
#[test]
fn a_file_that_is_not_a_database_is_refused_by_name() {
    let dir = TempDir::new("not-a-db");
    let path = dir.join("keys.db");
    std::fs::write(&path, vec![b'x'; 8192]).unwrap();
    let err = EmbeddedStore::open_exclusive(&path, Duration::from_secs(1), true)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("not an SQLite database"), "{err}");
    assert_eq!(err.matches("not a").count(), 1, "the cause once: {err}");
    assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 8192], "untouched");
}

/// Another application's SQLite database is refused, and gets none of our tables.
#[test]
fn a_foreign_database_is_refused_and_left_alone() {
    let dir = TempDir::new("foreign-db");
    let path = dir.join("app.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);")
            .unwrap();
    }
    let err = EmbeddedStore::open_exclusive(&path, Duration::from_secs(1), true)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("another application's"), "{err}");
    assert!(err.contains("users"), "{err}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1, "no table of ours was added");
}

/// A store file of ours opens again; one made before files were marked (no application
/// id, our tables) is taken as ours and marked.
#[test]
fn our_files_open_marked_or_not() {
    let dir = TempDir::new("ours-db");
    let path = dir.join("keys.db");
    drop(EmbeddedStore::open(&path, Duration::from_secs(1)).unwrap());
    let id = |path: &std::path::Path| -> i64 {
        rusqlite::Connection::open(path)
            .unwrap()
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap()
    };
    let ours = id(&path);
    assert_ne!(ours, 0, "a new file is marked");
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "application_id", 0)
        .unwrap();
    drop(EmbeddedStore::open(&path, Duration::from_secs(1)).unwrap());
    assert_eq!(id(&path), ours, "an unmarked file of ours is marked");
}

/// A writable store file in a directory the proxy's user cannot write: the error names
/// the directory and why (SQLite must create `-wal` and `-shm` beside the file), not
/// "attempt to write a readonly database". Run as an unprivileged user (root writes
/// anywhere).
#[test]
fn an_unwritable_directory_is_named() {
    let dir = TempDir::new("ro-dir");
    let path = dir.join("keys.db");
    drop(EmbeddedStore::open(&path, Duration::from_secs(1)).unwrap());
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(&format!("keys.db{suffix}")));
    }
    let config = dir.join("idemproxy.yaml");
    std::fs::write(
        &config,
        format!(
            "upstream:\n  url: http://127.0.0.1:9\nstore:\n  embedded:\n    path: \"{}\"\n",
            path.display()
        ),
    )
    .unwrap();
    let chmod = |mode: &str, p: &std::path::Path| {
        std::process::Command::new("chmod")
            .arg(mode)
            .arg(p)
            .status()
            .unwrap();
    };
    chmod("0666", &path);
    chmod("0644", &config);
    chmod("0755", &dir.0);
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(env!("CARGO_BIN_EXE_idemproxy"))
        .args(["sweep", "--config"])
        .env_remove("DATABASE_URL")
        .arg(&config)
        .output();
    let Some(out) = out
        .ok()
        .filter(|o| !String::from_utf8_lossy(&o.stderr).contains("runuser:"))
    else {
        eprintln!("runuser is not available here: this test needs root");
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "the directory {} cannot be written",
            dir.0.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("-wal"), "{stderr}");
}

/// The binary on a full volume: the refusals make one ERROR line that names the store,
/// the file, the fault and the reason once — not a WARN line per refused request — and
/// the end of the fault is said once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_said_once() {
    let Some((volume, path, store)) = embedded_on_a_small_volume() else {
        return;
    };
    let upstream = Upstream::spawn(Behavior {
        pad_to: 100 * 1024,
        ..Default::default()
    })
    .await;
    let proxy =
        ProxyProcess::spawn(&payments(&store, false), &upstream, &Backend::embedded()).await;
    let client = client_for(proxy.addr);
    assert_eq!(
        client.post("/payments", "shop-1", "w", BODY).await.status,
        201
    );
    volume.fill();
    let mut refused = 0;
    for i in 0..20 {
        let reply = client
            .post("/payments", "shop-1", &format!("n{i}"), BODY)
            .await;
        if reply.status == 503 {
            refused += 1;
        }
    }
    assert!(refused >= 15, "new keys refused on a full disk: {refused}");
    volume.free();
    let back = eventually(Duration::from_secs(20), || {
        let client = client.clone();
        async move {
            let reply = client.post("/payments", "shop-1", "back", BODY).await;
            (reply.status == 201).then_some(())
        }
    })
    .await;
    assert!(back.is_some(), "new keys work again");
    // The fault ends with a write after it settled.
    let ended = eventually(Duration::from_secs(20), || {
        let client = client.clone();
        let log = proxy.log_text();
        async move {
            if log.contains("store fault over") {
                return Some(());
            }
            let _ = client
                .post("/payments", "shop-1", &format!("later-{}", log.len()), BODY)
                .await;
            None
        }
    })
    .await;
    let log = proxy.log_text();
    assert!(ended.is_some(), "{log}");
    let began: Vec<&str> = log.lines().filter(|l| l.contains("store fault:")).collect();
    assert_eq!(began.len(), 1, "{log}");
    let line = began[0];
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("disk_full"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert_eq!(
        line.matches("database or disk is full").count(),
        1,
        "the cause once: {line}"
    );
    assert_eq!(log.matches("store fault over").count(), 1, "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("request failed") && l.contains("503")),
        "no WARN line per refused request: {log}"
    );
}

/// Two replicas: the one whose store link is cut holds its answer while another replica,
/// after the lease ran out, takes the key over and stores its own. From then on every
/// client gets the stored answer — a retry reaching the first replica too, not the answer
/// it held (once an answer is stored, it is the one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_answer_gives_way_to_a_stored_one() {
    let db = Backend::postgres().await;
    let (relay, url) = Relay::for_db(db.pg()).await;
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let cut_off = TestProxy::spawn(&payments(&pg_store_yaml(&url), false), &upstream, &db).await;
    let other = TestProxy::spawn(&payments("{store}", false), &upstream, &db).await;
    let held_client = TestClient::new(&cut_off);
    let first = {
        let client = held_client.clone();
        tokio::spawn(async move { client.post("/payments", "shop-1", "k", BODY).await })
    };
    upstream.wait_executions(1).await;
    relay.cut();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let held = held_client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(held.body, first.body, "held while the store is away");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let taken_over = TestClient::new(&other)
        .post_until_settled("/payments", "shop-1", "k", BODY)
        .await;
    assert_eq!(taken_over.status, 201);
    assert_ne!(taken_over.body, first.body, "the takeover executed again");
    relay.restore();
    let after = held_client.post("/payments", "shop-1", "k", BODY).await;
    assert_eq!(after.status, 201);
    assert!(after.replayed());
    assert_eq!(
        after.body, taken_over.body,
        "the stored answer, not the one held"
    );
    cut_off.stop().await;
    other.stop().await;
}
