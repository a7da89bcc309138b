//! Body types: one boxed body for everything the proxy answers, and a size-limited collect
//! that tells "too large" apart from "broken".

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Empty, Full, Limited, combinators::BoxBody};

/// Errors crossing body and client boundaries.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the proxy produces.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body of known bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Boxes any body whose errors can be boxed.
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// Why a body could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("body larger than {0} bytes")]
    TooLarge(u64),
    #[error("body could not be read: {0}")]
    Read(#[source] BoxError),
}

/// Reads a whole body, refusing to buffer more than `limit` bytes.
pub async fn collect_limited<B>(body: B, limit: u64) -> Result<Bytes, CollectError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(CollectError::TooLarge(limit)),
        Err(e) => Err(CollectError::Read(e)),
    }
}

/// A body that yields already-read bytes, then the rest of another body: how an answer too
/// large to store still reaches the first client whole.
pub struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: B,
}

impl<B> Prefixed<B> {
    /// `prefix` first, then everything `rest` still yields.
    pub fn new(prefix: Bytes, rest: B) -> Self {
        Self {
            prefix: Some(prefix),
            rest,
        }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        std::pin::Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }
}
