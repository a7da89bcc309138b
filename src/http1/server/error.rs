//! Why a request head was refused, on its own so that the head's parts (the target, the
//! fields) can say it without depending on each other.

/// Header fields a head may carry at most (hyper's limit, which this server replaced).
pub const MAX_HEADERS: usize = 100;

/// Why a head was refused; each is answered before the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is larger than {limit} bytes or has more than {MAX_HEADERS} fields")]
    TooLarge { limit: usize },
    #[error("the request line is longer than {limit} bytes")]
    UriTooLong { limit: usize },
    #[error("{0}")]
    Malformed(String),
    #[error("HTTP version `{0}` is not supported (HTTP/1.0 and HTTP/1.1 are)")]
    Version(String),
    #[error("transfer coding `{0}` is not supported (only `chunked`)")]
    UnsupportedCoding(String),
    #[error("{0}")]
    Unsupported(String),
}

impl HeadError {
    pub(super) fn malformed(what: impl Into<String>) -> Self {
        HeadError::Malformed(what.into())
    }
}
