//! Why a client connection ended badly: for the log and `connection_errors_total`.

/// Why a client connection ended badly, for the log and `connection_errors_total`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Http(Box<dyn std::error::Error + Send + Sync>),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("no request head within the header read timeout")]
    NoHead,
    #[error("{0}")]
    H1(#[from] crate::http1::server::ConnError),
    #[error("the peer left what it was sent unread past limits.send_timeout")]
    SendTimeout,
}

impl ConnError {
    pub(crate) fn kind(&self) -> &'static str {
        let e = match self {
            ConnError::Http(e) => e,
            ConnError::Tls(_) => return "tls_handshake",
            ConnError::NoHead => return "header_timeout",
            ConnError::SendTimeout => return "send_timeout",
            ConnError::H1(e) => return e.kind(),
        };
        match e.downcast_ref::<hyper::Error>() {
            Some(h) if h.is_timeout() => "header_timeout",
            Some(h) if h.is_parse_too_large() => "head_too_large",
            Some(h) if h.is_parse() => "malformed",
            Some(h) if h.is_incomplete_message() || h.is_closed() => "closed_early",
            _ => "other",
        }
    }
}
