//! The stored answer: what the store keeps of an upstream's answer and replays, in clear or
//! sealed at rest.
//!
//! Its headers are kept as an HTTP/1 header block ([`encode_stored`], [`decode_stored`]).
//!
//! Why a leaf module of its own: the store keeps these values and the vault seals and opens
//! them; neither should have to reach into the other for the type they share.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, header};

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
    pub ring_key: String,
    pub token: i64,
}

/// Headers always stored with an answer, besides the route's `store_headers`.
const ALWAYS_STORED: [HeaderName; 2] = [header::CONTENT_TYPE, header::LOCATION];

/// Encodes the allow-listed headers of an answer as an HTTP/1 header block, which is
/// lossless for every legal header value (values cannot contain CR or LF).
pub fn encode_stored(headers: &HeaderMap, extra: &[HeaderName]) -> Bytes {
    encode_block(
        ALWAYS_STORED
            .iter()
            .chain(extra)
            .flat_map(|name| headers.get_all(name).iter().map(move |v| (name, v))),
    )
}

/// Encodes headers as the block [`decode_stored`] reads, all of them and in this order.
pub fn encode_block<'a>(headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> Bytes {
    let mut out = BytesMut::new();
    for (name, value) in headers {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.freeze()
}

/// Decodes a block written by [`encode_stored`]; lines that do not parse are skipped.
pub fn decode_stored(block: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in block.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only allow-listed headers are stored; they survive the round trip byte for byte.
    #[test]
    fn stored_headers_round_trip() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::LOCATION, HeaderValue::from_static("/payments/1"));
        h.insert(header::SET_COOKIE, HeaderValue::from_static("session=1"));
        h.append("x-request-id", HeaderValue::from_bytes(b"a\xffb").unwrap());
        h.append(
            "x-request-id",
            HeaderValue::from_static("second: with colon"),
        );
        let block = encode_stored(&h, &[HeaderName::from_static("x-request-id")]);
        let back = decode_stored(&block);
        assert_eq!(back.len(), 4);
        assert!(!back.contains_key(header::SET_COOKIE));
        let ids: Vec<&[u8]> = back
            .get_all("x-request-id")
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(ids, vec![&b"a\xffb"[..], b"second: with colon"]);
    }
}
