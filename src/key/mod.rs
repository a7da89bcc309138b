//! The idempotency key's identities, in one leaf module every layer may use: the id that
//! names a `(client_id, key)` in notifications and caches, the short hash that names it in
//! logs, the derived key sent upstream, and the form keys are stored in ([`form`]).
//!
//! Why a leaf: the store, the request path, the configuration and the admin API all name
//! keys the same way, and none of them should have to reach into another to do it.

use sha2::{Digest, Sha256};

pub mod form;

pub use form::KeyForm;

/// A key in one of its forms: a `String` that says which form it is, so that the request
/// path cannot hand the store a clear key where it keeps hashes, or log a stored one where
/// the clear key's hash is the operator's recipe. It reads as a `&str` wherever one is
/// wanted.
macro_rules! key_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn new(text: String) -> Self {
                Self(text)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

key_type!(
    /// Whose keys these are: the client identity a gateway vouched for (`client_id:`).
    /// Keys are kept per client: two tenants' `order-1` are two operations.
    ClientId
);
key_type!(
    /// The key as the client sent it, in a header or the body: what the answer echoes.
    SentKey
);
key_type!(
    /// The client's key, scoped to the route under `key_scope: client_and_route`
    /// (`route:key`): what the derived key and the log lines' key hash are made of.
    ClearKey
);
key_type!(
    /// The key as the store keeps it: the clear key, or its keyed hash
    /// (`encryption.hash_keys`, see [`form`]).
    StoredKey
);
key_type!(
    /// The key sent upstream in the route's form (`derived_key:`) when it is not the
    /// plain `client_id:key`; kept with the reservation so a takeover sends the same one.
    UpstreamKey
);

/// Longest accepted client identity (from a header, or a tenant's name).
pub const MAX_CLIENT_ID_LEN: usize = 255;

/// Whether every character is printable ASCII (space to `~`).
pub fn is_visible_ascii(s: &str) -> bool {
    s.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// Identifies a `(client_id, key)` in notifications without carrying either in clear.
pub type KeyId = [u8; 32];

/// SHA-256 over the client id and the key, separated so that no two pairs collide.
pub fn key_id(client_id: &str, key: &str) -> KeyId {
    let mut h = Sha256::new();
    h.update((client_id.len() as u64).to_be_bytes());
    h.update(client_id.as_bytes());
    h.update(key.as_bytes());
    h.finalize().into()
}

/// The short hash that names a `(client_id, key)` in every log line: the first 12 hex
/// characters of its [`key_id`] (SHA-256 over the client id's length
/// as 8 big-endian bytes, the client id, and the key — the stored key, so `route:key` under
/// `key_scope: client_and_route`). An operator computes it from a customer's client id
/// and key to find their lines (docs/operations.md, Logs).
pub fn key_hash(client_id: &str, key: &str) -> String {
    hex(&key_id(client_id, key)[..6])
}

/// The key sent upstream: `client_id:key`, with `%` and `:` in the client id percent-encoded
/// so that no two `(client_id, key)` pairs can produce the same derived key.
pub fn derived_key(client_id: &str, key: &str) -> String {
    let mut out = String::with_capacity(client_id.len() + key.len() + 1);
    push_escaped(&mut out, client_id);
    out.push(':');
    out.push_str(key);
    out
}

/// `N` bytes from exactly `2 × N` hex digits (either case; nothing else, not even a sign,
/// which `u8::from_str_radix` would take).
pub fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != N * 2 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
        let value = |d: u8| (d as char).to_digit(16).unwrap_or(0) as u8;
        *byte = value(pair[0]) << 4 | value(pair[1]);
    }
    Some(out)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Appends `text` with `%` and `:` percent-encoded: how a client id or a route name is
/// joined to a key with `:` so that no two pairs give the same string.
pub fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hex in, bytes out — and back: either case, exactly the length, digits only.
    #[test]
    fn from_hex_reads_what_hex_writes() {
        let bytes = [0x00, 0xab, 0xcd, 0xff];
        assert_eq!(from_hex::<4>(&hex(&bytes)), Some(bytes));
        assert_eq!(from_hex::<4>("00ABcdFF"), Some(bytes));
        for bad in [
            "00abcdf",
            "00abcdfff",
            "00abcdfg",
            "+0abcdff",
            "00ab cdf",
            "00abcdé",
        ] {
            assert_eq!(from_hex::<4>(bad), None, "{bad}");
        }
    }

    /// Client ids containing `:` cannot collide in the derived key.
    #[test]
    fn derived_keys_do_not_collide() {
        assert_eq!(derived_key("shop-1", "order-1"), "shop-1:order-1");
        assert_ne!(derived_key("a:b", "c"), derived_key("a", "b:c"));
        assert_ne!(derived_key("a%3Ab", "c"), derived_key("a:b", "c"));
    }
}
