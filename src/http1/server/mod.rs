//! The server side of HTTP/1 — a connection a client opened to the proxy — in place of
//! hyper's server: request heads, bodies, answers and keep-alive, with no buffer held
//! while a connection waits.
//!
//! Why not hyper's: it keeps an 8 KiB read and an 8 KiB write buffer for every
//! connection from its first byte to its last, and reads ahead into a fresh one while a
//! request is in flight. With a thousand clients waiting on the store that was most of the
//! proxy's memory. Here a waiting connection holds its socket, its parsed request and
//! nothing else: reads go through one scratch buffer per thread ([`crate::http1::io`]),
//! answers are written from a buffer of their own size ([`write`]).
//!
//! What the connection does, in order: wait for a head (within the header timeout, and
//! not at all once the server drains), refuse a malformed one with a problem answer and
//! close, lend the body to the request (`body.rs`), answer, take the body's transport back,
//! and carry on only if the framing is known to be intact. A client that hangs up while
//! its request waits ends the request's future, as it did under hyper; the proxy's
//! detached work is not tied to it.

mod body;
mod error;
#[cfg(test)]
mod fuzz;
mod head;
mod target;
mod write;

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use body::RequestBody;
pub use error::HeadError;
pub use error::MAX_HEADERS;

use body::Returned;
use head::Head;
use write::{Exchange, write_response};

use crate::body::ProxyBody;
use crate::http1::io::{Io, Transport};
use crate::http1::{Decoder, Framing};

/// What a connection hands its requests to (the proxy). A trait so that HTTP/1 knows
/// nothing of what answers, the way hyper's `server::conn` takes a service.
pub trait Handler: Send + Sync {
    /// The answer to `request` from `peer`.
    fn handle(
        &self,
        request: http::Request<OptionalBody>,
        peer: SocketAddr,
    ) -> impl Future<Output = http::Response<ProxyBody>> + Send + '_;

    /// The answer to a head that cannot be served, sent before the connection closes.
    fn refuse(&self, error: &HeadError) -> http::Response<ProxyBody>;
}

/// What bounds a connection.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    /// Time to send a whole head, counted from when the connection starts waiting for it.
    pub(crate) head_timeout: Duration,
    /// Largest head.
    pub(crate) max_head: usize,
}

/// Why a connection ended badly (for `connection_errors_total`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("no complete request head within the header read timeout")]
    HeadTimeout,
    #[error("{0}")]
    Head(HeadError),
    #[error("the client closed the connection in the middle of a request")]
    ClosedEarly,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ConnError {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ConnError::HeadTimeout => "header_timeout",
            ConnError::Head(HeadError::TooLarge { .. } | HeadError::UriTooLong { .. }) => {
                "head_too_large"
            }
            ConnError::Head(_) => "malformed",
            ConnError::ClosedEarly => "closed_early",
            ConnError::Io(_) => "other",
        }
    }
}

/// Serves HTTP/1 requests on `transport` until the client closes, a request asks to, the
/// framing breaks, or the server drains.
pub(crate) async fn serve_connection<H: Handler>(
    transport: impl Transport + 'static,
    handler: &H,
    peer: SocketAddr,
    limits: Limits,
    draining: &CancellationToken,
) -> Result<(), ConnError> {
    let io = Io::new(transport);
    // Bytes read and not yet used: part of a head, or of the next request.
    let mut pending = Vec::new();
    loop {
        // The head is consumed inside the match arm, so that the connection's state does
        // not keep it while the request waits.
        let (method, version, keep_alive, mut lent, handled) =
            match next_head(&io, &mut pending, limits, draining).await? {
                None => return Ok(()),
                Some(Err(e)) => {
                    // Boxed: the refusal's state is the largest of the connection's, and
                    // inline it would size every connection (a thousand, idle or not).
                    Box::pin(refuse(&io, handler, &e)).await;
                    return Err(ConnError::Head(e));
                }
                Some(Ok(head)) => {
                    let method = head.request.method().clone();
                    let version = head.request.version();
                    let keep_alive = head.keep_alive;
                    let (lent, request) = lend(head, &io, &mut pending);
                    (
                        method,
                        version,
                        keep_alive,
                        lent,
                        handler.handle(request, peer),
                    )
                }
            };
        // A body that came back before it ended, kept for `settle`.
        let mut parked = None;
        let answered = {
            tokio::pin!(handled);
            // While the request is handled, the connection watches for the client hanging
            // up, but only once the body is back whole: until then the body reads.
            let mut watching = lent.is_none();
            loop {
                tokio::select! {
                    resp = &mut handled => break Some(resp),
                    returned = recv(&mut lent), if lent.is_some() => {
                        lent = None;
                        match returned {
                            Some(r) if !r.broken && r.decoder == Decoder::Done => {
                                pending = r.pending;
                                watching = true;
                            }
                            other => parked = Some(other),
                        }
                    }
                    gone = hang_up(&io, &mut pending), if watching => {
                        if gone {
                            break None;
                        }
                        // Read ahead no further than a head.
                        watching = pending.len() <= limits.max_head;
                    }
                }
            }
        };
        let Some(resp) = answered else {
            return Err(ConnError::ClosedEarly);
        };
        let exchange = Exchange {
            method: &method,
            version,
            keep_alive: keep_alive && !draining.is_cancelled(),
        };
        let mut again = write_response(&io, resp, &exchange).await?;
        if let Some(returned) = lent.take() {
            // The request may still hold its body (an upstream reading it as the answer
            // streamed); it has as long as a head would to let go.
            let returned = tokio::time::timeout(limits.head_timeout, returned).await;
            again &= settle(returned.ok().and_then(Result::ok), &mut pending);
        } else if let Some(returned) = parked {
            again &= settle(returned, &mut pending);
        }
        if !again {
            let _ = io.shutdown().await;
            return Ok(());
        }
    }
}

/// The request to hand to the proxy, with its body lent when it has one, and where the
/// body comes back. (A function of its own so the head is not kept in the connection's
/// state while the request waits.)
fn lend(
    head: Head,
    io: &Io,
    pending: &mut Vec<u8>,
) -> (
    Option<oneshot::Receiver<Returned>>,
    http::Request<OptionalBody>,
) {
    let Head {
        request,
        framing,
        expect_continue,
        ..
    } = head;
    if framing == Framing::Empty {
        return (None, request.map(|()| OptionalBody(None)));
    }
    let (back, returned) = oneshot::channel();
    let body = RequestBody::lend(
        io.clone(),
        std::mem::take(pending),
        framing,
        expect_continue,
        back,
    );
    (Some(returned), request.map(|()| OptionalBody(Some(body))))
}

/// The lent body's return, once it comes (`None` if it was lost).
async fn recv(lent: &mut Option<oneshot::Receiver<Returned>>) -> Option<Returned> {
    lent.as_mut()?.await.ok()
}

/// A request's body as the proxy sees it: none, or the lent one.
pub struct OptionalBody(Option<RequestBody>);

impl http_body::Body for OptionalBody {
    type Data = bytes::Bytes;
    type Error = crate::http1::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        match self.0.as_mut() {
            Some(body) => std::pin::Pin::new(body).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.0 {
            Some(body) => body.size_hint(),
            None => http_body::SizeHint::with_exact(0),
        }
    }
}

/// Waits for the next head: `None` when the client closes between requests or the
/// server drains before a byte of it arrived.
async fn next_head(
    io: &Io,
    pending: &mut Vec<u8>,
    limits: Limits,
    draining: &CancellationToken,
) -> Result<Option<Result<Head, HeadError>>, ConnError> {
    let deadline = tokio::time::sleep(limits.head_timeout);
    tokio::pin!(deadline);
    loop {
        if !pending.is_empty() {
            match head::parse(pending, limits.max_head) {
                Ok(Some((head, len))) => {
                    pending.drain(..len);
                    return Ok(Some(Ok(head)));
                }
                Ok(None) => {}
                Err(e) => return Ok(Some(Err(e))),
            }
        } else if pending.capacity() > 0 {
            // Between requests a connection keeps no buffer.
            *pending = Vec::new();
        }
        let idle = pending.is_empty();
        let read = tokio::select! {
            biased;
            () = draining.cancelled(), if idle => return Ok(None),
            () = &mut deadline => return Err(ConnError::HeadTimeout),
            read = poll_fn(|cx| io.poll_read_into(cx, pending)) => read,
        };
        match read {
            Ok(0) if idle => return Ok(None),
            Ok(0) => return Err(ConnError::ClosedEarly),
            Ok(_) => {}
            Err(_) if idle => return Ok(None),
            Err(e) => return Err(ConnError::Io(e)),
        }
    }
}

/// Resolves `true` when the client hangs up; `false` when bytes of a next request came
/// (kept in `pending`, to be read after this answer).
async fn hang_up(io: &Io, pending: &mut Vec<u8>) -> bool {
    matches!(
        poll_fn(|cx| io.poll_read_into(cx, pending)).await,
        Ok(0) | Err(_)
    )
}

/// Whether the connection can read a next request after this body: yes when the body
/// ended, or when its rest was already read and can be skipped; no when it broke, was
/// never sent (`100 Continue` owed), or is still on its way.
fn settle(returned: Option<Returned>, pending: &mut Vec<u8>) -> bool {
    let Some(mut r) = returned else {
        return false;
    };
    if r.broken || !r.continued && r.decoder != Decoder::Done {
        return false;
    }
    loop {
        match r.decoder.step(&mut r.pending) {
            Ok(Some(_)) => {}
            Ok(None) if r.decoder == Decoder::Done => {
                *pending = r.pending;
                return true;
            }
            Ok(None) | Err(_) => return false,
        }
    }
}

/// Answers a head that cannot be served, as a problem document, before closing.
async fn refuse(io: &Io, handler: &impl Handler, e: &HeadError) {
    let answer = handler.refuse(e);
    tracing::info!(status = answer.status().as_u16(), reason = %e, "request head refused");
    let exchange = Exchange {
        method: &http::Method::GET,
        version: http::Version::HTTP_11,
        keep_alive: false,
    };
    if write_response(io, answer, &exchange).await.is_ok() {
        let _ = io.shutdown().await;
    }
}
