//! The stored answer: what the store keeps of an upstream's answer and replays, in clear or
//! sealed at rest.
//!
//! Why a leaf module of its own: the store keeps these values and the vault seals and opens
//! them; neither should have to reach into the other for the type they share.

use bytes::Bytes;

/// A stored upstream answer, as replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    /// Allow-listed headers in HTTP/1 block form (`name: value\r\n`...), lossless for any
    /// legal header value; sealed when [`StoredResponse::sealed`] says so.
    pub headers: Bytes,
    /// The body; sealed when [`StoredResponse::sealed`] says so.
    pub body: Bytes,
    /// `None`: headers and body are in clear. Otherwise both are sealed (see
    /// [`crate::vault`]) and only the proxy's key ring can read them.
    pub sealed: Option<Seal>,
}

impl StoredResponse {
    /// An answer in clear.
    pub fn clear(status: u16, headers: Bytes, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
            sealed: None,
        }
    }
}

/// How a stored answer was sealed: under which key of the ring, bound to which lease
/// token. The store keeps the key id in the row (`sealed_with`); the token is the row's own,
/// so a sealed answer copied onto another row, or an older one put back, does not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    pub key_id: String,
    pub token: i64,
}
