//! Reading the idempotency key from a request (a header or the body), and the key sent
//! upstream. Parsing is pure and never panics on any header bytes.

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::key::is_visible_ascii;

/// Longest accepted key, after unquoting.
pub const MAX_KEY_LEN: usize = 255;

/// Reads the key: `None` when absent, an error reason when present but unusable.
///
/// Accepts the IETF draft's structured-field string (`"abc"`, with `\"` and `\\` escapes)
/// and the bare form Stripe clients send (`abc`).
pub fn parse_key(headers: &HeaderMap, name: &HeaderName) -> Result<Option<String>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("it was sent more than once; send exactly one".into());
    }
    let raw = std::str::from_utf8(value.as_bytes())
        .ok()
        .filter(|s| is_visible_ascii(s))
        .ok_or("it contains control or non-ASCII characters")?;
    let raw = raw.trim_matches(' ');
    let key = if let Some(inner) = raw.strip_prefix('"') {
        unquote(inner)?
    } else {
        if raw.contains(',') {
            return Err("a bare key must not contain `,` (it looks like several keys joined); quote it as a structured-field string".into());
        }
        raw.to_owned()
    };
    check_key(key).map(Some)
}

/// The rules every key follows, wherever it came from.
fn check_key(key: String) -> Result<String, String> {
    if key.is_empty() {
        return Err("it is empty".into());
    }
    if !is_visible_ascii(&key) {
        return Err("it contains control or non-ASCII characters".into());
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "it is {} characters long; the limit is {MAX_KEY_LEN}",
            key.len()
        ));
    }
    Ok(key)
}

/// Reads the key from the body (`key_from: { body: POINTER }`): the JSON value at the
/// pointer in a JSON body, or the form field the pointer names (its one segment) in a
/// form body. `None` when the body has no such member (or is neither JSON nor a form);
/// an error reason when it has one that cannot be a key: not a string or a number, sent
/// twice, or against the rules a header key follows. Never panics on any body.
pub fn body_key(
    content_type: Option<&[u8]>,
    body: &[u8],
    pointer: &str,
) -> Result<Option<String>, String> {
    if crate::fingerprint::is_json(content_type) {
        let value: serde_json::Value = crate::canonical::parse_strict(body)
            .map_err(|_| "the body is not valid JSON, so its key cannot be read".to_owned())?;
        return match value.pointer(pointer) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => check_key(s.clone()).map(Some),
            Some(serde_json::Value::Number(n)) => check_key(n.to_string()).map(Some),
            Some(_) => Err("it must be a string or a number".into()),
        };
    }
    if !crate::fingerprint::is_form(content_type) {
        return Ok(None);
    }
    let Some(field) = form_field(pointer) else {
        return Ok(None);
    };
    let mut values = form_urlencoded::parse(body).filter(|(k, _)| *k == field);
    let Some((_, value)) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("it was sent more than once; send exactly one".into());
    }
    check_key(value.into_owned()).map(Some)
}

/// The form field a one-segment JSON Pointer names (`/idempotency_key`), unescaped.
fn form_field(pointer: &str) -> Option<String> {
    let segment = pointer.strip_prefix('/')?;
    (!segment.contains('/')).then(|| segment.replace("~1", "/").replace("~0", "~"))
}

/// A key read from one of several headers, and the value as the client sent it (echoed
/// on the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderKey {
    pub key: String,
    pub sent: http::HeaderValue,
    /// The header it came in.
    pub header: HeaderName,
}

/// Reads the key from the first of `names` present; `None` when none is. Another of them
/// present with a different key is refused: which one the client meant is unknown.
/// The error names the header at fault.
pub fn parse_keys(
    headers: &HeaderMap,
    names: &[HeaderName],
) -> Result<Option<HeaderKey>, (HeaderName, String)> {
    let mut found: Option<(HeaderKey, &HeaderName)> = None;
    for name in names {
        let key = parse_key(headers, name).map_err(|reason| (name.clone(), reason))?;
        let (Some(key), Some(sent)) = (key, headers.get(name)) else {
            continue;
        };
        match &found {
            None => {
                found = Some((
                    HeaderKey {
                        key,
                        sent: sent.clone(),
                        header: name.clone(),
                    },
                    name,
                ))
            }
            Some((first, first_name)) if first.key != key => {
                return Err((
                    name.clone(),
                    format!(
                        "it carries a different key than `{first_name}`; send the key in one of them"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(key, _)| key))
}

/// The key under which a request is stored: the client's key, or with
/// `key_scope: client_and_route` the route's name (`%` and `:` percent-encoded, so no two
/// pairs collide) and the key, so that one key on two routes is two operations.
pub fn scoped_key(route: &str, key: &str, scope: crate::config::KeyScope) -> String {
    match scope {
        crate::config::KeyScope::Client => key.to_owned(),
        crate::config::KeyScope::ClientAndRoute => {
            let mut out = String::with_capacity(route.len() + key.len() + 1);
            crate::key::push_escaped(&mut out, route);
            out.push(':');
            out.push_str(key);
            out
        }
    }
}

/// Unquotes the rest of an sf-string after its opening quote (RFC 8941 §4.2.5).
fn unquote(inner: &str) -> Result<String, String> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err("only `\\\"` and `\\\\` may be escaped in a quoted key".into()),
            },
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err("unexpected characters after the closing quote".into())
                };
            }
            c => out.push(c),
        }
    }
    Err("the quoted key has no closing quote".into())
}

/// The derived key in the route's form, `None` when it is the plain one (which is not
/// stored: a row without a derived key is plain).
pub fn formatted_derived_key(
    client_id: &str,
    key: &str,
    form: crate::config::DerivedKey,
) -> Option<String> {
    use crate::config::DerivedKey;
    let plain = crate::key::derived_key(client_id, key);
    match form {
        DerivedKey::Plain => None,
        DerivedKey::MaxLength(n) if plain.len() <= n => None,
        DerivedKey::Sha256 => Some(crate::key::hex(&Sha256::digest(plain.as_bytes()))),
        DerivedKey::MaxLength(n) if n >= 64 => {
            Some(crate::key::hex(&Sha256::digest(plain.as_bytes())))
        }
        // A limit under 64 (Square's 45): base64url, cut to the limit. It has no `:`, so
        // it never equals a plain `client_id:key`.
        DerivedKey::MaxLength(n) => {
            use base64::Engine;
            let mut short = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(Sha256::digest(plain.as_bytes()));
            short.truncate(n);
            Some(short)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(values: &[&[u8]]) -> Result<Option<String>, String> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("idempotency-key", HeaderValue::from_bytes(v).unwrap());
        }
        parse_key(&h, &HeaderName::from_static("idempotency-key"))
    }

    /// Both the sf-string and the bare form are accepted and mean the same key.
    #[test]
    fn forms() {
        assert_eq!(key(&[b"abc-123"]), Ok(Some("abc-123".into())));
        assert_eq!(key(&[b"\"abc-123\""]), Ok(Some("abc-123".into())));
        assert_eq!(key(&[br#""a\"b\\c""#]), Ok(Some(r#"a"b\c"#.into())));
        assert_eq!(key(&[]), Ok(None));
    }

    /// Empty, too long, repeated, non-ASCII and malformed quoted keys are rejected.
    #[test]
    fn rejects() {
        let long = vec![b'k'; 256];
        for bad in [
            &b""[..],
            b"\"\"",
            &long,
            b"caf\xc3\xa9",
            b"\"abc",
            b"\"a\"b",
            b"\"a\\n\"",
            b"a,b",
            b"a\tb",
        ] {
            assert!(key(&[bad]).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(key(&[&[b'k'; 255]]).is_ok());
        assert!(key(&[b"a", b"a"]).is_err());
    }
}
