//! Reading an HTTP/1 request head (RFC 9112 §2–3, §6): the request line, the fields, and
//! how the body is framed.
//!
//! The head is copied out of the bytes read, so nothing holds on to a read buffer while
//! the request waits. Framing is strict, as befits a proxy in front of payments: a
//! request whose body could be read two ways (`Transfer-Encoding` beside
//! `Content-Length`, differing lengths, a coding other than `chunked`) is refused, never
//! guessed at, since the upstream might guess otherwise.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Version};

use super::error::{HeadError, MAX_HEADERS};
use super::target::{check_host, target};
use crate::http1::Framing;
use crate::http1::fields::{content_length, keeps_alive};
use crate::http1::grammar::{self, shown};

/// A parsed request head.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) request: Request<()>,
    pub(super) framing: Framing,
    /// The client allows the connection to carry another request after this one.
    pub(super) keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for a go-ahead before sending the body.
    pub(super) expect_continue: bool,
}

/// Parses the head at the start of `buf`: `Ok(None)` while it is incomplete, or the head
/// and how many bytes it took (empty lines before it included).
pub(super) fn parse(buf: &[u8], limit: usize) -> Result<Option<(Head, usize)>, HeadError> {
    let skip = grammar::leading_empty_lines(buf);
    let rest = &buf[skip..];
    let len = match grammar::head_len(rest) {
        Ok(Some(len)) if skip + len <= limit => len,
        Ok(None) if buf.len() <= limit => return Ok(None),
        Ok(_) => return Err(too_large(rest, limit)),
        Err(e) => return Err(HeadError::malformed(e)),
    };
    let mut lines = grammar::lines(&rest[..len - 2]);
    let (method, uri, version) = request_line(lines.next().unwrap_or_default())?;
    let mut headers = HeaderMap::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(HeadError::TooLarge { limit });
        }
        let (name, value) = grammar::field_line(line).map_err(HeadError::Malformed)?;
        let name = HeaderName::from_bytes(name)
            .map_err(|_| HeadError::malformed(format!("invalid field name `{}`", shown(name))))?;
        let value = HeaderValue::from_bytes(value)
            .map_err(|_| HeadError::malformed(format!("invalid value in field `{name}`")))?;
        headers.append(name, value);
    }
    check_host(&headers, version)?;
    refuse_upgrade(&headers, version)?;
    let framing = framing(&headers, version)?;
    let keep_alive = keeps_alive(&headers, version);
    let expect_continue = version == Version::HTTP_11
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    let head = Head {
        request,
        framing,
        keep_alive,
        expect_continue,
    };
    Ok(Some((head, skip + len)))
}

/// A head past the limit: `414` if its request line alone is, `431` otherwise.
fn too_large(head: &[u8], limit: usize) -> HeadError {
    match head.iter().take(limit).position(|b| *b == b'\n') {
        None => HeadError::UriTooLong { limit },
        Some(_) => HeadError::TooLarge { limit },
    }
}

/// `method SP request-target SP HTTP-version` (RFC 9112 §3), one space each.
fn request_line(line: &[u8]) -> Result<(Method, http::Uri, Version), HeadError> {
    let (Some(first), Some(last)) = (
        line.iter().position(|b| *b == b' '),
        line.iter().rposition(|b| *b == b' '),
    ) else {
        return Err(HeadError::malformed(format!(
            "invalid request line `{}` (`METHOD target HTTP/1.1`)",
            shown(line)
        )));
    };
    let method = &line[..first];
    let version = &line[last + 1..];
    let raw_target = line.get(first + 1..last).unwrap_or_default();
    if !grammar::is_token(method) {
        return Err(HeadError::malformed(format!(
            "invalid method `{}` (a token)",
            shown(method)
        )));
    }
    let version = match version {
        b"HTTP/1.1" => Version::HTTP_11,
        b"HTTP/1.0" => Version::HTTP_10,
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(HeadError::Version(shown(version)));
        }
        _ => {
            return Err(HeadError::malformed(format!(
                "invalid request line `{}` (one space between `METHOD`, the target and `HTTP/1.1`)",
                shown(line)
            )));
        }
    };
    let method = Method::from_bytes(method)
        .map_err(|_| HeadError::malformed(format!("invalid method `{}`", shown(method))))?;
    let uri = target(&method, raw_target)?;
    Ok((method, uri, version))
}

/// A request to switch protocols is refused (RFC 9110 §7.8): the proxy forwards requests,
/// it does not tunnel. Only `h2c` is let through, ignored as RFC 9113 §3.1 allows, since
/// curl offers it on every plain `--http2` request.
fn refuse_upgrade(headers: &HeaderMap, version: Version) -> Result<(), HeadError> {
    if version != Version::HTTP_11 {
        return Ok(());
    }
    for value in headers.get_all(header::UPGRADE) {
        for protocol in grammar::list(value.as_bytes()) {
            if !protocol.eq_ignore_ascii_case(b"h2c") {
                return Err(HeadError::Unsupported(format!(
                    "Upgrade to `{}`: the proxy does not switch protocols",
                    shown(protocol)
                )));
            }
        }
    }
    Ok(())
}

/// The body's framing (RFC 9112 §6.3), refusing every ambiguous case.
fn framing(headers: &HeaderMap, version: Version) -> Result<Framing, HeadError> {
    let lengths = content_length(headers).map_err(HeadError::malformed)?;
    if !headers.contains_key(header::TRANSFER_ENCODING) {
        return Ok(match lengths {
            Some(0) | None => Framing::Empty,
            Some(n) => Framing::Length(n),
        });
    }
    if version == Version::HTTP_10 {
        return Err(HeadError::malformed(
            "HTTP/1.0 requests cannot use Transfer-Encoding",
        ));
    }
    if lengths.is_some() {
        return Err(HeadError::malformed(
            "both Transfer-Encoding and Content-Length: the body could be read two ways",
        ));
    }
    let mut codings = Vec::new();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        // RFC 9110 §5.6.1 lets a recipient skip empty list elements, but a server that
        // takes the line's last element as the final coding (hyper does) reads
        // `chunked,` as not chunked: a body two parsers would end in two places.
        let last = value
            .as_bytes()
            .rsplit(|b| *b == b',')
            .next()
            .unwrap_or(&[]);
        if grammar::trim_ows(last).is_empty() {
            return Err(HeadError::malformed(
                "Transfer-Encoding ends with an empty element: servers differ on whether the body is chunked",
            ));
        }
        for coding in grammar::list(value.as_bytes()) {
            if !grammar::is_token(coding) {
                return Err(HeadError::malformed(format!(
                    "invalid transfer coding `{}` in Transfer-Encoding",
                    shown(coding)
                )));
            }
            codings.push(coding);
        }
    }
    let chunked = |c: &&[u8]| c.eq_ignore_ascii_case(b"chunked");
    match codings.as_slice() {
        [] => Err(HeadError::malformed("empty Transfer-Encoding")),
        [only] if chunked(only) => Ok(Framing::Chunked),
        [.., last] if !chunked(last) => Err(HeadError::malformed(
            "`chunked` is not the last transfer coding: the body's end cannot be found",
        )),
        codings => match codings.iter().find(|c| !chunked(c)) {
            Some(other) => Err(HeadError::UnsupportedCoding(
                String::from_utf8_lossy(other).to_ascii_lowercase(),
            )),
            None => Err(HeadError::malformed("`chunked` applied more than once")),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Parses `text` with a `Host` field added after its request line (unless it has one).
    fn head(text: &str) -> Result<Option<(Head, usize)>, HeadError> {
        let text = match text.split_once("\r\n") {
            Some((line, rest)) if !text.to_ascii_lowercase().contains("\nhost:") => {
                format!("{line}\r\nHost: a\r\n{rest}")
            }
            _ => text.to_owned(),
        };
        parse(text.as_bytes(), 64 * 1024)
    }

    fn framing_of(text: &str) -> Result<Framing, HeadError> {
        head(text).map(|h| h.unwrap().0.framing)
    }

    /// A complete head is read whole; the bytes after it are not part of it.
    #[test]
    fn reads_a_head_and_stops_at_its_end() {
        let text = "POST /payments?x=1 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two: 2\r\ncontent-length: 3\r\n\r\nabc";
        let (head, len) = parse(text.as_bytes(), 1024).unwrap().unwrap();
        assert_eq!(len, text.len() - 3);
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri(), "/payments?x=1");
        assert_eq!(head.request.headers().get_all("x-two").iter().count(), 2);
        assert_eq!(head.framing, Framing::Length(3));
        assert!(head.keep_alive);
        assert!(!head.expect_continue);
    }

    /// A head cut short is waited for, not refused; past the limit it is refused.
    #[test]
    fn partial_heads_wait_until_the_limit() {
        assert!(head("POST /payments HTTP/1.1\r\nHost:").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(100));
        assert_eq!(
            parse(long.as_bytes(), 64).unwrap_err(),
            HeadError::TooLarge { limit: 64 }
        );
        let fields: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        assert!(matches!(
            head(&format!("GET / HTTP/1.1\r\n{fields}\r\n")),
            Err(HeadError::TooLarge { .. })
        ));
    }

    /// Every way a body could be read twice is refused.
    #[test]
    fn ambiguous_framing_is_refused() {
        for text in [
            "POST / HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 5, 7\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 0x5\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked,\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked , \t\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: \r\n\r\n",
        ] {
            assert!(
                matches!(framing_of(text), Err(HeadError::Malformed(_))),
                "{text:?}"
            );
        }
        assert!(matches!(
            framing_of("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Err(HeadError::UnsupportedCoding(c)) if c == "gzip"
        ));
    }

    /// The plain spellings of a length and of chunked are accepted.
    #[test]
    fn plain_framing_is_read() {
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n")
                .unwrap(),
            Framing::Length(5)
        );
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\ncontent-length: 5 , 5\r\n\r\n").unwrap(),
            Framing::Length(5)
        );
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap(),
            Framing::Chunked
        );
        assert_eq!(
            framing_of("POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n").unwrap(),
            Framing::Empty
        );
        assert_eq!(
            framing_of("GET / HTTP/1.1\r\n\r\n").unwrap(),
            Framing::Empty
        );
    }

    /// Keep-alive follows the version and the Connection field; 100-continue only on 1.1.
    #[test]
    fn connection_and_expect() {
        let keep = |text: &str| head(text).unwrap().unwrap().0.keep_alive;
        assert!(keep("GET / HTTP/1.1\r\n\r\n"));
        assert!(!keep("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
        assert!(!keep(
            "GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n"
        ));
        assert!(!keep("GET / HTTP/1.0\r\n\r\n"));
        assert!(keep("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        let expect = |text: &str| head(text).unwrap().unwrap().0.expect_continue;
        assert!(expect("POST / HTTP/1.1\r\nExpect: 100-Continue\r\n\r\n"));
        assert!(!expect("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n"));
    }

    /// Garbage is refused, never a panic.
    #[test]
    fn garbage_is_malformed() {
        for text in [
            "GARBAGE\r\n\r\n",
            "GET / http/1.1\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nbad name: v\r\n\r\n",
            "GET / HTTP/1.1\r\n folded: v\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\nx: v\r\n\r\n",
        ] {
            assert!(
                matches!(head(text), Err(HeadError::Malformed(_))),
                "{text:?}"
            );
        }
        assert!(
            matches!(head("GET / HTTP/2.0\r\n\r\n"), Err(HeadError::Version(v)) if v == "HTTP/2.0")
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, failure_persistence: None, ..Default::default() })]

        /// No bytes make the head reader panic; a head it reads ends within the bytes, and
        /// the same bytes with more after them read the same.
        #[test]
        fn any_bytes_are_read_or_refused(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        ) {
            if let Ok(Some((_, len))) = parse(&bytes, 1024) {
                proptest::prop_assert!(len <= bytes.len());
                let mut more = bytes.clone();
                more.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
                let again = parse(&more, 1024);
                proptest::prop_assert!(matches!(again, Ok(Some((_, l))) if l == len));
            }
        }

        /// A valid head with one byte changed is read or refused, never a panic.
        #[test]
        fn damaged_heads_are_read_or_refused(at in 0usize..200, byte in proptest::prelude::any::<u8>()) {
            let mut text = b"POST /payments?a=1 HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n".to_vec();
            let at = at % text.len();
            text[at] = byte;
            let _ = parse(&text, 1024);
        }
    }
}
