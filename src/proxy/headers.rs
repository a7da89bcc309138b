//! Header hygiene: hop-by-hop stripping, forwarding headers, and the allow-listed header
//! block that is stored and replayed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

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

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Sets `X-Forwarded-For` (appended), `-Proto` and `-Host` for the upstream.
///
/// It runs on every forwarded request, so the names are constants (not parsed per call)
/// and an IPv4 peer is written without the formatting machinery.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: SocketAddr,
    original_host: Option<HeaderValue>,
    proto: &'static str,
) {
    let prior = headers
        .get(&X_FORWARDED_FOR)
        .and_then(|v| v.to_str().ok())
        .filter(|prior| !prior.trim().is_empty());
    let xff = match (prior, peer.ip()) {
        (None, IpAddr::V4(ip)) => {
            let mut buf = [0u8; 15];
            let n = write_ipv4(&mut buf, ip);
            HeaderValue::from_bytes(&buf[..n]).ok()
        }
        (None, ip) => HeaderValue::from_str(&ip.to_string()).ok(),
        (Some(prior), ip) => HeaderValue::from_str(&format!("{prior}, {ip}")).ok(),
    };
    if let Some(value) = xff {
        headers.insert(X_FORWARDED_FOR, value);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    match original_host {
        Some(host) => {
            headers.insert(X_FORWARDED_HOST, host);
        }
        None => {
            headers.remove(X_FORWARDED_HOST);
        }
    }
}

/// Writes `ip` in dotted-decimal form into `buf`; returns the length.
fn write_ipv4(buf: &mut [u8; 15], ip: Ipv4Addr) -> usize {
    let mut n = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            buf[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            buf[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

/// Gives a message's header values an allocation of their own, one for all of them.
///
/// hyper hands out header values as slices of the connection's 8 KiB read buffer, so
/// whatever holds a head holds that whole buffer, and the connection reads its next
/// message into a new one. A keyed request waits for the store with its head, and its
/// answer waits for the completion: as copies, each head costs its own few hundred bytes
/// instead of a read buffer (at 1,000 waiting requests, the difference is 16 MiB).
pub fn detach_headers(headers: &mut HeaderMap) {
    let total = headers.values().map(HeaderValue::len).sum();
    let mut copy = BytesMut::with_capacity(total);
    for value in headers.values() {
        copy.put_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let len = value.len();
        if let Ok(mut detached) = HeaderValue::from_maybe_shared(copy.slice(at..at + len)) {
            detached.set_sensitive(value.is_sensitive());
            *value = detached;
        }
        at += len;
    }
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
    /// Detached values are equal to the originals, keep their order and sensitivity, and
    /// no longer share the buffer the head was read into.
    #[test]
    fn detached_headers_own_their_bytes() {
        let read_buffer = Bytes::from_static(b"aaa, bbbccc");
        let mut h = HeaderMap::new();
        h.append(
            "x-a",
            HeaderValue::from_maybe_shared(read_buffer.slice(0..3)).unwrap(),
        );
        h.append(
            "x-a",
            HeaderValue::from_maybe_shared(read_buffer.slice(5..8)).unwrap(),
        );
        let mut secret = HeaderValue::from_maybe_shared(read_buffer.slice(8..11)).unwrap();
        secret.set_sensitive(true);
        h.insert(header::AUTHORIZATION, secret);
        let before = h.clone();
        detach_headers(&mut h);
        assert_eq!(h, before);
        assert!(h[header::AUTHORIZATION].is_sensitive());
        let buffer = read_buffer.as_ptr_range();
        for value in h.values() {
            assert!(!buffer.contains(&value.as_bytes().as_ptr()));
        }
    }

    /// The IPv4 fast path writes exactly what `Display` writes, for every octet value in
    /// every position, and a first `X-Forwarded-For` is the peer alone.
    #[test]
    fn ipv4_written_as_display_writes_it() {
        for v in 0..=255u8 {
            for ip in [
                Ipv4Addr::new(v, 0, 9, 10),
                Ipv4Addr::new(99, v, 100, 255),
                Ipv4Addr::new(1, 22, v, 200),
                Ipv4Addr::new(250, 101, 19, v),
            ] {
                let mut buf = [0u8; 15];
                let n = write_ipv4(&mut buf, ip);
                assert_eq!(&buf[..n], ip.to_string().as_bytes());
            }
        }
        let mut h = HeaderMap::new();
        set_forwarded(&mut h, "[::1]:9".parse().unwrap(), None, "https");
        assert_eq!(h["x-forwarded-for"], "::1");
        set_forwarded(&mut h, "10.20.30.40:9".parse().unwrap(), None, "https");
        assert_eq!(h["x-forwarded-for"], "::1, 10.20.30.40");
    }

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
