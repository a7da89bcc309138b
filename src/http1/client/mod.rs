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

pub mod answer;

use std::io;
use std::task::Poll;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Response, request, response};
use http_body::Body;

use super::Framing;
use super::decode::Decoder;
use super::encode::{head_capacity, push_fields, write_message};
use super::io::{Io, Transport};
use crate::body::BoxError;
use answer::{AnswerBody, parse_head};

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
    pub(super) io: Io,
    /// Bytes read and not yet handed out (the rest of an answer's head or body).
    pub(super) pending: Vec<u8>,
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
    /// through the returned [`AnswerBody`].
    pub async fn send<B>(
        mut self,
        head: request::Parts,
        body: B,
    ) -> Result<Response<AnswerBody>, SendError>
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
        let answer = AnswerBody::new(Decoder::new(framing), self, reusable);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
