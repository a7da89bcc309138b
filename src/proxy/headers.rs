//! Header hygiene: hop-by-hop stripping, forwarding headers, and the allow-listed header
//! block that is stored and replayed.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::config::HOP_BY_HOP;

/// Removes hop-by-hop headers, including any named in `Connection` (RFC 9110 §7.6.1).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass to see whether there is anything to do: most messages carry none.
    if !headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(&name.as_str()))
    {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Readies an upstream answer's head for the client: hop-by-hop headers stripped, and
/// sent in the client connection's own HTTP version, whatever the upstream spoke.
pub fn client_head(head: &mut http::response::Parts) {
    strip_hop_by_hop(&mut head.headers);
    head.version = http::Version::default();
}

/// Sets `X-Forwarded-For` (appended), `-Proto` and `-Host` for the upstream.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: SocketAddr,
    original_host: Option<HeaderValue>,
    proto: &'static str,
) {
    let ip = peer.ip().to_string();
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
        _ => ip,
    };
    if let Ok(value) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", value);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    match original_host {
        Some(host) => {
            headers.insert("x-forwarded-host", host);
        }
        None => {
            headers.remove("x-forwarded-host");
        }
    }
}

/// Headers always stored with an answer, besides the route's `store_headers`.
const ALWAYS_STORED: [HeaderName; 2] = [header::CONTENT_TYPE, header::LOCATION];

/// Encodes the allow-listed headers of an answer as an HTTP/1 header block, which is
/// lossless for every legal header value (values cannot contain CR or LF).
pub fn encode_stored(headers: &HeaderMap, extra: &[HeaderName]) -> Bytes {
    let mut out = BytesMut::new();
    for name in ALWAYS_STORED.iter().chain(extra) {
        for value in headers.get_all(name) {
            out.put_slice(name.as_str().as_bytes());
            out.put_slice(b": ");
            out.put_slice(value.as_bytes());
            out.put_slice(b"\r\n");
        }
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

    /// Hop-by-hop headers and those named by `Connection` never cross the proxy.
    #[test]
    fn strips_hop_by_hop() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

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

    /// X-Forwarded-For is appended to, not replaced.
    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        set_forwarded(
            &mut h,
            "127.0.0.2:5000".parse().unwrap(),
            Some(HeaderValue::from_static("api.example")),
            "http",
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.2");
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(h["x-forwarded-proto"], "http");
    }
}
