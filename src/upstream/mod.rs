//! The upstream client: one small pool of HTTP/1.1 keep-alive connections to the one
//! upstream ([`forward`]), the header hygiene at that hop ([`headers`]), and the answer's
//! body as the pool hands it out. It tells apart "nothing was sent" from "the upstream may
//! have acted", which is all the request path needs to know of a failed call.

pub mod forward;
pub mod headers;
mod pool;

pub use forward::{ForwardError, Forwarder};
pub use pool::UpstreamBody;
