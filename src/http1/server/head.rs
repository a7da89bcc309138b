//! Reading an HTTP/1 request head (RFC 9112 §2–3, §6): the request line, the fields, and
//! how the body is framed.
//!
//! The head is copied out of the bytes read, so nothing holds on to a read buffer while
//! the request waits. Framing is strict, as befits a proxy in front of payments: a
//! request whose body could be read two ways (`Transfer-Encoding` beside
//! `Content-Length`, differing lengths, a coding other than `chunked`) is refused, never
//! guessed at, since the upstream might guess otherwise.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};

use crate::http1::Framing;
use crate::http1::fields::{content_length, keeps_alive};

/// Header fields a head may carry at most (hyper's limit, which this server replaced).
pub const MAX_HEADERS: usize = 100;

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

/// Why a head was refused; each is answered before the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is larger than {limit} bytes or has more than {MAX_HEADERS} fields")]
    TooLarge { limit: usize },
    #[error("{0}")]
    Malformed(String),
    #[error("transfer coding `{0}` is not supported (only `chunked`)")]
    UnsupportedCoding(String),
}

impl HeadError {
    fn malformed(what: impl Into<String>) -> Self {
        HeadError::Malformed(what.into())
    }
}

/// Parses the head at the start of `buf`: `Ok(None)` while it is incomplete, or the head
/// and how many bytes it took.
pub(super) fn parse(buf: &[u8], limit: usize) -> Result<Option<(Head, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= limit => len,
        Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge { limit }),
        Ok(httparse::Status::Partial) if buf.len() <= limit => return Ok(None),
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::TooLarge { limit });
        }
        Err(e) => return Err(HeadError::malformed(format!("malformed request head: {e}"))),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::malformed("incomplete request line"));
    };
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| HeadError::malformed("invalid method"))?;
    let uri = Uri::try_from(target)
        .map_err(|e| HeadError::malformed(format!("invalid request target: {e}")))?;
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for field in req.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| HeadError::malformed(format!("invalid field name `{}`", field.name)))?;
        let value = HeaderValue::from_bytes(field.value).map_err(|_| {
            HeadError::malformed(format!("invalid value in field `{}`", field.name))
        })?;
        headers.append(name, value);
    }
    let framing = framing(&headers, version)?;
    let keep_alive = keeps_alive(&headers, version) && method != Method::CONNECT;
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
    Ok(Some((head, len)))
}

/// The body's framing (RFC 9112 §6.3), refusing every ambiguous case.
fn framing(headers: &HeaderMap, version: Version) -> Result<Framing, HeadError> {
    let lengths = content_length(headers).map_err(HeadError::malformed)?;
    let mut codings = Vec::new();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let value = value
            .to_str()
            .map_err(|_| HeadError::malformed("invalid Transfer-Encoding"))?;
        codings.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_ascii_lowercase),
        );
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
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
        return match codings.as_slice() {
            [only] if only == "chunked" => Ok(Framing::Chunked),
            [] => Err(HeadError::malformed("empty Transfer-Encoding")),
            codings => match codings.iter().find(|c| *c != "chunked") {
                Some(other) => Err(HeadError::UnsupportedCoding(other.clone())),
                None => Err(HeadError::malformed("`chunked` applied more than once")),
            },
        };
    }
    Ok(match lengths {
        Some(0) | None => Framing::Empty,
        Some(n) => Framing::Length(n),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn head(text: &str) -> Result<Option<(Head, usize)>, HeadError> {
        parse(text.as_bytes(), 64 * 1024)
    }

    fn framing_of(text: &str) -> Result<Framing, HeadError> {
        head(text).map(|h| h.unwrap().0.framing)
    }

    /// A complete head is read whole; the bytes after it are not part of it.
    #[test]
    fn reads_a_head_and_stops_at_its_end() {
        let text = "POST /payments?x=1 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two: 2\r\ncontent-length: 3\r\n\r\nabc";
        let (head, len) = head(text).unwrap().unwrap();
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
            "GET / HTTP/2.0\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nbad name: v\r\n\r\n",
            "GET / HTTP/1.1\r\n folded: v\r\n\r\n",
        ] {
            assert!(
                matches!(head(text), Err(HeadError::Malformed(_))),
                "{text:?}"
            );
        }
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
