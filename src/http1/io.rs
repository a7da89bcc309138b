//! A connection's transport, on either side: shared by a server connection's task (heads,
//! answers) and the request body it lends to the proxy, or by an upstream connection and
//! the answer body it streams; and the one read buffer per thread.
//!
//! Why a read buffer per thread and not per connection: a connection waiting for its
//! next request, or for the store while its request is protected, holds no buffer at all.
//! A read lands in the thread's scratch buffer and only what the connection still needs
//! (a head in parts, bytes of the next request) is copied into a `Vec` of its own.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a connection runs over: plain TCP or TLS.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// Bytes one read takes at most.
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// The connection's transport. Reads and writes each hold the lock for one poll only, so
/// the body being read by the proxy and the answer being written never wait on each other.
#[derive(Clone)]
pub struct Io(Arc<Mutex<dyn Transport>>);

impl Io {
    pub fn new(io: impl Transport + 'static) -> Self {
        Io(Arc::new(Mutex::new(io)))
    }

    fn lock(&self) -> MutexGuard<'_, dyn Transport + 'static> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads what has arrived and appends it to `into`; `Ok(0)` at the end of the stream.
    pub fn poll_read_into(
        &self,
        cx: &mut Context<'_>,
        into: &mut Vec<u8>,
    ) -> Poll<io::Result<usize>> {
        SCRATCH_BUF.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => self.poll_read_with(cx, &mut scratch, into),
            // Only if a transport read from within a read: use a buffer of the call's own.
            Err(_) => self.poll_read_with(cx, &mut [0; 4096], into),
        })
    }

    fn poll_read_with(
        &self,
        cx: &mut Context<'_>,
        scratch: &mut [u8],
        into: &mut Vec<u8>,
    ) -> Poll<io::Result<usize>> {
        let mut buf = ReadBuf::new(scratch);
        ready!(Pin::new(&mut *self.lock()).poll_read(cx, &mut buf))?;
        into.extend_from_slice(buf.filled());
        Poll::Ready(Ok(buf.filled().len()))
    }

    /// Writes from `buf`, returning how much was taken.
    pub fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write(cx, buf)
    }

    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_flush(cx)
    }

    /// Closes the write side (TLS: sends close_notify), so the peer sees the end.
    pub async fn shutdown(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| Pin::new(&mut *self.lock()).poll_shutdown(cx)).await
    }
}
