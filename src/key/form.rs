//! How idempotency keys are kept in the store: as the client sent them, or — with
//! `encryption.hash_keys` — as keyed hashes, so that the table (and its backups) does not
//! reveal clients' order numbers while a retry and an operator's lookup, which both have
//! the clear key, still find the row.
//!
//! Why keyed (HMAC-SHA256 under `encryption.hash_key`) and not a plain hash: keys are
//! often guessable (`order-1041`), and a plain hash of a guessable value is the value.
//! Why a separate secret, not a ring key: ring keys rotate and retire, and a changed hash
//! key would make every stored key unfindable — every retry a second execution. For the
//! same reason the store records which form its keys are in ([`KeyForm::marker`]), and a
//! proxy configured for another form refuses to start while keys are stored.

use ring::hmac;

use crate::vault::KeyMaterial;

/// What the stored form of a hashed key starts with.
const HASHED_PREFIX: &str = "h1:";

/// How this proxy stores keys.
#[derive(Clone)]
pub struct KeyForm {
    hasher: Option<hmac::Key>,
    marker: String,
}

impl std::fmt::Debug for KeyForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyForm").field(&self.marker).finish()
    }
}

impl Default for KeyForm {
    fn default() -> Self {
        Self::clear()
    }
}

impl KeyForm {
    /// Keys stored as sent.
    pub fn clear() -> Self {
        Self {
            hasher: None,
            marker: "clear".to_owned(),
        }
    }

    /// Keys stored as HMAC-SHA256 under `secret`.
    pub fn hashed(secret: &KeyMaterial) -> Self {
        let hasher = hmac::Key::new(hmac::HMAC_SHA256, &secret.0);
        // Names the secret without revealing it: a different secret, a different marker.
        let check = hmac::sign(&hasher, b"idemproxy/key-form-verifier");
        let marker = format!("hmac-sha256:{}", super::hex(&check.as_ref()[..8]));
        Self {
            hasher: Some(hasher),
            marker,
        }
    }

    /// Whether keys are hashed.
    pub fn is_hashed(&self) -> bool {
        self.hasher.is_some()
    }

    /// What the store records of this form: `clear`, or `hmac-sha256:` and a verifier of
    /// the secret (the first 8 bytes of an HMAC of a fixed text, in hex).
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// Whether `key` has the shape of a stored hashed key (`h1:` and 64 hex digits), as
    /// an operator copies it from a listing.
    pub fn looks_stored(key: &str) -> bool {
        key.strip_prefix(HASHED_PREFIX)
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    /// The key as the store keeps it for `client_id`: `key` itself, or `h1:` and the
    /// hex HMAC of the client id's length (8 bytes, big-endian), the client id and the key
    /// — length-prefixed so that no two pairs hash alike.
    pub fn stored(&self, client_id: &str, key: String) -> String {
        let Some(hasher) = &self.hasher else {
            return key;
        };
        let mut ctx = hmac::Context::with_key(hasher);
        ctx.update(&(client_id.len() as u64).to_be_bytes());
        ctx.update(client_id.as_bytes());
        ctx.update(key.as_bytes());
        format!("{HASHED_PREFIX}{}", super::hex(ctx.sign().as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> KeyMaterial {
        let mut m = [b; 32];
        m[0] = 0;
        KeyMaterial(m)
    }

    #[test]
    fn clear_keys_are_kept_as_sent() {
        let form = KeyForm::clear();
        assert_eq!(form.stored("shop", "order-1".into()), "order-1");
        assert_eq!(form.marker(), "clear");
        assert!(!form.is_hashed());
    }

    #[test]
    fn hashed_keys_hide_the_key_and_stay_stable() {
        let form = KeyForm::hashed(&secret(1));
        let stored = form.stored("shop", "order-1".into());
        assert!(stored.starts_with("h1:") && stored.len() == 67, "{stored}");
        assert!(KeyForm::looks_stored(&stored));
        assert!(!KeyForm::looks_stored("order-1"));
        assert!(!KeyForm::looks_stored(&stored[..66]));
        assert!(!stored.contains("order"));
        assert_eq!(stored, form.stored("shop", "order-1".into()));
        // Another client, another key, another secret: another stored key.
        assert_ne!(stored, form.stored("shop2", "order-1".into()));
        assert_ne!(stored, form.stored("shop", "order-2".into()));
        assert_ne!(
            stored,
            KeyForm::hashed(&secret(2)).stored("shop", "order-1".into())
        );
        // Length-prefixed: moving a character between client id and key changes the hash.
        assert_ne!(form.stored("ab", "c".into()), form.stored("a", "bc".into()));
    }

    #[test]
    fn the_marker_names_the_secret_without_revealing_it() {
        let one = KeyForm::hashed(&secret(1));
        assert_eq!(one.marker(), KeyForm::hashed(&secret(1)).marker());
        assert_ne!(one.marker(), KeyForm::hashed(&secret(2)).marker());
        assert!(one.marker().starts_with("hmac-sha256:"));
        assert_eq!(one.marker().len(), "hmac-sha256:".len() + 16);
    }
}
