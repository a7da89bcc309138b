//! Stored answers sealed at rest: the key ring, and how an answer is sealed and opened.
//!
//! Why: a payment API's answers carry names, addresses, masked card numbers and provider
//! references, and the key table is seen by backups, replicas and `psql` sessions. With
//! `encryption:` configured, the headers and body of every stored answer are sealed with
//! AES-256-GCM before they reach the store, and opened only to be replayed.
//!
//! How:
//! - Each sealed part gets a key of its own, derived with HKDF-SHA256 from the ring's key
//!   and a random 128-bit salt kept with it. GCM's 96-bit nonce then never repeats under a
//!   key (each derived key seals once), so there is no bound of 2³² answers per ring key
//!   as with random nonces under one key.
//! - The associated data is the row's identity — client id, key, the lease token that
//!   completed it — and the stored status and which part it is, so a ciphertext copied onto
//!   another row, an older answer of the same key put back, or a changed status does not
//!   open.
//! - The row records which ring key sealed it (`sealed_with`); the ring keeps old keys so
//!   old rows still open, and `rekey` moves rows to the active key.
//!
//! Not sealed (metadata the proxy must query or compare): client id, key, route, status,
//! fingerprint (already a hash), timestamps, lease tokens.

use std::collections::HashMap;
use std::fmt;

use bytes::Bytes;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use ring::rand::{SecureRandom, SystemRandom};

use crate::stored::{Seal, StoredResponse};

/// Bytes of a ring key (AES-256).
pub const KEY_BYTES: usize = 32;
/// The format of a sealed part: its first byte.
const VERSION: u8 = 1;
const SALT_BYTES: usize = 16;
const TAG_BYTES: usize = 16;
/// What sealing adds to a part: version, salt, tag.
pub const OVERHEAD: usize = 1 + SALT_BYTES + TAG_BYTES;
/// HKDF's `info`: which construction the derived key is for.
const INFO: &[u8] = b"idemproxy stored answer v1 aes-256-gcm";

/// A ring key's bytes; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyMaterial(pub [u8; KEY_BYTES]);

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyMaterial(<redacted>)")
    }
}

/// Why a stored answer cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// The row names a key the ring does not have (removed too early, or not configured).
    #[error("the answer is sealed with key `{0}`, which is not in encryption.keys")]
    MissingKey(String),
    /// The ciphertext does not authenticate: tampered, truncated, or moved from another row.
    #[error("the answer sealed with key `{0}` fails authentication (tampered, or not this row's)")]
    Tampered(String),
    /// The row is sealed but encryption is not configured at all.
    #[error("the answer is sealed with key `{0}`, but no encryption is configured")]
    NotConfigured(String),
}

impl Unreadable {
    /// The ring key the row names.
    pub fn ring_key(&self) -> &str {
        match self {
            Unreadable::MissingKey(id)
            | Unreadable::Tampered(id)
            | Unreadable::NotConfigured(id) => id,
        }
    }

    /// Stable label, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Unreadable::MissingKey(_) => "missing_key",
            Unreadable::Tampered(_) => "tampered",
            Unreadable::NotConfigured(_) => "not_configured",
        }
    }
}

/// Which part of a row a sealed value is: part of the associated data, so that the sealed
/// headers cannot be passed off as the body.
#[derive(Clone, Copy)]
enum Part {
    Headers,
    Body,
}

/// The row a value is sealed for.
#[derive(Clone, Copy)]
pub struct RowId<'a> {
    pub client_id: &'a str,
    pub key: &'a str,
    pub token: i64,
    pub status: u16,
}

/// The key ring: every configured key by id, and the one new answers are sealed with.
#[derive(Clone)]
pub struct Vault {
    active: String,
    /// The active key's bytes.
    material: KeyMaterial,
    keys: HashMap<String, KeyMaterial>,
    rng: SystemRandom,
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("Vault")
            .field("active", &self.active)
            .field("keys", &ids)
            .finish()
    }
}

impl Vault {
    /// A ring of `keys`, sealing with `active`; `None` when `active` is not one of them
    /// (the configuration refuses that before).
    pub fn new(
        keys: impl IntoIterator<Item = (String, KeyMaterial)>,
        active: &str,
    ) -> Option<Self> {
        let keys: HashMap<String, KeyMaterial> = keys.into_iter().collect();
        let material = keys.get(active)?.clone();
        Some(Self {
            active: active.to_owned(),
            material,
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// The key new answers are sealed with.
    pub fn active(&self) -> &str {
        &self.active
    }

    /// Whether the ring holds `id`.
    pub fn has(&self, id: &str) -> bool {
        self.keys.contains_key(id)
    }

    /// `answer` (in clear) sealed with the active key for the row `client_id`/`key` whose
    /// lease token is `token`.
    pub fn seal(
        &self,
        client_id: &str,
        key: &str,
        token: i64,
        answer: &StoredResponse,
    ) -> StoredResponse {
        let row = RowId {
            client_id,
            key,
            token,
            status: answer.status,
        };
        let material = &self.material;
        StoredResponse {
            status: answer.status,
            headers: self.seal_part(material, row, Part::Headers, &answer.headers),
            body: self.seal_part(material, row, Part::Body, &answer.body),
            sealed: Some(Seal {
                ring_key: self.active.clone(),
                token,
            }),
        }
    }

    /// `answer` as stored for the row `client_id`/`key`, opened: in clear as it is, sealed
    /// with a key of the ring and authenticated, or why not.
    pub fn open(
        vault: Option<&Vault>,
        client_id: &str,
        key: &str,
        answer: StoredResponse,
    ) -> Result<StoredResponse, Unreadable> {
        let Some(seal) = &answer.sealed else {
            return Ok(answer);
        };
        let Some(vault) = vault else {
            return Err(Unreadable::NotConfigured(seal.ring_key.clone()));
        };
        let material = vault
            .keys
            .get(&seal.ring_key)
            .ok_or_else(|| Unreadable::MissingKey(seal.ring_key.clone()))?;
        let row = RowId {
            client_id,
            key,
            token: seal.token,
            status: answer.status,
        };
        let tampered = || Unreadable::Tampered(seal.ring_key.clone());
        let headers =
            open_part(material, row, Part::Headers, &answer.headers).ok_or_else(tampered)?;
        let body = open_part(material, row, Part::Body, &answer.body).ok_or_else(tampered)?;
        Ok(StoredResponse::clear(answer.status, headers, body))
    }

    fn seal_part(&self, material: &KeyMaterial, row: RowId<'_>, part: Part, plain: &[u8]) -> Bytes {
        let mut salt = [0u8; SALT_BYTES];
        // The system's generator failing is not something to store answers through.
        if self.rng.fill(&mut salt).is_err() {
            panic!("the system's random number generator failed");
        }
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
        out.push(VERSION);
        out.extend_from_slice(&salt);
        out.extend_from_slice(plain);
        let key = part_key(material, &salt);
        let aad = associated_data(row, part);
        let sealed = key.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key([0; NONCE_LEN]),
            Aad::from(&aad),
            &mut out[1 + SALT_BYTES..],
        );
        match sealed {
            Ok(tag) => out.extend_from_slice(tag.as_ref()),
            // Only for inputs beyond GCM's 64 GiB limit, which no stored answer reaches.
            Err(_) => panic!("sealing a stored answer failed"),
        }
        Bytes::from(out)
    }
}

/// The one-use key for a part: HKDF-SHA256 of the ring key with the part's salt.
fn part_key(material: &KeyMaterial, salt: &[u8]) -> LessSafeKey {
    let okm = Salt::new(HKDF_SHA256, salt).extract(&material.0);
    let okm = okm.expand(&[INFO], &AES_256_GCM);
    // Expanding 32 bytes of SHA-256 output never fails; a key of the right length never
    // fails to load either.
    let unbound = okm
        .map(UnboundKey::from)
        .unwrap_or_else(|_| panic!("HKDF expansion of 32 bytes failed"));
    LessSafeKey::new(unbound)
}

fn open_part(material: &KeyMaterial, row: RowId<'_>, part: Part, sealed: &[u8]) -> Option<Bytes> {
    if sealed.len() < OVERHEAD || sealed[0] != VERSION {
        return None;
    }
    let (salt, rest) = sealed[1..].split_at(SALT_BYTES);
    let key = part_key(material, salt);
    let aad = associated_data(row, part);
    let mut buf = rest.to_vec();
    let plain = key
        .open_in_place(
            Nonce::assume_unique_for_key([0; NONCE_LEN]),
            Aad::from(&aad),
            &mut buf,
        )
        .ok()?;
    let len = plain.len();
    buf.truncate(len);
    Some(Bytes::from(buf))
}

/// The row's identity, the status and the part, each field length-prefixed so that no two
/// rows' identities run together into the same bytes.
fn associated_data(row: RowId<'_>, part: Part) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + row.client_id.len() + row.key.len());
    aad.extend_from_slice(b"idemproxy/v1\0");
    aad.push(match part {
        Part::Headers => b'h',
        Part::Body => b'b',
    });
    for field in [row.client_id.as_bytes(), row.key.as_bytes()] {
        aad.extend_from_slice(&(field.len() as u64).to_be_bytes());
        aad.extend_from_slice(field);
    }
    aad.extend_from_slice(&row.token.to_be_bytes());
    aad.extend_from_slice(&row.status.to_be_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Vault {
        Vault::new(
            [
                ("old".to_owned(), KeyMaterial([1; KEY_BYTES])),
                ("new".to_owned(), KeyMaterial([2; KEY_BYTES])),
            ],
            "new",
        )
        .expect("active key is in the ring")
    }

    fn answer() -> StoredResponse {
        StoredResponse::clear(
            201,
            Bytes::from_static(b"content-type: application/json\r\n"),
            Bytes::from_static(b"{\"card\":\"4242\"}"),
        )
    }

    #[test]
    fn seals_and_opens_with_the_rows_identity() {
        let vault = ring();
        let sealed = vault.seal("c", "k", 7, &answer());
        assert_eq!(
            sealed.sealed.as_ref().map(|s| s.ring_key.as_str()),
            Some("new")
        );
        assert!(!sealed.body.windows(4).any(|w| w == b"4242"));
        assert_eq!(sealed.body.len(), answer().body.len() + OVERHEAD);
        let opened = Vault::open(Some(&vault), "c", "k", sealed).expect("opens");
        assert_eq!(opened, answer());
    }

    #[test]
    fn two_seals_of_one_answer_differ() {
        let vault = ring();
        let a = vault.seal("c", "k", 7, &answer());
        let b = vault.seal("c", "k", 7, &answer());
        assert_ne!(a.body, b.body);
    }

    #[test]
    fn another_row_token_status_or_part_does_not_open() {
        let vault = ring();
        let sealed = vault.seal("c", "k", 7, &answer());
        let try_open = |client: &str, key: &str, token: i64, status: u16| {
            let mut s = sealed.clone();
            s.status = status;
            if let Some(seal) = &mut s.sealed {
                seal.token = token;
            }
            Vault::open(Some(&vault), client, key, s)
        };
        assert!(try_open("c", "k", 7, 201).is_ok());
        for (client, key, token, status) in [
            ("c", "k2", 7, 201),
            ("c2", "k", 7, 201),
            ("c", "k", 8, 201),
            ("c", "k", 7, 200),
            ("ck", "", 7, 201),
        ] {
            assert_eq!(
                try_open(client, key, token, status),
                Err(Unreadable::Tampered("new".into())),
                "{client}/{key}/{token}/{status}"
            );
        }
        let mut swapped = sealed.clone();
        std::mem::swap(&mut swapped.headers, &mut swapped.body);
        assert!(Vault::open(Some(&vault), "c", "k", swapped).is_err());
    }

    #[test]
    fn a_flipped_bit_or_a_short_value_does_not_open() {
        let vault = ring();
        let sealed = vault.seal("c", "k", 7, &answer());
        for i in 0..sealed.body.len() {
            let mut body = sealed.body.to_vec();
            body[i] ^= 0x01;
            let s = StoredResponse {
                body: body.into(),
                ..sealed.clone()
            };
            assert!(Vault::open(Some(&vault), "c", "k", s).is_err(), "byte {i}");
        }
        let s = StoredResponse {
            body: sealed.body.slice(..OVERHEAD - 1),
            ..sealed.clone()
        };
        assert!(Vault::open(Some(&vault), "c", "k", s).is_err());
    }

    #[test]
    fn old_keys_open_missing_keys_are_named() {
        let one = |id: &str, byte: u8| {
            Vault::new([(id.to_owned(), KeyMaterial([byte; KEY_BYTES]))], id).expect("one key")
        };
        let old = one("old", 1);
        let sealed = old.seal("c", "k", 1, &answer());
        assert!(Vault::open(Some(&ring()), "c", "k", sealed.clone()).is_ok());
        let only_new = one("new", 2);
        assert_eq!(
            Vault::open(Some(&only_new), "c", "k", sealed.clone()),
            Err(Unreadable::MissingKey("old".into()))
        );
        assert_eq!(
            Vault::open(None, "c", "k", sealed),
            Err(Unreadable::NotConfigured("old".into()))
        );
        // Same id, other bytes: the wrong key, not a missing one.
        let impostor = one("old", 9);
        let sealed = old.seal("c", "k", 1, &answer());
        assert_eq!(
            Vault::open(Some(&impostor), "c", "k", sealed),
            Err(Unreadable::Tampered("old".into()))
        );
    }

    #[test]
    fn an_active_key_outside_the_ring_is_refused() {
        assert!(Vault::new([("a".to_owned(), KeyMaterial([1; KEY_BYTES]))], "b").is_none());
    }

    #[test]
    fn clear_answers_open_as_they_are() {
        assert_eq!(Vault::open(Some(&ring()), "c", "k", answer()), Ok(answer()));
        assert_eq!(Vault::open(None, "c", "k", answer()), Ok(answer()));
    }

    #[test]
    fn empty_parts_seal_too() {
        let vault = ring();
        let empty = StoredResponse::clear(204, Bytes::new(), Bytes::new());
        let sealed = vault.seal("c", "k", 3, &empty);
        assert_eq!(sealed.body.len(), OVERHEAD);
        assert_eq!(Vault::open(Some(&vault), "c", "k", sealed), Ok(empty));
    }
}
