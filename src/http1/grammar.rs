//! The HTTP/1 message grammar, read strictly, for both sides of the proxy: where a head
//! ends, its lines, field lines (RFC 9112 §2.2, §5; RFC 9110 §5), tokens and lists
//! (RFC 9110 §5.6), and the lines of a chunked body (RFC 9112 §7.1).
//!
//! Why strict, where the RFCs let a recipient repair (a bare LF as a line end, obs-fold):
//! the proxy sits behind a gateway that authenticates callers, and a message the two read
//! differently is how a request is smuggled past the gateway. Whatever the grammar does
//! not allow is refused, never guessed at; the refusals are listed in `docs/security.md`.

/// A `tchar` (RFC 9110 §5.6.2): what tokens — methods, field names, codings — are made of.
pub const fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
        | b'^' | b'_' | b'`' | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

/// A token: one or more `tchar`.
pub fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|b| is_tchar(*b))
}

/// Optional whitespace (RFC 9110 §5.6.3): spaces and horizontal tabs, nothing else.
pub const fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `s` without optional whitespace at either end.
pub fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !is_ows(*b)).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !is_ows(*b)).map_or(start, |i| i + 1);
    &s[start..end]
}

/// A byte a field value may hold (RFC 9110 §5.5): visible ASCII, space, tab, and obs-text;
/// no other control, and never CR, LF or NUL.
pub const fn is_field_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// Where a head ends, for a head that starts at `buf[0]`: the length up to and including
/// its empty line, `Ok(None)` while it is incomplete. A CR not followed by LF, or an LF
/// not preceded by CR, is an error however the rest reads.
pub fn head_len(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut line_start = 0;
    let mut i = 0;
    while i < buf.len() {
        match buf[i] {
            b'\r' => match buf.get(i + 1) {
                Some(b'\n') => {
                    if i == line_start && line_start > 0 {
                        return Ok(Some(i + 2));
                    }
                    i += 2;
                    line_start = i;
                    continue;
                }
                Some(_) => return Err("a bare CR in the head (lines end with CRLF)"),
                None => return Ok(None),
            },
            b'\n' => return Err("a line ended by a bare LF (lines end with CRLF)"),
            _ => {}
        }
        i += 1;
    }
    Ok(None)
}

/// How many bytes of empty lines (CRLF) come before a request line (RFC 9112 §2.2 lets a
/// server skip them; clients send one after a body now and then).
pub fn leading_empty_lines(buf: &[u8]) -> usize {
    buf.chunks_exact(2)
        .take_while(|pair| *pair == b"\r\n")
        .count()
        * 2
}

/// The lines of a complete head (as [`head_len`] measured it, without its final empty
/// line): the start line, then the field lines.
pub fn lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let head = head.strip_suffix(b"\r\n").unwrap_or(head);
    head.split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// One field line (RFC 9112 §5): the name, a token directly followed by `:`, and the value
/// with its surrounding whitespace removed. A line that starts with whitespace (obs-fold,
/// or whitespace before the first field) is refused, as is whitespace before the colon.
pub fn field_line(line: &[u8]) -> Result<(&[u8], &[u8]), String> {
    if line.first().is_some_and(|b| is_ows(*b)) {
        return Err("a field line starts with whitespace (obs-fold is not accepted)".into());
    }
    let Some(colon) = line.iter().position(|b| *b == b':') else {
        return Err(format!("a field line without a colon: `{}`", shown(line)));
    };
    let name = &line[..colon];
    if !is_token(name) {
        return Err(format!(
            "invalid field name `{}` (a token directly followed by `:`)",
            shown(name)
        ));
    }
    let value = trim_ows(&line[colon + 1..]);
    if !value.iter().all(|b| is_field_byte(*b)) {
        return Err(format!(
            "a control character in the value of field `{}`",
            shown(name)
        ));
    }
    Ok((name, value))
}

/// The elements of a list field value (RFC 9110 §5.6.1), trimmed, empty ones skipped.
pub fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

/// A chunk-size line without its CRLF (RFC 9112 §7.1): `1*HEXDIG` (at most 16 digits,
/// the size fits a u64), then extensions, each `BWS ";" BWS name [BWS "=" BWS value]`
/// with a token name and a token or quoted-string value. Whitespace anywhere else — after
/// the size with no extension, inside a name — is refused.
pub fn chunk_size_line(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err("a chunk size must start with hex digits");
    }
    if digits > 16 {
        return Err("a chunk size of more than 16 hex digits");
    }
    let mut size = 0u64;
    for b in &line[..digits] {
        // 16 hex digits always fit.
        size = size << 4 | u64::from(hex_value(*b));
    }
    chunk_extensions(&line[digits..])?;
    Ok(size)
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`.
fn chunk_extensions(mut rest: &[u8]) -> Result<(), &'static str> {
    const BAD: &str = "a malformed chunk extension (`;name` or `;name=value` after the size)";
    while !rest.is_empty() {
        rest = skip_ows(rest);
        rest = rest.strip_prefix(b";").ok_or(if rest.is_empty() {
            "whitespace after a chunk size"
        } else {
            BAD
        })?;
        rest = skip_ows(rest);
        let name = rest.iter().take_while(|b| is_tchar(**b)).count();
        if name == 0 {
            return Err(BAD);
        }
        rest = &rest[name..];
        let after = skip_ows(rest);
        if let Some(value) = after.strip_prefix(b"=") {
            let value = skip_ows(value);
            let len = token_or_quoted(value).ok_or(BAD)?;
            rest = &value[len..];
        }
    }
    Ok(())
}

fn skip_ows(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| is_ows(**b)).count();
    &s[n..]
}

/// The length of the token or quoted-string (RFC 9110 §5.6.4) at the start of `s`.
fn token_or_quoted(s: &[u8]) -> Option<usize> {
    if s.first() != Some(&b'"') {
        let n = s.iter().take_while(|b| is_tchar(**b)).count();
        return (n > 0).then_some(n);
    }
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                let next = *s.get(i + 1)?;
                if !is_field_byte(next) {
                    return None;
                }
                i += 2;
            }
            b if is_field_byte(b) => i += 1,
            _ => return None,
        }
    }
    None
}

/// Bytes as they can be shown in a detail: printable ASCII kept, the rest escaped, at
/// most 64 of them.
pub fn shown(bytes: &[u8]) -> String {
    let mut out: String = bytes
        .iter()
        .take(64)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    if bytes.len() > 64 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_end_at_their_empty_line_and_only_with_crlf() {
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n\r\nrest"), Ok(Some(18)));
        assert_eq!(head_len(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"), Ok(Some(24)));
        assert_eq!(head_len(b"GET / HTTP/1.1\r\nA: b\r\n"), Ok(None));
        assert_eq!(head_len(b"GET / HTTP/1.1\r"), Ok(None));
        assert!(head_len(b"GET / HTTP/1.1\nA: b\r\n\r\n").is_err());
        assert!(head_len(b"GET / HTTP/1.1\r\nA: x\nB: y\r\n\r\n").is_err());
        assert!(head_len(b"GET / HTTP/1.1\r\nA: x\rB: y\r\n\r\n").is_err());
        assert!(head_len(b"GET / HTTP/1.1\r\n\n").is_err());
    }

    #[test]
    fn field_lines() {
        assert_eq!(
            field_line(b"Name: \t v a \t"),
            Ok((&b"Name"[..], &b"v a"[..]))
        );
        assert_eq!(field_line(b"x:"), Ok((&b"x"[..], &b""[..])));
        assert_eq!(
            field_line(b"x: caf\xc3\xa9"),
            Ok((&b"x"[..], &b"caf\xc3\xa9"[..]))
        );
        for bad in [
            &b" folded: v"[..],
            b"\tx: v",
            b"x : v",
            b"x\t: v",
            b": v",
            b"x y: v",
            b"x",
            b"x: a\x00b",
            b"x: a\x7fb",
            b"x: a\x0bb",
            b"x\x00: v",
            b"x(: v",
        ] {
            assert!(field_line(bad).is_err(), "{}", shown(bad));
        }
    }

    #[test]
    fn chunk_size_lines() {
        for (line, size) in [
            (&b"5"[..], 5),
            (b"1A", 26),
            (b"00ff", 255),
            (b"5;ext", 5),
            (b"5 ; ext = \"q \\\" v\" ;b=c", 5),
            (b"5;a=b;c", 5),
            (b"ffffffffffffffff", u64::MAX),
        ] {
            assert_eq!(chunk_size_line(line), Ok(size), "{}", shown(line));
        }
        for bad in [
            &b""[..],
            b"a ",
            b"a\t",
            b"5\r",
            b"5\r;ABCD",
            b"5;",
            b"5; ",
            b"5;=v",
            b"5;na(me",
            b"5;a=",
            b"5;a=\"unterminated",
            b"5;a=b c",
            b"5 x",
            b"-5",
            b"0x5",
            b"10000000000000000",
            b"5;a=\"\x01\"",
        ] {
            assert!(chunk_size_line(bad).is_err(), "{}", shown(bad));
        }
    }

    #[test]
    fn lists_skip_empty_elements() {
        let l: Vec<&[u8]> = list(b" , chunked ,\t,").collect();
        assert_eq!(l, [&b"chunked"[..]]);
    }
}
