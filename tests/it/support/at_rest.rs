//! What the store holds at rest, for the encryption tests: key files as operators make
//! them, and every byte of the table or the embedded files to search for clear text.

use std::path::{Path, PathBuf};

use base64::Engine;

use super::{Backend, TempDir};

/// A key file of 32 bytes derived from `seed`, in base64 as `openssl rand -base64 32`
/// writes it (with its newline).
pub fn key_file(dir: &TempDir, name: &str, seed: u8) -> PathBuf {
    let bytes: Vec<u8> = (0..32u8)
        .map(|i| seed.wrapping_mul(37).wrapping_add(i.wrapping_mul(11)) ^ 0x5a)
        .collect();
    let path = dir.join(name);
    let text = base64::engine::general_purpose::STANDARD.encode(bytes);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    path
}

/// The bytes of a key file.
pub fn key_material(path: &Path) -> idemproxy::vault::KeyMaterial {
    let text = std::fs::read_to_string(path).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap();
    idemproxy::vault::KeyMaterial(bytes.try_into().unwrap())
}

/// Every byte the store holds: the table's rows as PostgreSQL prints them (bytea in hex),
/// or the embedded store's files (database and write-ahead log).
pub async fn raw_bytes(db: &Backend) -> Vec<u8> {
    match db {
        Backend::Postgres(_) => {
            let client = db.client().await;
            let rows = client
                .query("SELECT t::text FROM idempotency_keys t", &[])
                .await
                .unwrap();
            rows.iter()
                .flat_map(|r| r.get::<_, String>(0).into_bytes())
                .collect()
        }
        Backend::Embedded(path) => {
            let mut all = Vec::new();
            for suffix in ["", "-wal"] {
                let file = PathBuf::from(format!("{}{suffix}", path.display()));
                all.extend(std::fs::read(file).unwrap_or_default());
            }
            all
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether `text` is in the store's bytes, in clear or (PostgreSQL prints bytea) in hex.
pub async fn stored_in_clear(db: &Backend, text: &str) -> bool {
    let raw = raw_bytes(db).await;
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    contains(&raw, text.as_bytes()) || contains(&raw, hex.as_bytes())
}
