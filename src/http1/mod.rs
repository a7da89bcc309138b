//! HTTP/1.1 on the wire, for both sides of the proxy: the transport with its per-thread
//! read buffer ([`io`]), body decoding ([`decode`]) and message writing ([`encode`]), and
//! the upstream connection ([`client`]) and its answers ([`answer`]). The client-facing
//! connection that uses the same parts is [`crate::server`]'s.
//!
//! Why the proxy speaks HTTP/1 itself rather than through hyper: hyper keeps read and
//! write buffers for every connection for as long as it is open, on both sides, and with a
//! thousand clients waiting on the store those buffers were most of the proxy's memory
//! (`bench/RESULTS.md`). HTTP/2 clients are still served by hyper.

pub mod answer;
pub mod client;
pub mod decode;
pub mod encode;
pub mod fields;
pub mod io;

pub use decode::{BodyError, Decoder};

/// How a message's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the connection closes (only an answer can be framed so).
    UntilClose,
}
