//! `encryption:` as the configuration file gives it: rings that load, and every mistake
//! named by its key.

use crate::config::{Overrides, StoreConfig, load_str};

const UP: &str = "upstream:\n  url: http://127.0.0.1:3000\n";

/// A key file in a directory of its own, removed with it.
struct KeyDir(std::path::PathBuf);

impl KeyDir {
    fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idemproxy-enc-config-{label}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        Self(dir)
    }

    fn key(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap_or_default();
        path.display().to_string()
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const GOOD: &str = "2rLQmMHK8U2n0M1cQ0QmYvXq2oN7l3tq9Q3Z0ZqY1kM=\n";

fn problems(text: &str) -> String {
    match load_str(text, &Overrides::default()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_ring_of_files_loads_and_prints_without_its_bytes() {
    let dir = KeyDir::new("good");
    let (a, b) = (
        dir.key("a", GOOD),
        dir.key("b", "  bm90IGEga2V5IGJ1dCAzMiBieXRlcyBsb25nISEhISE=  "),
    );
    let text = format!(
        "{UP}encryption:\n  keys:\n    old-1: {{ file: \"{a}\" }}\n    new.2: {{ file: \"{b}\" }}\n  active: new.2\n"
    );
    let config = load_str(&text, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    let ring = config.encryption.as_ref().map(|e| e.vault());
    assert_eq!(ring.as_ref().map(|v| v.active()), Some("new.2"));
    assert!(ring.is_some_and(|v| v.has("old-1")));
    let printed = config.to_string();
    assert!(printed.contains("active: \"new.2\""), "{printed}");
    assert!(!printed.contains("2rLQ"), "never the key: {printed}");
    let again = load_str(&printed, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.encryption, config.encryption);
    assert!(!format!("{:?}", config.encryption).contains("2rLQ"));
}

#[test]
fn keys_come_from_the_environment_given() {
    let text = format!("{UP}encryption:\n  keys:\n    k: {{ env: RING_K }}\n");
    let env = [("RING_K".to_owned(), GOOD.trim().to_owned())].into();
    let overrides = Overrides {
        env: Some(env),
        ..Overrides::default()
    };
    let config = load_str(&text, &overrides).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.encryption.is_some_and(|e| e.vault().has("k")));
    assert!(problems(&text).contains("environment variable RING_K is not set"));
}

#[test]
fn one_key_is_the_active_one() {
    let dir = KeyDir::new("one");
    let a = dir.key("a", GOOD);
    let text = format!("{UP}encryption:\n  keys:\n    k: {{ file: \"{a}\" }}\n");
    let config = load_str(&text, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.encryption.map(|e| e.active), Some("k".to_owned()));
}

#[test]
fn every_mistake_is_named_by_its_key() {
    let dir = KeyDir::new("bad");
    let (good, short, junk, same) = (
        dir.key("good", GOOD),
        dir.key("short", "c2hvcnQ="),
        dir.key("junk", "not base64 at all!"),
        dir.key("same", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    );
    let cases = [
        (
            "    k: 2rLQmMHK8U2n0M1cQ0QmYvXq2oN7l3tq9Q3Z0ZqY1kM=\n".to_owned(),
            "encryption.keys.k: a key is never written in the configuration file",
        ),
        (
            "    k: { env: IDEMPROXY_TEST_SURELY_UNSET_KEY }\n".to_owned(),
            "encryption.keys.k: environment variable IDEMPROXY_TEST_SURELY_UNSET_KEY is not set",
        ),
        (
            "    k: { file: /nonexistent/idemproxy/key }\n".to_owned(),
            "encryption.keys.k: cannot read the key file /nonexistent/idemproxy/key",
        ),
        (
            format!("    k: {{ file: \"{short}\" }}\n"),
            "encryption.keys.k: the key is 5 bytes long: expected 32 random bytes in base64",
        ),
        (
            format!("    k: {{ file: \"{junk}\" }}\n"),
            "encryption.keys.k: the key is not base64",
        ),
        (
            format!("    k: {{ file: \"{same}\" }}\n"),
            "encryption.keys.k: the key is one byte repeated",
        ),
        (
            format!("    k: {{ file: \"{good}\", env: X }}\n"),
            "encryption.keys.k: give exactly one of `env` and `file`",
        ),
        (
            format!("    \"k 1\": {{ file: \"{good}\" }}\n"),
            "a key id is 1 to 64 letters",
        ),
        (
            format!("    a: {{ file: \"{good}\" }}\n    b: {{ file: \"{good}\" }}\n"),
            "encryption.active: required with more than one key",
        ),
        (
            format!("    a: {{ file: \"{good}\" }}\n  active: b\n"),
            "encryption.active: `b` is not one of encryption.keys (`a`)",
        ),
        ("    {}\n".to_owned(), "encryption.keys"),
    ];
    for (keys, expected) in cases {
        let text = format!("{UP}encryption:\n  keys:\n{keys}");
        let found = problems(&text);
        assert!(found.contains(expected), "{keys}\n→ {found}");
    }
    assert!(
        problems(&format!("{UP}encryption:\n  active: a\n"))
            .contains("encryption.keys: list at least one key")
    );
}

#[test]
fn postgres_without_encryption_is_warned_about() {
    let pg = format!("{UP}store:\n  postgres:\n    url: postgres://u@127.0.0.1/db\n");
    let config = load_str(&pg, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(config.store, StoreConfig::Postgres(_)));
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("encryption is off")),
        "{:?}",
        config.warnings
    );
    let embedded = load_str(UP, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(embedded.warnings.is_empty(), "{:?}", embedded.warnings);
    let dir = KeyDir::new("warn");
    let a = dir.key("a", GOOD);
    let sealed = format!("{pg}encryption:\n  keys:\n    k: {{ file: \"{a}\" }}\n");
    let config = load_str(&sealed, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn hashed_keys_need_their_own_secret() {
    let dir = KeyDir::new("hash");
    let (ring, hash, other) = (
        dir.key("ring", GOOD),
        dir.key("hash", "bm90IGEga2V5IGJ1dCAzMiBieXRlcyBsb25nISEhISE=\n"),
        dir.key("other", "b3RoZXIga2V5IGJ1dCAzMiBieXRlcyBsb25nISEhISE=\n"),
    );
    let ring = format!("{UP}encryption:\n  keys:\n    k: {{ file: \"{ring}\" }}\n");
    let with = |extra: &str| format!("{ring}{extra}");
    let hashed = with(&format!(
        "  hash_keys: true\n  hash_key: {{ file: \"{hash}\" }}\n"
    ));
    let config = load_str(&hashed, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    let form = config.encryption.as_ref().map(|e| e.key_form());
    assert!(form.as_ref().is_some_and(|f| f.is_hashed()));
    let printed = config.to_string();
    assert!(printed.contains("hash_keys: true"), "{printed}");
    assert!(!printed.contains("bm90"), "never the secret: {printed}");
    // The printed form names the secret's verifier, so a reload that changed its bytes
    // differs from the running configuration (restart only).
    let marker = form.map(|f| f.marker().to_owned()).unwrap_or_default();
    assert!(printed.contains(&marker), "{printed}");
    let changed = with(&format!(
        "  hash_keys: true\n  hash_key: {{ file: \"{other}\" }}\n"
    ));
    let changed = load_str(&changed, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(
        changed.encryption.map(|e| e.key_form().marker().to_owned()),
        Some(marker)
    );

    let plain = load_str(&ring, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(plain.encryption.is_some_and(|e| !e.key_form().is_hashed()));
    for (extra, expected) in [
        (
            "  hash_keys: true\n".to_owned(),
            "encryption.hash_key: required with `hash_keys: true`",
        ),
        (
            format!("  hash_key: {{ file: \"{hash}\" }}\n"),
            "encryption.hash_key: given without `hash_keys: true`",
        ),
        (
            "  hash_keys: true\n  hash_key: bm90IGEga2V5IGJ1dCAzMiBieXRlcyBsb25nISEhISE=\n"
                .to_owned(),
            "encryption.hash_key: a key is never written in the configuration file",
        ),
        (
            "  hash_keys: true\n  hash_key: { env: IDEMPROXY_TEST_SURELY_UNSET_HASH }\n".to_owned(),
            "encryption.hash_key: environment variable IDEMPROXY_TEST_SURELY_UNSET_HASH is not set",
        ),
    ] {
        let found = problems(&with(&extra));
        assert!(found.contains(expected), "{extra}: {found}");
    }
}

#[test]
fn hashed_keys_refuse_the_reconciler() {
    let dir = KeyDir::new("hash-probe");
    let (ring, hash) = (dir.key("ring", GOOD), dir.key("hash", GOOD));
    let text = format!(
        "{UP}routes:\n  - name: pay\n    path: /pay\n    recovery_probe:\n      method: GET\n      path: /payments/{{key}}\nreconcile: {{}}\nencryption:\n  keys:\n    k: {{ file: \"{ring}\" }}\n  hash_keys: true\n  hash_key: {{ file: \"{hash}\" }}\n"
    );
    let found = problems(&text);
    assert!(
        found.contains("encryption.hash_keys: the reconciler (`reconcile:`) asks"),
        "{found}"
    );
    // Without the reconciler, a probe is asked by retries, which carry the clear key.
    let without = text.replace("reconcile: {}\n", "");
    assert_eq!(problems(&without), "");
}
