//! The request path: route lookup, pass-through, and the idempotency state machine.

mod forward;
mod headers;
mod job;
mod key;
mod lease;
mod live;
mod machine;
mod observe;
mod pool;
mod protect;
mod reconcile;
mod rewrite;
mod service;
mod state;
mod upstream;

pub use forward::{ForwardError, Forwarder};
pub use headers::{decode_stored, encode_block, encode_stored};
pub use key::{body_key, parse_key};
pub use live::Reloaded;
pub use pool::UpstreamBody;
pub use reconcile::Reconciled;
pub use state::Proxy;
