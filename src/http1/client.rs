//! One HTTP/1.1 connection to the upstream, in place of hyper's client connection: a
//! request written, the answer's head read, its body decoded as the holder reads it.
//!
//! Why not hyper's: each of its client connections keeps an 8 KiB write buffer, a read
//! buffer and a dispatch channel for as long as it is open — about 30 KiB a connection,
//! and a burst opens hundreds. Here an open connection is its socket and the bytes it has
//! read and not yet handed out; reads go through the thread's scratch buffer ([`Io`]).
//!
//! What matters for idempotency is reported exactly: [`SendError::NotSent`] only when no
//! byte of the request reached the transport.

use std::io;
use std::task::Poll;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Version, request, response};
use http_body::Body;

use super::decode::{BodyError, Decoder};
use super::encode::{head_capacity, push_fields, write_message};
use super::io::{Io, Transport};
use super::{BoxError, Framing};

/// Fields an answer's head may carry at most.
const MAX_FIELDS: usize = 100;
/// Largest answer head.
const MAX_HEAD: usize = 256 * 1024;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not a byte of the request was written.
    #[error("the connection refused the request before it was written: {0}")]
    NotSent(#[source] io::Error),
    /// The request was (or may have been) written; the answer is unknown.
    #[error("{0}")]
    Failed(#[source] BoxError),
}

/// An upstream connection between exchanges.
pub struct Connection {
    io: Io,
    /// Bytes read and not yet handed out (the rest of an answer's head or body).
    pending: Vec<u8>,
}

impl Connection {
    pub fn new(transport: impl Transport + 'static) -> Self {
        Self {
            io: Io::new(transport),
            pending: Vec::new(),
        }
    }

    /// Whether an idle connection can carry a request: the upstream has neither closed it
    /// nor sent anything unasked. Looks without waiting.
    pub async fn is_usable(&mut self) -> bool {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(self.io.poll_read_into(cx, &mut self.pending)))
                .await;
        matches!(polled, Poll::Pending)
    }

    /// Sends `head` and `body` and reads the answer's head; the answer's body is read
    /// through the returned [`Answer`].
    pub async fn send<B>(
        mut self,
        head: request::Parts,
        body: B,
    ) -> Result<Response<Answer>, SendError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let method = head.method.clone();
        let (out, framing) = request_head(head, &body);
        if let Err(e) = write_message(&self.io, out, body, framing).await {
            if !e.started {
                return Err(SendError::NotSent(e.error));
            }
            return Err(SendError::Failed(Box::new(e.error)));
        }
        let (parts, framing, reusable) = self.read_head(&method).await?;
        if self.pending.capacity() > 0 && self.pending.is_empty() {
            self.pending = Vec::new();
        }
        let answer = Answer {
            decoder: Decoder::new(framing),
            conn: Some(self),
            reusable,
        };
        Ok(Response::from_parts(parts, answer))
    }

    /// Reads heads until a final one (`1xx` answers are skipped).
    async fn read_head(
        &mut self,
        method: &Method,
    ) -> Result<(response::Parts, Framing, bool), SendError> {
        loop {
            if !self.pending.is_empty() {
                match parse_head(&self.pending, method) {
                    Ok(Some((len, head))) => {
                        self.pending.drain(..len);
                        match head {
                            Some(head) => return Ok(head),
                            None => continue, // informational
                        }
                    }
                    Ok(None) if self.pending.len() <= MAX_HEAD => {}
                    Ok(None) => return Err(failed("the answer's head is too large")),
                    Err(e) => return Err(SendError::Failed(e)),
                }
            }
            let read = std::future::poll_fn(|cx| self.io.poll_read_into(cx, &mut self.pending));
            match read.await {
                Ok(0) => return Err(failed("the connection closed before an answer")),
                Ok(_) => {}
                Err(e) => return Err(SendError::Failed(Box::new(e))),
            }
        }
    }
}

fn failed(what: &'static str) -> SendError {
    SendError::Failed(what.into())
}

/// The request's head in bytes, and how its body is framed.
fn request_head<B: Body>(mut head: request::Parts, body: &B) -> (Vec<u8>, Framing) {
    let method = &head.method;
    let headers = &mut head.headers;
    headers.remove(header::TRANSFER_ENCODING);
    let framing = match body.size_hint().exact() {
        // A request without a body says so only where a body is usual.
        Some(0) if !matches!(*method, Method::POST | Method::PUT | Method::PATCH) => {
            headers.remove(header::CONTENT_LENGTH);
            Framing::Empty
        }
        Some(0) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
            Framing::Empty
        }
        Some(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            Framing::Length(n)
        }
        None => {
            headers.remove(header::CONTENT_LENGTH);
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
            Framing::Chunked
        }
    };
    let target = head
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut out = Vec::with_capacity(head_capacity(&head.headers) + target.len());
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    push_fields(&mut out, &head.headers);
    (out, framing)
}

/// A final head: its parts, how its body is framed, and whether the connection can carry
/// another request after it.
type FinalHead = (response::Parts, Framing, bool);

/// Parses an answer's head: how many bytes it took and the head (`None` for a `1xx`), or
/// `Ok(None)` while it is incomplete.
fn parse_head(buf: &[u8], method: &Method) -> Result<Option<(usize, Option<FinalHead>)>, BoxError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(buf)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(code), Some(minor)) = (resp.code, resp.version) else {
        return Err("incomplete status line".into());
    };
    let status = StatusCode::from_u16(code)?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err("the upstream switched protocols, which the proxy never asks for".into());
    }
    if status.is_informational() {
        return Ok(Some((len, None)));
    }
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for field in resp.headers.iter() {
        headers.append(
            HeaderName::from_bytes(field.name.as_bytes())?,
            HeaderValue::from_bytes(field.value)?,
        );
    }
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let framing = answer_framing(&headers, status, method)?;
    let reusable = framing != Framing::UntilClose && keeps_alive(&headers, version);
    let mut parts = Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((len, Some((parts, framing, reusable)))))
}

/// How an answer's body is delimited (RFC 9112 §6.3).
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
    if let Some(last) = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .rfind(|c| !c.is_empty())
    {
        return Ok(if last.eq_ignore_ascii_case("chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        });
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let n: u64 = std::str::from_utf8(part.trim_ascii())
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .ok_or("invalid Content-Length in the answer")?;
            if length.is_some_and(|seen| seen != n) {
                return Err("differing Content-Length values in the answer".into());
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

fn keeps_alive(headers: &HeaderMap, version: Version) -> bool {
    let tokens = || {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
    };
    if tokens().any(|t| t.eq_ignore_ascii_case(b"close")) {
        return false;
    }
    version == Version::HTTP_11 || tokens().any(|t| t.eq_ignore_ascii_case(b"keep-alive"))
}

/// An answer's body, read from its connection; the connection is given back by
/// [`Answer::into_connection`] once the body has ended.
pub struct Answer {
    decoder: Decoder,
    conn: Option<Connection>,
    reusable: bool,
}

impl Answer {
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

impl Body for Answer {
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
        match self.decoder.remaining() {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
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
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            Method::GET,
        );
        assert_eq!((f, reuse), (Framing::Chunked, true));
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
        assert!(matches!(
            parse_head(b"HTTP/1.1 100 Continue\r\n\r\n", &Method::GET),
            Ok(Some((_, None)))
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::GET),
            Ok(None)
        ));
    }

    /// A request's framing comes from its body; bodiless GETs carry no length.
    #[test]
    fn request_heads_frame_their_bodies() {
        let parts = |m: Method| {
            let (mut p, ()) = http::Request::new(()).into_parts();
            p.method = m;
            p.uri = "/payments?x=1".parse().unwrap();
            p.headers.insert("content-length", HeaderValue::from(99));
            p
        };
        let full = http_body_util::Full::new(Bytes::from_static(b"abc"));
        let (out, f) = request_head(parts(Method::POST), &full);
        assert_eq!(f, Framing::Length(3));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("POST /payments?x=1 HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(
            text.contains("content-length: 3\r\n") && !text.contains("99"),
            "{text}"
        );
        let empty = http_body_util::Empty::<Bytes>::new();
        let (out, f) = request_head(parts(Method::GET), &empty);
        assert_eq!(f, Framing::Empty);
        assert!(!String::from_utf8(out).unwrap().contains("content-length"));
    }
}
