//! The one spelling of a request path that routes match, fingerprints cover and the
//! upstream receives.
//!
//! Backends and frameworks treat `/payments/`, `//payments`, `/%70ayments` and
//! `/a/../payments` as `/payments`. If the route table saw them as different paths, a
//! client could reach a protected operation unprotected, or execute one key twice under two
//! spellings. So a path is normalised once (RFC 3986 §6.2.2, plus the collapsing most
//! servers do) and everything after uses that form:
//!
//! - percent-encoded unreserved characters are decoded, other escapes uppercased, and bytes
//!   that a URI may not carry raw (non-ASCII, `|`, `"`, …) encoded, so every spelling of a
//!   segment has one form;
//! - `.` and `..` segments are removed, repeated slashes collapsed, a trailing slash
//!   dropped (`/` stays `/`).
//!
//! Spellings that different servers resolve differently cannot be normalised safely: an
//! encoded `/` or `\`, a raw `\`, an encoded dot segment, an encoded control byte or NUL,
//! invalid percent-encoding. [`normalize`] refuses them, and the proxy answers `400` on
//! the methods it protects rather than guess.

use std::borrow::Cow;

/// Why a path cannot be normalised safely; shown to the client in a `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with `/`")]
    NotAbsolute,
    #[error("the path contains `%` not followed by two hexadecimal digits")]
    InvalidEscape,
    #[error("the path contains an encoded `/` (`%2F`), which servers resolve differently")]
    EncodedSlash,
    #[error(
        "the path contains a backslash or an encoded one (`%5C`), which some servers read as `/`"
    )]
    Backslash,
    #[error("the path contains an encoded dot segment (`%2E`), which servers resolve differently")]
    EncodedDotSegment,
    #[error("the path contains an encoded control character or NUL")]
    ControlCharacter,
    #[error(
        "a segment of this protected route carries `;` parameters, which some servers ignore and others do not"
    )]
    PathParameters,
}

/// The normal form of `path` (without the query), or why there is none. Borrows when
/// `path` already is in normal form, which is the common case.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    let mut segments: Vec<String> = Vec::new();
    for raw in path[1..].split('/') {
        let segment = normalize_segment(raw)?;
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Whether a path already is in normal form: no escapes, no bytes to encode, no empty or
/// dot segments, no trailing slash. A cheap scan that spares the common path any copy.
fn is_normal(path: &[u8]) -> bool {
    if path.len() > 1 && path.ends_with(b"/") {
        return false;
    }
    let mut segment_start = true;
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        i += 1;
        if b == b'/' {
            if i > 1 && segment_start {
                return false; // an empty segment: `//`
            }
            segment_start = true;
            continue;
        }
        if b == b'.' && segment_start {
            // `.` or `..` as a whole segment.
            let rest = &path[i - 1..];
            let end = rest.iter().position(|&c| c == b'/').unwrap_or(rest.len());
            if &rest[..end] == b"." || &rest[..end] == b".." {
                return false;
            }
        }
        segment_start = false;
        if b == b'%' {
            // An escape stays only for a byte that must stay escaped, in uppercase.
            let escape = path.get(i..i + 2).and_then(|hex| {
                let upper = |c: u8| c.is_ascii_digit() || (b'A'..=b'F').contains(&c);
                (upper(hex[0]) && upper(hex[1]))
                    .then(|| hex_value(hex[0]).unwrap_or(0) << 4 | hex_value(hex[1]).unwrap_or(0))
            });
            match escape {
                Some(d) if !is_unreserved(d) && !matches!(d, b'/' | b'\\' | 0x00..=0x1f | 0x7f) => {
                    i += 2;
                }
                _ => return false,
            }
        } else if !is_pchar_literal(b) {
            return false;
        }
    }
    true
}

/// Bytes that stand for themselves in a normal segment: RFC 3986 unreserved characters,
/// sub-delims, `:` and `@`.
fn is_pchar_literal(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// One segment in normal form. A segment that decodes to `.` or `..` only counts as a dot
/// segment when written plainly; written with `%2E` it is refused.
pub(crate) fn normalize_segment(raw: &str) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut encoded_dot = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).and_then(|c| hex_value(*c)),
                    bytes.get(i + 2).and_then(|c| hex_value(*c)),
                ) else {
                    return Err(PathError::InvalidEscape);
                };
                let decoded = hi << 4 | lo;
                match decoded {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::Backslash),
                    0x00..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
                    b'.' => {
                        encoded_dot = true;
                        out.push('.');
                    }
                    d if is_unreserved(d) => out.push(char::from(d)),
                    d => push_escape(&mut out, d),
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            0x00..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
            b if is_pchar_literal(b) => {
                out.push(char::from(b));
                i += 1;
            }
            b => {
                push_escape(&mut out, b);
                i += 1;
            }
        }
    }
    if encoded_dot && (out == "." || out == "..") {
        return Err(PathError::EncodedDotSegment);
    }
    Ok(out)
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn push_escape(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(path: &str) -> Result<String, PathError> {
        normalize(path).map(Cow::into_owned)
    }

    /// Every spelling a server reads as `/payments` normalises to `/payments`.
    #[test]
    fn spellings_of_one_path() {
        for spelling in [
            "/payments",
            "/payments/",
            "//payments",
            "/payments//",
            "///payments///",
            "/%70ayments",
            "/pay%6Dents",
            "/pay%6dents",
            "/./payments",
            "/x/../payments",
            "/../payments",
            "/x/y/../../payments/.",
            "/payments/x/..",
        ] {
            assert_eq!(n(spelling).as_deref(), Ok("/payments"), "{spelling}");
        }
    }

    /// Escapes of reserved and non-ASCII bytes keep their meaning, in one spelling.
    #[test]
    fn escapes_have_one_form() {
        assert_eq!(n("/a%3ab").unwrap(), "/a%3Ab");
        assert_eq!(n("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(n("/café").unwrap(), "/caf%C3%A9");
        assert_eq!(n("/a|b").unwrap(), "/a%7Cb");
        assert_eq!(n("/a%25b").unwrap(), "/a%25b");
        assert_eq!(n("/").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
        assert_eq!(n("/..").unwrap(), "/");
        assert_eq!(n("/a;b=1/c").unwrap(), "/a;b=1/c");
        assert_eq!(n("/.well-known/x").unwrap(), "/.well-known/x");
        assert_eq!(n("/...").unwrap(), "/...");
    }

    /// Spellings that servers resolve differently are refused, each with its reason.
    #[test]
    fn unsafe_spellings_are_refused() {
        for (path, why) in [
            ("/payments%2F", PathError::EncodedSlash),
            ("/payments%2fx", PathError::EncodedSlash),
            ("/payments%5C", PathError::Backslash),
            ("/payments\\", PathError::Backslash),
            ("/x/%2e%2e/payments", PathError::EncodedDotSegment),
            ("/x/.%2E/payments", PathError::EncodedDotSegment),
            ("/%2e/payments", PathError::EncodedDotSegment),
            ("/payments%00", PathError::ControlCharacter),
            ("/payments%0A", PathError::ControlCharacter),
            ("/payments%7f", PathError::ControlCharacter),
            ("/payments%", PathError::InvalidEscape),
            ("/payments%4", PathError::InvalidEscape),
            ("/payments%zz", PathError::InvalidEscape),
            ("payments", PathError::NotAbsolute),
            ("*", PathError::NotAbsolute),
        ] {
            assert_eq!(n(path), Err(why), "{path}");
        }
    }

    /// A path already in normal form is borrowed, not copied.
    #[test]
    fn normal_paths_are_borrowed() {
        for path in [
            "/",
            "/payments",
            "/payments/42/refunds",
            "/a.b/c..d",
            "/caf%C3%A9",
            "/a%2Cb",
        ] {
            assert!(matches!(normalize(path), Ok(Cow::Borrowed(_))), "{path}");
        }
    }
}
