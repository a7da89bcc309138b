//! An upstream answer: its head read (RFC 9112 §4, §6.3: how its body is delimited, and
//! whether the connection can carry another request after it) and its body, decoded from
//! the connection as its holder reads it.

use std::task::Poll;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Version, response};
use http_body::Body;

use super::Connection;
use crate::body::BoxError;
use crate::http1::decode::{BodyError, Decoder};
use crate::http1::fields::{content_length, keeps_alive};
use crate::http1::{Framing, grammar};

/// Fields an answer's head may carry at most.
const MAX_FIELDS: usize = 100;

/// A final head: its parts, how its body is framed, and whether the connection can carry
/// another request after it.
pub(super) type FinalHead = (response::Parts, Framing, bool);

/// Parses an answer's head by the same grammar as requests ([`grammar`]): how many bytes
/// it took and the head (`None` for a `1xx`), or `Ok(None)` while it is incomplete. A head
/// another parser could read differently is an error, so the call fails rather than store
/// an answer framed by a guess.
pub(super) fn parse_head(
    buf: &[u8],
    method: &Method,
) -> Result<Option<(usize, Option<FinalHead>)>, BoxError> {
    let Some(len) = grammar::head_len(buf)? else {
        return Ok(None);
    };
    let mut lines = grammar::lines(&buf[..len - 2]);
    let (version, status) = status_line(lines.next().unwrap_or_default())?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err("the upstream switched protocols, which the proxy never asks for".into());
    }
    if status.is_informational() {
        return Ok(Some((len, None)));
    }
    let mut headers = HeaderMap::new();
    for line in lines {
        if headers.len() == MAX_FIELDS {
            return Err(format!("the answer has more than {MAX_FIELDS} fields").into());
        }
        let (name, value) = grammar::field_line(line)?;
        headers.append(
            HeaderName::from_bytes(name)?,
            HeaderValue::from_bytes(value)?,
        );
    }
    let framing = answer_framing(&headers, status, method)?;
    let reusable = framing != Framing::UntilClose && keeps_alive(&headers, version);
    let mut parts = Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((len, Some((parts, framing, reusable)))))
}

/// `HTTP-version SP 3DIGIT SP reason-phrase` (RFC 9112 §4); an answer without the space
/// and reason is read too, as every client does.
fn status_line(line: &[u8]) -> Result<(Version, StatusCode), BoxError> {
    let bad = || format!("invalid status line `{}`", grammar::shown(line));
    let (version, rest) = line.split_at_checked(8).ok_or_else(bad)?;
    let version = match version {
        b"HTTP/1.1" => Version::HTTP_11,
        b"HTTP/1.0" => Version::HTTP_10,
        _ => return Err(bad().into()),
    };
    let (code, reason) = match rest {
        [b' ', a, b, c] => ([*a, *b, *c], &[][..]),
        [b' ', a, b, c, b' ', reason @ ..] => ([*a, *b, *c], reason),
        _ => return Err(bad().into()),
    };
    if !code.iter().all(u8::is_ascii_digit) || !reason.iter().all(|b| grammar::is_field_byte(*b)) {
        return Err(bad().into());
    }
    Ok((version, StatusCode::from_bytes(&code)?))
}

/// How an answer's body is delimited (RFC 9112 §6.3). A length beside a transfer coding,
/// or a coding other than `chunked`, is an error: the proxy stores and replays bodies, and
/// neither can be re-framed faithfully.
fn answer_framing(
    headers: &HeaderMap,
    status: StatusCode,
    method: &Method,
) -> Result<Framing, BoxError> {
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    let length = content_length(headers)?;
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if length.is_some() {
            return Err("the answer has both Transfer-Encoding and Content-Length".into());
        }
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| grammar::list(v.as_bytes()));
        return match (codings.next(), codings.next()) {
            (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            _ => Err("the answer's Transfer-Encoding is not just `chunked`".into()),
        };
    }
    Ok(match length {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// An answer's body, read from its connection; the connection is given back by
/// [`AnswerBody::take_connection`] once the body has ended.
pub struct AnswerBody {
    decoder: Decoder,
    conn: Option<Connection>,
    reusable: bool,
}

impl AnswerBody {
    pub(super) fn new(decoder: Decoder, conn: Connection, reusable: bool) -> Self {
        Self {
            decoder,
            conn: Some(conn),
            reusable,
        }
    }

    /// The connection, if the body has ended and it can carry another request.
    pub fn take_connection(&mut self) -> Option<Connection> {
        if self.decoder == Decoder::Done && self.reusable {
            self.conn.take()
        } else {
            None
        }
    }

    /// The body has ended.
    pub fn is_done(&self) -> bool {
        self.decoder == Decoder::Done
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match this.decoder.step(&mut conn.pending) {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
                Ok(None) if this.decoder == Decoder::Done => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let read = std::task::ready!(conn.io.poll_read_into(cx, &mut conn.pending));
            let ended = match read {
                Ok(0) => this.decoder.at_eof(),
                Ok(_) => continue,
                Err(e) => Err(BodyError::Io(e)),
            };
            if let Err(e) = ended {
                this.conn = None;
                return Poll::Ready(Some(Err(e)));
            }
            // The peer closed: the body ended with it, and so did the connection.
            this.reusable = false;
            return Poll::Ready(None);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder == Decoder::Done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.decoder.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn head(text: &str, method: Method) -> FinalHead {
        parse_head(text.as_bytes(), &method)
            .unwrap()
            .unwrap()
            .1
            .unwrap()
    }

    /// Each way an answer can be framed is read as RFC 9112 §6.3 says.
    #[test]
    fn answer_framing_follows_the_rfc() {
        let (_, f, reuse) = head(
            "HTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\n",
            Method::POST,
        );
        assert_eq!((f, reuse), (Framing::Length(5), true));
        let (_, f, reuse) = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n",
            Method::GET,
        );
        assert_eq!((f, reuse), (Framing::Chunked, true));
        let (p, _, _) = head("HTTP/1.1 404\r\ncontent-length: 0\r\n\r\n", Method::GET);
        assert_eq!(p.status, StatusCode::NOT_FOUND);
        let (_, f, reuse) = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET);
        assert_eq!((f, reuse), (Framing::UntilClose, false));
        let (_, f, _) = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::HEAD);
        assert_eq!(f, Framing::Empty);
        let (_, f, _) = head("HTTP/1.1 204 No Content\r\n\r\n", Method::DELETE);
        assert_eq!(f, Framing::Empty);
        let (_, _, reuse) = head(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            Method::GET,
        );
        assert!(!reuse);
        let (_, _, reuse) = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET);
        assert!(!reuse);
        assert!(
            parse_head(
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                &Method::GET
            )
            .is_err()
        );
        assert!(parse_head(b"HTTP/1.1 101 Switching\r\n\r\n", &Method::GET).is_err());
        // An answer another parser could frame differently fails the call.
        for text in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx: y\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n folded: y\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length : 5\r\n\r\n",
            b"HTTP/1.1  200 OK\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.2 200 OK\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\ncontent-length: 5\r\n\r\n",
        ] {
            assert!(parse_head(text, &Method::GET).is_err(), "{text:?}");
        }
        assert!(matches!(
            parse_head(b"HTTP/1.1 100 Continue\r\n\r\n", &Method::GET),
            Ok(Some((_, None)))
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::GET),
            Ok(None)
        ));
    }
}
