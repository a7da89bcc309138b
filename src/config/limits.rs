//! `limits:` — what one client, connection or peer may cost the proxy, so that a slow or
//! hostile one cannot exhaust it (memory, connection slots, the upstream, the store) and
//! well-behaved clients keep being served.

use std::time::Duration;

/// Connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Time to send a request head.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to send a protected request's body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Detached executions per upstream connection allowed by default: the upstream takes
/// `upstream.max_connections` at once, and this many times that may wait for it.
pub const DEFAULT_DETACHED_PER_UPSTREAM_CONNECTION: usize = 4;
/// An HTTP/2 connection with no open stream for this long is closed (with GOAWAY).
pub const DEFAULT_HTTP2_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often an HTTP/2 peer is pinged.
pub const DEFAULT_HTTP2_PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long a ping may go unanswered before the connection is closed.
pub const DEFAULT_HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams one HTTP/2 connection may have open at once.
pub const DEFAULT_HTTP2_MAX_STREAMS: usize = 100;
/// How long a peer may leave what the proxy sends it unread before it is disconnected.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds on clients, so that slow or hostile ones cannot exhaust the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further ones wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Time to send a request head (slowloris); the connection is closed past it.
    pub header_read_timeout: Duration,
    /// Time to send a protected request's body; `408` past it.
    pub body_read_timeout: Duration,
    /// Largest request head; `431` beyond.
    pub max_header_bytes: usize,
    /// Work the proxy owns (a protected request from its reservation to its stored
    /// answer, which outlives a client that leaves): checked before reserving.
    pub detached: Detached,
    /// An HTTP/2 connection with no open stream for this long is closed with GOAWAY.
    pub http2_idle_timeout: Duration,
    /// How often an HTTP/2 peer is pinged, and how long it may take to answer.
    pub http2_ping_interval: Duration,
    pub http2_ping_timeout: Duration,
    /// Streams one HTTP/2 connection may have open at once.
    pub http2_max_streams: usize,
    /// How long a peer may leave what the proxy sends it unread (its receive window or
    /// socket full) before it is disconnected.
    pub send_timeout: Duration,
}

/// Bounds on detached executions: past any of them a protected request gets `503` with
/// `Retry-After`, and nothing is reserved or forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detached {
    /// In the whole process.
    pub max: usize,
    /// For one client id: one client cannot take every slot from the others.
    pub per_client: usize,
    /// For one connection: on HTTP/2 a reset stream's work counts until it finishes.
    pub per_connection: usize,
}

impl Detached {
    /// The default bound for an upstream that takes `upstream_connections` requests at
    /// once: that many executing, and three times as many waiting for it — 2048 at least,
    /// so that a burst of a thousand concurrent requests from one client (half the bound)
    /// waits for the upstream (within `upstream.timeout`) rather than being refused.
    pub fn default_max(upstream_connections: usize) -> usize {
        upstream_connections
            .saturating_mul(DEFAULT_DETACHED_PER_UPSTREAM_CONNECTION)
            .max(2048)
    }
}
