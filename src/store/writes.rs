//! What group commit carries: the writes that can share a batch (a reservation, a
//! completion, a release), what each did, and the stores' side of running a batch — apart
//! from the queue that gathers them (`group_commit`), which only moves them.

use std::future::Future;
use std::time::Duration;

use super::types::*;
use crate::fingerprint::Fingerprint;

/// A write that can share a batch with others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Reserve(Reserve),
    Complete(Fence, Completion),
    Release(Fence),
}

impl Write {
    /// The row this write touches: batches are sent in this order, so that two batches
    /// running at once lock their rows in the same order and cannot deadlock.
    pub fn row(&self) -> (&str, &str) {
        match self {
            Write::Reserve(r) => (&r.client_id, &r.key),
            Write::Complete(f, _) | Write::Release(f) => (&f.client_id, &f.key),
        }
    }
}

/// An owned [`ReserveRequest`], to wait in a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    pub client_id: String,
    pub key: String,
    pub fingerprint: Fingerprint,
    pub route: String,
    pub lease: Duration,
    pub retention: Duration,
    pub takeover: bool,
    pub derived_key: Option<String>,
}

impl Reserve {
    /// The borrowed form the single-write paths take.
    pub fn request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            client_id: &self.client_id,
            key: &self.key,
            fingerprint: &self.fingerprint,
            route: &self.route,
            lease: self.lease,
            retention: self.retention,
            takeover: self.takeover,
            derived_key: self.derived_key.as_deref(),
        }
    }
}

impl From<&ReserveRequest<'_>> for Reserve {
    fn from(r: &ReserveRequest<'_>) -> Self {
        Self {
            client_id: r.client_id.to_owned(),
            key: r.key.to_owned(),
            fingerprint: *r.fingerprint,
            route: r.route.to_owned(),
            lease: r.lease,
            retention: r.retention,
            takeover: r.takeover,
            derived_key: r.derived_key.map(str::to_owned),
        }
    }
}

/// What a [`Write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// A reservation's outcome, and for a completed key how much longer its row is kept
    /// (what the replay cache may serve it for).
    Reservation(Reservation, Option<Duration>),
    Fenced(Fenced),
}

impl Written {
    /// The outcome of a reservation; any other answer to one is a store defect.
    pub fn into_reservation(self) -> Result<Reservation, StoreError> {
        self.into_reservation_and_expiry().map(|(r, _)| r)
    }

    /// The outcome of a reservation and, for a completed key, its row's remaining time.
    pub fn into_reservation_and_expiry(
        self,
    ) -> Result<(Reservation, Option<Duration>), StoreError> {
        match self {
            Written::Reservation(r, expires_in) => Ok((r, expires_in)),
            Written::Fenced(_) => Err(StoreError::Corrupt(
                "a fenced-write outcome for a reservation".into(),
            )),
        }
    }

    /// The outcome of a completion or release.
    pub fn into_fenced(self) -> Result<Fenced, StoreError> {
        match self {
            Written::Fenced(f) => Ok(f),
            Written::Reservation(..) => Err(StoreError::Corrupt(
                "a reservation outcome for a fenced write".into(),
            )),
        }
    }
}

/// A store that can run several writes in one transaction.
pub trait WriteBatch: Clone + Send + Sync + 'static {
    /// Runs `writes` (one answer each, in their order).
    fn write_batch(
        &self,
        writes: Vec<Write>,
    ) -> impl Future<Output = Vec<Result<Written, StoreError>>> + Send;

    /// Starts a task that runs batches: on the caller's runtime unless the store keeps
    /// its batches elsewhere. False when there is no runtime to start it on (the process
    /// is ending).
    fn start_batches<F>(&self, task: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        on_this_runtime(task)
    }
}

/// Starts `task` on the caller's runtime; false when there is none.
pub(super) fn on_this_runtime<F>(task: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::runtime::Handle::try_current()
        .map(|runtime| drop(runtime.spawn(task)))
        .is_ok()
}

/// The order a batch is sent in: by row, members of one row in the order they came.
pub(super) fn row_order(writes: &[Write]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..writes.len()).collect();
    order.sort_by(|&a, &b| writes[a].row().cmp(&writes[b].row()));
    order
}
