//! Header hygiene at the hop between a client and the upstream: hop-by-hop fields never
//! cross it (RFC 9110 §7.6.1), the upstream is told who asked (`X-Forwarded-*`), and an
//! upstream's answer is readied for the client's connection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

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
