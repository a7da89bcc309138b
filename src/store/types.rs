//! Store-facing types and the [`KeyStore`] trait both backends implement.

use std::time::Duration;

pub use super::error::StoreError;
pub use super::waiters::{KeyId, key_id};
pub use crate::stored::{Seal, StoredResponse};

use crate::fingerprint::Fingerprint;

/// What the proxy asks the store to reserve.
#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    pub client_id: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a Fingerprint,
    pub route: &'a str,
    pub lease: Duration,
    pub retention: Duration,
    /// Whether an expired lease may be taken over (re-executed); when not, such a key is
    /// reported [`Reservation::Unresolved`] and left as it is (`takeover: never`).
    pub takeover: bool,
    /// The derived key to keep with a new reservation when it is not the plain
    /// `client_id:key` (`derived_key:` hashes or shortens it); `None`: plain.
    pub derived_key: Option<&'a str>,
}

/// A lease we hold on a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The fencing token: unique per reservation, never reused.
    pub token: i64,
    /// How many times the key has been reserved (1, plus one per takeover).
    pub attempts: i32,
    /// Whether this reservation took over an expired lease (a re-execution).
    pub takeover: bool,
    /// The derived key kept with the row (the first reservation's), `None` for plain:
    /// a takeover sends what the first attempt sent, whatever the configuration says now.
    pub derived_key: Option<String>,
}

/// What the row says when we could not reserve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// The key is ours: forward the request.
    Reserved(Lease),
    /// Another request with the same fingerprint holds a live lease.
    InProgress { lease_remaining: Duration },
    /// The key was used for a different request.
    Mismatch,
    /// Done: replay this.
    Done(StoredResponse),
    /// Done, but the answer was too large to store.
    NotReplayable { status: u16 },
    /// Done, but the stored answer cannot be opened: its key is not in the ring, or it
    /// fails authentication (tampered, or moved from another row). Never replayed, and the
    /// operation is not executed again. Said by the proxy's key ring, not by a store.
    Unreadable(crate::vault::Unreadable),
    /// In progress with its lease run out — nobody knows whether the operation happened —
    /// and the caller may not take it over.
    Unresolved { attempts: i32 },
}

impl Reservation {
    /// What the store said, as a label (for traces).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reservation::Reserved(lease) if lease.takeover => "taken_over",
            Reservation::Reserved(_) => "reserved",
            Reservation::InProgress { .. } => "in_progress",
            Reservation::Mismatch => "mismatch",
            Reservation::Done(_) => "done",
            Reservation::NotReplayable { .. } => "not_replayable",
            Reservation::Unreadable(_) => "unreadable",
            Reservation::Unresolved { .. } => "unresolved",
        }
    }
}

/// How a reserved key ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    Stored(StoredResponse),
    /// The upstream answered, but the answer is too large to keep; only its status is kept.
    NotReplayable {
        status: u16,
    },
}

/// Identifies one reservation: the row and the token it was handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub client_id: String,
    pub key: String,
    pub token: i64,
    /// Whether duplicates may be waiting for this key (`on_conflict: wait`), so that
    /// completing or releasing it must wake them. Off otherwise: notifications serialise
    /// commits in PostgreSQL, and nobody would listen.
    pub notify: bool,
    /// How long the answer is replayed once completed: the route's retention, counted
    /// from the completion (a slow request must not lose part of its replay window).
    pub retention: Duration,
}

impl Fence {
    /// The key's identity in notifications.
    pub fn key_id(&self) -> KeyId {
        key_id(&self.client_id, &self.key)
    }
}

/// Whether a fenced write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The row still carried our token and was written.
    Applied,
    /// Our lease was taken over (or the row evicted): nothing was written.
    Refused,
}

impl Fenced {
    /// What a fenced statement that touched `rows` rows did: it matches at most the one row
    /// that still carries the token.
    pub fn from_rows(rows: u64) -> Self {
        if rows == 1 {
            Fenced::Applied
        } else {
            Fenced::Refused
        }
    }
}

/// Milliseconds of `d` for a statement's parameter, saturating rather than wrapping.
pub(super) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Connections open, idle, and callers waiting for one; and group commit's batches and
/// the writes they carried since start (their ratio is the mean batch size, which says
/// whether writes share commits under the load at hand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    pub size: usize,
    pub available: usize,
    pub waiting: usize,
    pub batches: u64,
    pub batched_writes: u64,
    /// Batches the store refused whose writes then ran one at a time.
    pub batch_fallbacks: u64,
}

/// The replay cache's occupancy and use, for gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStatus {
    pub bytes: usize,
    /// Reservations answered from memory since start.
    pub hits: u64,
}

/// Where a key stands, for operators (admin API) and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub client_id: String,
    pub key: String,
    pub route: String,
    /// In progress (with its lease), unresolved, or done.
    pub state: KeyState,
    pub fingerprint: Vec<u8>,
    pub lease_token: i64,
    pub attempts: i32,
    pub response_status: Option<u16>,
    pub response_body_bytes: Option<i64>,
    pub replayable: Option<bool>,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    pub completed_at_ms: Option<i64>,
    pub expires_at_ms: i64,
    /// Times the reconciler asked the recovery probe without a conclusive answer.
    pub probes: i32,
    /// Unix milliseconds before which the reconciler leaves the key alone (its backoff).
    pub probe_after_ms: Option<i64>,
    /// The derived key kept with the row; `None`: plain `client_id:key`.
    pub derived_key: Option<String>,
    /// The key of the ring the stored answer is sealed with; `None`: in clear (or none).
    pub sealed_with: Option<String>,
    /// What the recovery probe last answered for this key while unresolved (`"503"`, `"no
    /// answer"`); `None` before any inconclusive probe.
    pub probe_answer: Option<String>,
}

/// Where a page of unresolved keys ends, so that the next page starts after it: the keys
/// are listed by lease end, then client id and key (keyset pagination — a page deep in a
/// long list costs what the first one does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageMark {
    /// The lease end, Unix microseconds.
    pub lease_end_us: i64,
    pub client_id: String,
    pub key: String,
}

impl PageMark {
    /// The mark as one opaque URL-safe token (`/admin/stuck?after=`, the console's pages).
    pub fn encode(&self) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.{}",
            self.lease_end_us,
            b64.encode(&self.client_id),
            b64.encode(&self.key)
        )
    }

    /// Reads a token [`PageMark::encode`] wrote; `None` for anything else.
    pub fn decode(token: &str) -> Option<Self> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut parts = token.splitn(3, '.');
        let lease_end_us = parts.next()?.parse().ok()?;
        let text = |part: Option<&str>| {
            b64.decode(part?)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
        };
        Some(PageMark {
            lease_end_us,
            client_id: text(parts.next())?,
            key: text(parts.next())?,
        })
    }
}

/// An unresolved key as listed, with its place in the list.
#[derive(Debug, Clone)]
pub struct Stuck {
    pub record: KeyRecord,
    pub mark: PageMark,
}

/// Where a key stands. The table keeps two states (`in_progress`, `done`); an in-progress
/// key whose lease ran out is told apart because nobody knows whether its operation
/// happened: only a takeover, the reconciler or an operator ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// A worker holds the lease for this much longer.
    InProgress { lease_remaining_ms: i64 },
    /// The lease ran out this long ago (0 for a row in progress with no lease time, which
    /// no write makes).
    Unresolved { lease_expired_ms: i64 },
    /// The answer is stored.
    Done,
}

impl KeyState {
    /// From a row's stored status and its lease's remaining time (negative once run out).
    pub fn from_row(done: bool, lease_remaining_ms: Option<i64>) -> Self {
        match (done, lease_remaining_ms) {
            (true, _) => KeyState::Done,
            (false, Some(ms)) if ms >= 0 => KeyState::InProgress {
                lease_remaining_ms: ms,
            },
            (false, ms) => KeyState::Unresolved {
                lease_expired_ms: ms.map_or(0, |ms| -ms),
            },
        }
    }

    /// The status as the table keeps it: `in_progress` or `done`.
    pub fn status(&self) -> &'static str {
        match self {
            KeyState::Done => "done",
            KeyState::InProgress { .. } | KeyState::Unresolved { .. } => "in_progress",
        }
    }

    /// Milliseconds until the lease runs out, negative once it has; `None` when done.
    pub fn lease_remaining_ms(&self) -> Option<i64> {
        match *self {
            KeyState::InProgress { lease_remaining_ms } => Some(lease_remaining_ms),
            KeyState::Unresolved { lease_expired_ms } => Some(-lease_expired_ms),
            KeyState::Done => None,
        }
    }

    /// In progress with its lease run out: nobody knows whether the operation happened.
    pub fn is_unresolved(&self) -> bool {
        matches!(self, KeyState::Unresolved { .. })
    }
}

/// An unresolved key the reconciler took over to ask the recovery probe about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The row as it now is: in progress under a fresh lease token and a live lease.
    pub record: KeyRecord,
    /// When its lease had run out (Unix milliseconds): given back on an inconclusive
    /// probe, so that the time unresolved keeps counting (`sweep.unresolved_retention`).
    pub unresolved_since_ms: i64,
}
