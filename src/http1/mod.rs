//! HTTP/1.1 on the wire, for both sides of the proxy, the way pingora lays out its `v1`:
//! the shared parts — the transport with its per-thread read buffer ([`io`]), body
//! decoding ([`decode`]), message writing ([`encode`]), the framing fields ([`fields`]) —
//! and the two sides beside each other: [`server`], the connection a client opened to the
//! proxy, and [`client`], the proxy's connection to the upstream and its answers. Here
//! "client" is always the upstream side; the peer of a [`server`] connection is the
//! downstream caller. Accepting, protocol sniffing and drain are [`crate::server`]'s.
//!
//! Why the proxy speaks HTTP/1 itself rather than through hyper: hyper keeps read and
//! write buffers for every connection for as long as it is open, on both sides, and with a
//! thousand clients waiting on the store those buffers were most of the proxy's memory
//! (`bench/RESULTS.md`). HTTP/2 clients are still served by hyper.

pub mod client;
pub mod decode;
pub mod encode;
pub mod fields;
pub mod grammar;
pub mod io;
pub mod server;

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
