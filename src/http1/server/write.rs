//! Writing an answer in HTTP/1.1: which framing and connection fields it gets (RFC 9112
//! §6–7, §9), then the status line, the fields and the body through the shared encoder.

use std::cell::RefCell;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Version};
use http_body::Body;

use crate::body::ProxyBody;
use crate::http1::Framing;
use crate::http1::encode::{head_capacity, push_fields, write_message};
use crate::http1::fields::{connection_says, content_length};
use crate::http1::io::Io;

/// What the request asked of the answer's framing.
pub(super) struct Exchange<'a> {
    pub(super) method: &'a Method,
    pub(super) version: Version,
    /// The connection may carry another request after this answer.
    pub(super) keep_alive: bool,
}

/// Writes `resp`; returns whether the connection may carry another request.
pub(super) async fn write_response(
    io: &Io,
    resp: Response<ProxyBody>,
    exchange: &Exchange<'_>,
) -> io::Result<bool> {
    let (mut parts, body) = resp.into_parts();
    let status = parts.status;
    let (framing, keep_alive) = frame(&mut parts.headers, status, &body, exchange);
    let mut out = Vec::with_capacity(head_capacity(&parts.headers));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    push_fields(&mut out, &parts.headers);
    write_message(io, out, body, framing).await?;
    Ok(keep_alive)
}

/// Sets the answer's framing and connection fields; returns the framing and whether the
/// connection stays open after it.
fn frame(
    headers: &mut HeaderMap,
    status: StatusCode,
    body: &ProxyBody,
    exchange: &Exchange<'_>,
) -> (Framing, bool) {
    let bodiless = exchange.method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let mut keep_alive = exchange.keep_alive && !connection_says(headers, "close");
    headers.remove(header::TRANSFER_ENCODING);
    let framing = if bodiless {
        // HEAD and 304 keep the length the upstream gave; 204 and 1xx have none.
        if status == StatusCode::NO_CONTENT || status.is_informational() {
            headers.remove(header::CONTENT_LENGTH);
        }
        Framing::Empty
    } else if let Some(n) = body.size_hint().exact() {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        if n == 0 {
            Framing::Empty
        } else {
            Framing::Length(n)
        }
    } else if let Ok(Some(n)) = content_length(headers) {
        Framing::Length(n)
    } else if exchange.version == Version::HTTP_11 {
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        Framing::Chunked
    } else {
        // An HTTP/1.0 client and a body of unknown length: it ends with the connection.
        keep_alive = false;
        Framing::UntilClose
    };
    headers.remove(header::CONNECTION);
    if !keep_alive {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    } else if exchange.version == Version::HTTP_10 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    }
    if !headers.contains_key(header::DATE) {
        headers.insert(header::DATE, date());
    }
    (framing, keep_alive)
}

thread_local! {
    /// The `Date` value of the current second, formatted once per second per thread.
    static DATE: RefCell<(u64, HeaderValue)> =
        const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
}

fn date() -> HeaderValue {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if let Ok(value) = HeaderValue::from_str(&text) {
                *cached = (secs, value);
            }
        }
        cached.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{empty, full};

    fn framed(
        status: u16,
        body: ProxyBody,
        method: Method,
        version: Version,
        keep_alive: bool,
    ) -> (Framing, bool, HeaderMap) {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(99));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let exchange = Exchange {
            method: &method,
            version,
            keep_alive,
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        let (f, k) = frame(&mut headers, status, &body, &exchange);
        (f, k, headers)
    }

    /// A known body length wins over any field the upstream sent; HEAD keeps the field.
    #[test]
    fn known_lengths_frame_the_answer() {
        let (f, keep, h) = framed(201, full("abc"), Method::POST, Version::HTTP_11, true);
        assert_eq!((f, keep), (Framing::Length(3), true));
        assert_eq!(
            h.get("content-length").map(HeaderValue::as_bytes),
            Some(&b"3"[..])
        );
        assert!(h.get("transfer-encoding").is_none() && h.get("date").is_some());
        let (f, _, h) = framed(200, empty(), Method::HEAD, Version::HTTP_11, true);
        assert_eq!(f, Framing::Empty);
        assert_eq!(
            h.get("content-length").map(HeaderValue::as_bytes),
            Some(&b"99"[..])
        );
        let (f, _, h) = framed(204, full("x"), Method::DELETE, Version::HTTP_11, true);
        assert_eq!(f, Framing::Empty);
        assert!(h.get("content-length").is_none());
    }

    /// Closing is said in the answer, and HTTP/1.0 clients are told when it stays open.
    #[test]
    fn connection_fields_say_what_happens() {
        let (_, keep, h) = framed(200, full("x"), Method::GET, Version::HTTP_11, false);
        assert!(!keep);
        assert_eq!(
            h.get("connection").map(HeaderValue::as_bytes),
            Some(&b"close"[..])
        );
        let (_, keep, h) = framed(200, full("x"), Method::GET, Version::HTTP_10, true);
        assert!(keep);
        assert_eq!(
            h.get("connection").map(HeaderValue::as_bytes),
            Some(&b"keep-alive"[..])
        );
    }
}
