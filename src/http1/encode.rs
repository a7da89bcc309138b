//! Writing a message on the wire: the head's fields, then the body framed by its length or
//! in chunks — the same for answers to clients and requests to the upstream.
//!
//! A small message goes out in one write with its head; a streamed body is flushed
//! whenever it has nothing ready, so a slow sender's first bytes are not held back.

use std::io;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;

use super::Framing;
use super::io::Io;
use crate::body::BoxError;

/// A body's data at most copied beside the head (or earlier data) into one write.
const COALESCE: usize = 16 * 1024;

/// Room for a head with these fields and a start line.
pub fn head_capacity(headers: &HeaderMap) -> usize {
    64 + headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
}

/// Appends the fields and the empty line that ends a head.
pub fn push_fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// How writing a message failed.
#[derive(Debug)]
pub struct WriteError {
    pub error: io::Error,
    /// Some of the message had been handed to the transport.
    pub started: bool,
}

impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> Self {
        e.error
    }
}

/// Writes `out` (a head, and whatever was already put after it) and then `body` in
/// `framing` (`Empty`: no body is written).
pub async fn write_message<B>(
    io: &Io,
    mut out: Vec<u8>,
    mut body: B,
    framing: Framing,
) -> Result<(), WriteError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut writer = Writer { io, started: false };
    if framing == Framing::Empty {
        writer.write(&out).await?;
        return writer.flush().await;
    }
    let mut sent: u64 = 0;
    loop {
        // What the body has now; only when it has nothing is the buffer written out and
        // the body awaited.
        let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
        let frame = match polled.await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                writer.write(&out).await?;
                writer.flush().await?;
                out.clear();
                std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        let data = match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // trailer fields are not sent
            },
            // The message cannot be completed: the peer must see it end unfinished.
            Some(Err(e)) => return Err(writer.fail(io::Error::other(e.into()))),
        };
        if data.is_empty() {
            continue;
        }
        sent += data.len() as u64;
        match framing {
            Framing::Length(n) if sent > n => {
                return Err(writer.fail(io::Error::other("the body is longer than its length")));
            }
            Framing::Chunked => {
                out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                writer.push(&mut out, data).await?;
                out.extend_from_slice(b"\r\n");
            }
            _ => writer.push(&mut out, data).await?,
        }
    }
    match framing {
        Framing::Length(n) if sent < n => {
            return Err(writer.fail(io::Error::other("the body ended before its length")));
        }
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        _ => {}
    }
    writer.write(&out).await?;
    writer.flush().await
}

/// The transport, and whether any of the message went out.
struct Writer<'a> {
    io: &'a Io,
    started: bool,
}

impl Writer<'_> {
    async fn write(&mut self, mut buf: &[u8]) -> Result<(), WriteError> {
        while !buf.is_empty() {
            match std::future::poll_fn(|cx| self.io.poll_write(cx, buf)).await {
                Ok(0) => return Err(self.fail(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.started = true;
                    buf = &buf[n..];
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), WriteError> {
        let flushed = std::future::poll_fn(|cx| self.io.poll_flush(cx)).await;
        flushed.map_err(|e| self.fail(e))
    }

    /// Adds `data` to what is to be written: copied when small, else written after it.
    async fn push(&mut self, out: &mut Vec<u8>, data: Bytes) -> Result<(), WriteError> {
        if out.len() + data.len() <= COALESCE {
            out.extend_from_slice(&data);
            return Ok(());
        }
        self.write(out).await?;
        out.clear();
        self.write(&data).await
    }

    fn fail(&self, error: io::Error) -> WriteError {
        WriteError {
            error,
            started: self.started,
        }
    }
}
