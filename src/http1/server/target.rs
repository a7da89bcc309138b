//! The request-target and `Host` (RFC 9112 §3.2, RFC 9110 §7.2): which form of target each
//! method may use, and the one valid `Host` an HTTP/1.1 request must carry.
//!
//! Why here and strictly: the target and `Host` say which resource a request is for, and
//! `X-Forwarded-Host` tells the upstream. A request two parsers would route differently
//! (two `Host` fields, a `Host` with a path, `GET *`) is refused before anything reads it.

use http::{HeaderMap, Method, Uri, Version, header};

use super::error::HeadError;

/// Reads a request-target in the form its method allows (RFC 9112 §3.2.1–3.2.4).
/// `CONNECT` is refused whatever its target: the proxy is not a tunnel.
pub(super) fn target(method: &Method, raw: &[u8]) -> Result<Uri, HeadError> {
    if raw.is_empty() {
        return Err(HeadError::malformed("an empty request-target"));
    }
    if let Some(b) = raw.iter().find(|b| !b.is_ascii_graphic()) {
        return Err(HeadError::malformed(format!(
            "the request-target holds the byte 0x{b:02x} (only visible ASCII; percent-encode the rest)"
        )));
    }
    if raw.contains(&b'#') {
        return Err(HeadError::malformed(
            "the request-target holds a fragment (`#`), which is never sent",
        ));
    }
    let uri = Uri::try_from(raw)
        .map_err(|e| HeadError::malformed(format!("invalid request-target: {e}")))?;
    let authority_form = uri.scheme().is_none() && uri.authority().is_some();
    if method == Method::CONNECT {
        return Err(if authority_form {
            HeadError::Unsupported("CONNECT: the proxy does not open tunnels".to_owned())
        } else {
            HeadError::malformed("CONNECT takes an authority-form target (host:port)")
        });
    }
    if raw == b"*" {
        return if method == Method::OPTIONS {
            Ok(uri)
        } else {
            Err(HeadError::malformed(format!(
                "the asterisk-form target `*` is for OPTIONS only, not {method}"
            )))
        };
    }
    if raw[0] == b'/' {
        return Ok(uri);
    }
    if authority_form {
        return Err(HeadError::malformed(format!(
            "an authority-form target is for CONNECT only, not {method}"
        )));
    }
    // Absolute-form (§3.2.2): an http(s) URI whose authority names the host.
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(authority)) => {
            host(authority.as_str().as_bytes())
                .map_err(|why| HeadError::malformed(format!("the target's authority {why}")))?;
            Ok(uri)
        }
        _ => Err(HeadError::malformed(
            "the request-target is neither a path (`/…`) nor an http(s) URI",
        )),
    }
}

/// Checks the `Host` fields (RFC 9112 §3.2): exactly one on HTTP/1.1, at most one on
/// HTTP/1.0, and a valid `uri-host [":" port]` — even when an absolute-form target's
/// authority is what names the host.
pub(super) fn check_host(headers: &HeaderMap, version: Version) -> Result<(), HeadError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if version == Version::HTTP_11 => Err(HeadError::malformed(
            "an HTTP/1.1 request without a Host field",
        )),
        (None, _) => Ok(()),
        (Some(_), Some(_)) => Err(HeadError::malformed("more than one Host field")),
        (Some(value), None) => host(value.as_bytes())
            .map_err(|why| HeadError::malformed(format!("the Host field {why}"))),
    }
}

/// `uri-host [":" port]` (RFC 3986 §3.2.2–3.2.3): an IP literal in brackets, or a name of
/// unreserved characters, percent-escapes and sub-delimiters other than `,` (which would
/// make it a list); a port of digits up to 65535. No userinfo, no path, not empty.
fn host(value: &[u8]) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("is empty");
    }
    let (name, port) = if value[0] == b'[' {
        let close = value
            .iter()
            .position(|b| *b == b']')
            .ok_or("has an unclosed IP literal")?;
        let literal = std::str::from_utf8(&value[1..close]).map_err(|_| "is not ASCII")?;
        if literal.parse::<std::net::Ipv6Addr>().is_err() && !ip_future(literal) {
            return Err("has an invalid IP literal");
        }
        match &value[close + 1..] {
            [] => (&value[..=close], None),
            [b':', port @ ..] => (&value[..=close], Some(port)),
            _ => return Err("has bytes after its IP literal"),
        }
    } else {
        match value.iter().rposition(|b| *b == b':') {
            Some(colon) => (&value[..colon], Some(&value[colon + 1..])),
            None => (value, None),
        }
    };
    if name.is_empty() {
        return Err("has no host name");
    }
    if name[0] != b'[' && !reg_name(name) {
        return Err(if name.contains(&b'@') {
            "carries userinfo (`user@`)"
        } else if name.contains(&b'/') || name.contains(&b'?') {
            "carries a path or query"
        } else if name.contains(&b',') {
            "is a list of hosts"
        } else {
            "is not a valid host name"
        });
    }
    if let Some(port) = port {
        let valid = port.iter().all(u8::is_ascii_digit)
            && port.len() <= 5
            && std::str::from_utf8(port)
                .ok()
                .and_then(|p| {
                    if p.is_empty() {
                        Some(0)
                    } else {
                        p.parse::<u32>().ok()
                    }
                })
                .is_some_and(|p| p <= 65535);
        if !valid {
            return Err("has an invalid port");
        }
    }
    Ok(())
}

/// A reg-name (RFC 3986 §3.2.2) without `,`.
fn reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'%' => {
                let escaped = name.get(i + 1..i + 3);
                if !escaped.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
                continue;
            }
            b if b.is_ascii_alphanumeric() => {}
            b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+'
            | b';' | b'=' => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// `IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" )`.
fn ip_future(literal: &str) -> bool {
    let Some(rest) = literal.strip_prefix(['v', 'V']) else {
        return false;
    };
    let Some((version, address)) = rest.split_once('.') else {
        return false;
    };
    !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_hexdigit())
        && !address.is_empty()
        && address
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-._~!$&'()*+,;=".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for good in [
            &b"api.example"[..],
            b"api.example:8080",
            b"127.0.0.1",
            b"[::1]:443",
            b"[v1.x]",
            b"a%20b",
            b"host:",
        ] {
            assert_eq!(host(good), Ok(()), "{good:?}");
        }
        for bad in [
            &b""[..],
            b":80",
            b"user@host",
            b"host/path",
            b"a,b",
            b"a b",
            b"host:99999",
            b"host:8x",
            b"[::1",
            b"[zz]",
            b"[::1]x",
            b"h%2",
        ] {
            assert!(host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn target_forms_per_method() {
        let ok = |m: Method, t: &str| target(&m, t.as_bytes()).is_ok();
        assert!(ok(Method::GET, "/a?b=c"));
        assert!(ok(Method::OPTIONS, "*"));
        assert!(ok(Method::GET, "http://api.example/a"));
        assert!(!ok(Method::GET, "*"));
        assert!(!ok(Method::GET, "api.example:80"));
        assert!(!ok(Method::GET, "ftp://h/x"));
        assert!(!ok(Method::GET, "http://u@h/x"));
        assert!(!ok(Method::GET, "/a#b"));
        assert!(!ok(Method::GET, "/caf\u{e9}"));
        assert!(!ok(Method::GET, "a/b"));
        assert!(matches!(
            target(&Method::CONNECT, b"api.example:443"),
            Err(HeadError::Unsupported(_))
        ));
        assert!(matches!(
            target(&Method::CONNECT, b"/x"),
            Err(HeadError::Malformed(_))
        ));
    }
}
