//! A request body as the proxy reads it: the connection's transport lent to the request
//! until the body ends (or is dropped), then handed back with whatever bytes of the next
//! request were read past it.
//!
//! Lending instead of feeding the body through a channel keeps one reader at a time and
//! no per-connection buffer: the bytes are decoded straight from what was read.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use crate::http1::io::Io;
use crate::http1::{BodyError, Decoder, Framing};

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// What a lent body gives back to its connection.
pub(super) struct Returned {
    /// Bytes read past the body (the next request), or the body's unread rest.
    pub(super) pending: Vec<u8>,
    pub(super) decoder: Decoder,
    /// The body failed: the stream cannot be read on.
    pub(super) broken: bool,
    /// `100 Continue` was sent (or not needed): the client is sending the body.
    pub(super) continued: bool,
}

/// A request body, reading from its connection's transport.
pub struct RequestBody {
    io: Io,
    pending: Vec<u8>,
    decoder: Decoder,
    /// Bytes of `100 Continue` written so far, `None` when none is owed.
    owed_continue: Option<usize>,
    broken: bool,
    back: Option<oneshot::Sender<Returned>>,
}

impl RequestBody {
    /// A body decoded from `pending` and then `io`, given back through `back` when it ends
    /// or is dropped.
    pub(super) fn lend(
        io: Io,
        pending: Vec<u8>,
        framing: Framing,
        expect_continue: bool,
        back: oneshot::Sender<Returned>,
    ) -> Self {
        Self {
            io,
            pending,
            decoder: Decoder::new(framing),
            owed_continue: expect_continue.then_some(0),
            broken: false,
            back: Some(back),
        }
    }

    fn give_back(&mut self) {
        if let Some(back) = self.back.take() {
            let _ = back.send(Returned {
                pending: std::mem::take(&mut self.pending),
                decoder: self.decoder,
                broken: self.broken,
                continued: self.owed_continue.is_none(),
            });
        }
    }

    /// Writes the owed `100 Continue`, once the body is first asked for.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some(written) = self.owed_continue {
            if written == CONTINUE.len() {
                ready!(self.io.poll_flush(cx))?;
                self.owed_continue = None;
                break;
            }
            let n = ready!(self.io.poll_write(cx, &CONTINUE[written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.owed_continue = Some(written + n);
        }
        Poll::Ready(Ok(()))
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        if self.back.is_none() {
            return Poll::Ready(Ok(None));
        }
        ready!(self.poll_continue(cx))?;
        loop {
            if let Some(data) = self.decoder.step(&mut self.pending)? {
                return Poll::Ready(Ok(Some(data)));
            }
            if self.decoder == Decoder::Done {
                return Poll::Ready(Ok(None));
            }
            if ready!(self.io.poll_read_into(cx, &mut self.pending))? == 0 {
                return Poll::Ready(Err(BodyError::Closed));
            }
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = ready!(self.poll_data(cx));
        match polled {
            Ok(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Ok(None) => {
                self.give_back();
                Poll::Ready(None)
            }
            Err(e) => {
                self.broken = true;
                self.give_back();
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.back.is_none() || self.decoder == Decoder::Done
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.give_back();
    }
}
