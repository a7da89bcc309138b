//! The request path: route lookup, pass-through, and the idempotency state machine.

mod admission;
mod call;
mod conclude;
mod faults;
mod headers;
mod held;
mod identity;
mod job;
mod journal;
mod key;
mod lease;
mod live;
mod machine;
mod observe;
mod protect;
mod reconcile;
mod rewrite;
mod service;
mod state;

pub use admission::{ConnectionWork, Refused};
pub use faults::{Fault, FaultKind};
pub use journal::{CAPACITY as JOURNAL_CAPACITY, Journal, Seen};
pub use key::{body_key, parse_key};
pub use live::Reloaded;
pub use reconcile::Reconciled;
pub use state::Proxy;

#[cfg(test)]
mod sizes_tests;
