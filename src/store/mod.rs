//! The key table behind the proxy: reserve before forwarding, renew while in flight,
//! complete or release under a fence, replay afterwards.
//!
//! Every successful reservation hands out a fresh lease token; renew, complete and release
//! only touch the row while it still carries that token, so a worker whose lease was taken
//! over can never overwrite the new owner's row.

mod any;
mod connect_error;
mod contract;
mod describe;
mod embedded;
mod error;
mod fault;
mod form_agreement;
mod group_commit;
mod postgres;
mod rehash;
mod replay_cache;
mod reseal;
mod types;
mod waiters;
mod writes;

pub use any::AnyStore;
pub use contract::{Health, Inspect, KeyStore, Maintenance, Store};
pub use embedded::EmbeddedStore;
pub use error::StoreError;
pub use error::describe;
pub use fault::Fault;
pub use form_agreement::{KeyFormAgreement, SettleKeyForm};
pub use postgres::{MIGRATIONS, PgStore, Pool, migrate};
pub use rehash::{RehashKeys, Rehashed};
pub use replay_cache::ReplayCache;
pub use reseal::{Reseal, StoredRow};
pub use types::{
    CacheStatus, Claim, Completion, Fence, Fenced, KeyRecord, KeyState, Lease, PageMark,
    PoolStatus, Reservation, ReserveRequest, Stuck,
};
pub use waiters::Waiters;
pub use writes::{Reserve, Write, WriteBatch, Written};

pub use crate::key::{KeyId, key_id};
pub use crate::stored::{Seal, StoredResponse};
