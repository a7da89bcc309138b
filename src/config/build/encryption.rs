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
pub(super) type Env<'a> = Option<&'a std::collections::HashMap<String, String>>;

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
    let hash_key = hash_key(p, file, env);
    let ring = ring?;
    Some(Encryption {
        keys: ring,
        active,
        hash_key: hash_key?,
    })
}

/// `hash_keys` and its secret: both or neither. `None`: a problem was named.
fn hash_key(p: &mut Problems, file: &FileEncryption, env: Env<'_>) -> Option<Option<RingKey>> {
    match (file.hash_keys.unwrap_or(false), &file.hash_key) {
        (false, None) => Some(None),
        (false, Some(_)) => {
            p.push(
                "encryption.hash_key",
                "given without `hash_keys: true`: set it to store idempotency keys as keyed hashes, or leave hash_key out",
            );
            None
        }
        (true, None) => {
            p.push(
                "encryption.hash_key",
                "required with `hash_keys: true`: the secret keys are hashed with, `{ env: NAME }` or `{ file: PATH }` (32 random bytes in base64). It is not a ring key: it must never change while keys are stored",
            );
            None
        }
        (true, Some(spec)) => match read_key(spec, env) {
            Ok((source, material)) => Some(Some(RingKey {
                id: "hash_key".to_owned(),
                source,
                material,
            })),
            Err(message) => {
                p.push("encryption.hash_key", message);
                None
            }
        },
    }
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
    let (source, text) = read_secret(spec, env)?;
    let material = decode(text.trim())?;
    Ok((source, material))
}

/// A secret's printed source (`{ env: "NAME" }`, `{ file: "PATH" }`) and its text: from the
/// environment or a mounted file, never from the configuration itself.
pub(super) fn read_secret(spec: &FileSecretSpec, env: Env<'_>) -> Result<(String, String), String> {
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
    Ok((source, text))
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
#[path = "encryption_tests.rs"]
mod tests;
