//! `encryption:` — the key ring. Keys are read here, at start, from the environment or
//! from files (mounted secrets), never from the configuration file itself: a file is copied
//! into images, repositories and tickets, and a key in it is a key in all of those.

use std::collections::BTreeMap;

use base64::Engine;

use super::Problems;
use crate::config::file::{FileEncryption, FileSecret, FileSecretSpec, WordOr};
use crate::config::model::{Encryption, RingKey};
use crate::vault::{KEY_BYTES, KeyMaterial};

/// Longest key id: it is kept in every row.
const MAX_ID: usize = 64;

/// The environment secrets are read from: the given one, or the process's.
type Env<'a> = Option<&'a std::collections::HashMap<String, String>>;

pub(super) fn build_encryption(
    p: &mut Problems,
    file: Option<&FileEncryption>,
    env: Env<'_>,
) -> Option<Encryption> {
    let file = file?;
    let keys = match &file.keys {
        Some(keys) if !keys.is_empty() => keys,
        _ => {
            p.push(
                "encryption.keys",
                "list at least one key: `ID: { env: NAME }` or `ID: { file: PATH }` (32 random bytes in base64: `openssl rand -base64 32`)",
            );
            return None;
        }
    };
    let ring = read_keys(p, keys, env);
    let active = match (&file.active, keys.len()) {
        (Some(active), _) => active.clone(),
        (None, 1) => keys.keys().next().cloned().unwrap_or_default(),
        (None, _) => {
            p.push(
                "encryption.active",
                format!(
                    "required with more than one key: name the one new answers are sealed with (one of {})",
                    ids(keys)
                ),
            );
            return None;
        }
    };
    if !keys.contains_key(&active) {
        p.push(
            "encryption.active",
            format!("`{active}` is not one of encryption.keys ({})", ids(keys)),
        );
        return None;
    }
    let ring = ring?;
    Some(Encryption { keys: ring, active })
}

fn ids(keys: &BTreeMap<String, FileSecretSpec>) -> String {
    let ids: Vec<String> = keys.keys().map(|id| format!("`{id}`")).collect();
    ids.join(", ")
}

/// Every key, or `None` when any of them could not be read (each problem named).
fn read_keys(
    p: &mut Problems,
    keys: &BTreeMap<String, FileSecretSpec>,
    env: Env<'_>,
) -> Option<Vec<RingKey>> {
    let mut ring = Vec::with_capacity(keys.len());
    let mut ok = true;
    for (id, spec) in keys {
        let path = format!("encryption.keys.{id}");
        let valid_id = !id.is_empty()
            && id.len() <= MAX_ID
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_id {
            p.push(
                &path,
                format!("a key id is 1 to {MAX_ID} letters, digits, `.`, `_` or `-` (it is kept in every row it seals)"),
            );
            ok = false;
            continue;
        }
        match read_key(spec, env) {
            Ok((source, material)) => ring.push(RingKey {
                id: id.clone(),
                source,
                material,
            }),
            Err(message) => {
                p.push(&path, message);
                ok = false;
            }
        }
    }
    ok.then_some(ring)
}

/// A key's printed source and its bytes.
fn read_key(spec: &FileSecretSpec, env: Env<'_>) -> Result<(String, KeyMaterial), String> {
    let secret = match spec {
        WordOr::Word(_) => {
            return Err(
                "a key is never written in the configuration file: give `{ env: NAME }` (an environment variable) or `{ file: PATH }` (a mounted secret)".to_owned(),
            );
        }
        WordOr::Spec(secret) => secret,
    };
    let quoted = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let (source, text) = match secret {
        FileSecret {
            env: Some(name),
            file: None,
        } => {
            let text = match env {
                Some(env) => env.get(name).cloned().ok_or(std::env::VarError::NotPresent),
                None => std::env::var(name),
            };
            let text = text.map_err(|e| match e {
                std::env::VarError::NotPresent => {
                    format!("environment variable {name} is not set")
                }
                std::env::VarError::NotUnicode(_) => {
                    format!("environment variable {name} is not text (expected base64)")
                }
            })?;
            (format!("{{ env: {} }}", quoted(name)), text)
        }
        FileSecret {
            env: None,
            file: Some(path),
        } => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the key file {path}: {e}"))?;
            (format!("{{ file: {} }}", quoted(path)), text)
        }
        _ => return Err("give exactly one of `env` and `file`".to_owned()),
    };
    let material = decode(text.trim())?;
    Ok((source, material))
}

fn decode(text: &str) -> Result<KeyMaterial, String> {
    let hint = "32 random bytes in base64, e.g. from `openssl rand -base64 32`";
    if text.is_empty() {
        return Err(format!("the key is empty: expected {hint}"));
    }
    let engine = base64::engine::general_purpose::STANDARD;
    let bytes = engine
        .decode(text)
        .map_err(|_| format!("the key is not base64: expected {hint}"))?;
    let material: [u8; KEY_BYTES] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("the key is {} bytes long: expected {hint}", bytes.len()))?;
    if material.iter().all(|b| *b == material[0]) {
        return Err(format!(
            "the key is one byte repeated, not a random key: expected {hint}"
        ));
    }
    Ok(KeyMaterial(material))
}

#[cfg(test)]
mod tests {
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
}
