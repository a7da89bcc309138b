//! Recently replayed answers kept in memory, so that a retry storm on a completed key is
//! answered without a database round trip.
//!
//! Why it is safe: a completed answer never changes; it only goes away — swept when its
//! retention ends, or evicted by an operator. So an entry is served only
//! - for the same `(client_id, key)` (compared in full, not only by hash) and the same
//!   fingerprint — a different request under the key goes to the store, which answers its
//!   `422`;
//! - before the row's own expiry (measured from before the store was asked, so never later
//!   than the row's) and at most [`MAX_AGE`] after it was read;
//! - while evictions are heard: the embedded store evicts in this process; on PostgreSQL
//!   every replica's eviction is announced on a `NOTIFY` channel, and while this process's
//!   `LISTEN` connection is down nothing is served (and everything is dropped when it comes
//!   back, since announcements may have been missed).
//!
//! An answer read before an eviction was heard is not cached: each invalidation bumps an
//! epoch, and an insert names the epoch it read under.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::types::*;
use crate::fingerprint::Fingerprint;

/// The longest an entry is served: bounds how long a row deleted behind the proxy's back
/// (by hand in `psql`, which announces nothing) can still be replayed.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// A byte-bounded cache of completed answers.
pub struct ReplayCache {
    budget: usize,
    entries: Mutex<Entries>,
    /// Bumped by every invalidation; see the module doc.
    epoch: AtomicU64,
    /// Whether evictions elsewhere are heard now (always, for the embedded store).
    live: AtomicBool,
    /// Reservations answered from memory so far.
    hits: AtomicU64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<KeyId, Entry>,
    /// Insertion order, for dropping the oldest when over budget: (id, serial). A serial
    /// that no longer matches the map's entry was replaced or removed meanwhile.
    order: VecDeque<(KeyId, u64)>,
    bytes: usize,
    serial: u64,
}

struct Entry {
    client_id: Box<str>,
    key: Box<str>,
    fingerprint: Fingerprint,
    answer: Cached,
    until: Instant,
    size: usize,
    serial: u64,
}

#[derive(Clone)]
enum Cached {
    /// As the store keeps it: sealed answers stay sealed in memory too, and are opened by
    /// the proxy on each replay like any other.
    Done(StoredResponse),
    NotReplayable {
        status: u16,
    },
}

/// Bookkeeping per entry besides its strings and body.
const OVERHEAD: usize = 160;

impl ReplayCache {
    /// A cache of at most `budget` bytes; `live` says whether evictions are heard from the
    /// start (see [`ReplayCache::set_live`]).
    pub fn new(budget: usize, live: bool) -> Self {
        Self {
            budget,
            entries: Mutex::default(),
            epoch: AtomicU64::new(0),
            live: AtomicBool::new(live),
            hits: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch to name in a later [`ReplayCache::insert`]; read it before asking the store.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The stored answer for `req` (whose [`key_id`] is `id`), when it may be served from
    /// memory.
    pub fn get(&self, id: &KeyId, req: &ReserveRequest<'_>) -> Option<Reservation> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        let mut entries = self.lock();
        let entry = entries.map.get(id)?;
        if &*entry.client_id != req.client_id || &*entry.key != req.key {
            return None;
        }
        if Instant::now() >= entry.until {
            entries.remove(id);
            return None;
        }
        if entry.fingerprint != *req.fingerprint {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(match entry.answer.clone() {
            Cached::Done(stored) => Reservation::Done(stored),
            Cached::NotReplayable { status } => Reservation::NotReplayable { status },
        })
    }

    /// Keeps `reservation` (a completed key's answer, read under `epoch`) until `until`.
    pub fn insert(
        &self,
        epoch: u64,
        id: KeyId,
        req: &ReserveRequest<'_>,
        reservation: &Reservation,
        until: Instant,
    ) {
        let answer = match reservation {
            Reservation::Done(r) => Cached::Done(r.clone()),
            Reservation::NotReplayable { status } => Cached::NotReplayable { status: *status },
            _ => return,
        };
        let size = OVERHEAD
            + req.client_id.len()
            + req.key.len()
            + match &answer {
                Cached::Done(r) => r.headers.len() + r.body.len(),
                Cached::NotReplayable { .. } => 0,
            };
        // One large answer must not push out everything else.
        if size > self.budget / 8 || !self.live.load(Ordering::Acquire) {
            return;
        }
        let until = until.min(Instant::now() + MAX_AGE);
        let mut entries = self.lock();
        // Checked under the lock an invalidation also takes: none happened since the read.
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        entries.remove(&id);
        entries.serial += 1;
        let serial = entries.serial;
        entries.bytes += size;
        entries.order.push_back((id, serial));
        entries.map.insert(
            id,
            Entry {
                client_id: req.client_id.into(),
                key: req.key.into(),
                fingerprint: *req.fingerprint,
                answer,
                until,
                size,
                serial,
            },
        );
        while entries.bytes > self.budget {
            let Some((oldest, serial)) = entries.order.pop_front() else {
                break;
            };
            if entries.map.get(&oldest).is_some_and(|e| e.serial == serial) {
                entries.remove(&oldest);
            }
        }
        // Keep the order queue from growing with replaced entries.
        if entries.order.len() > 2 * entries.map.len() + 64 {
            let Entries { map, order, .. } = &mut *entries;
            order.retain(|(id, serial)| map.get(id).is_some_and(|e| e.serial == *serial));
        }
    }

    /// Forgets `id` (evicted here or elsewhere).
    pub fn invalidate(&self, id: &KeyId) {
        let mut entries = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        entries.remove(id);
    }

    /// Whether evictions elsewhere are heard; either way everything kept so far is
    /// dropped, since some may have been missed.
    pub fn set_live(&self, live: bool) {
        let mut entries = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.live.store(live, Ordering::Release);
        *entries = Entries::default();
    }

    /// Bytes held now (for the gauge).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// What the gauges show.
    pub fn status(&self) -> CacheStatus {
        CacheStatus {
            bytes: self.bytes(),
            hits: self.hits.load(Ordering::Relaxed),
        }
    }
}

/// The answer `cache` holds for `req`, if any (see `KeyStore::cached`).
pub(super) fn cached_in(
    cache: Option<&ReplayCache>,
    req: &ReserveRequest<'_>,
) -> Option<Reservation> {
    cache?.get(&key_id(req.client_id, req.key), req)
}

/// A reservation through `cache`: a hit is answered from memory; otherwise `reserve` asks
/// the store, and a completed key's answer it returns is kept for its row's remaining time.
///
/// `reserve` makes the store's future only when it is needed: a future passed in would be
/// kept twice in this one (as the argument and as what is awaited), and a thousand
/// requests waiting on the store each carry this future.
pub(super) async fn reserve_through<F, Fut>(
    cache: Option<&ReplayCache>,
    req: &ReserveRequest<'_>,
    reserve: F,
) -> Result<Reservation, StoreError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(Reservation, Option<Duration>), StoreError>>,
{
    let Some(cache) = cache else {
        return reserve().await.map(|(r, _)| r);
    };
    // Hashed once: the lookup and the insert of a miss use the same id.
    let id = key_id(req.client_id, req.key);
    if let Some(hit) = cache.get(&id, req) {
        return Ok(hit);
    }
    // Both taken before the store is asked: the row's remaining time is counted from a
    // moment no later than the store's, and an eviction heard meanwhile wins.
    let (asked, epoch) = (Instant::now(), cache.epoch());
    let (reservation, expires_in) = reserve().await?;
    if let Some(expires_in) = expires_in {
        cache.insert(epoch, id, req, &reservation, asked + expires_in);
    }
    Ok(reservation)
}

impl Entries {
    fn remove(&mut self, id: &KeyId) {
        if let Some(e) = self.map.remove(id) {
            self.bytes -= e.size;
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn req<'a>(client_id: &'a str, key: &'a str, fp: &'a Fingerprint) -> ReserveRequest<'a> {
        ReserveRequest {
            client_id,
            key,
            fingerprint: fp,
            route: "r",
            lease: Duration::from_secs(1),
            retention: Duration::from_secs(60),
            takeover: true,
            derived_key: None,
        }
    }

    fn done(body: &str) -> Reservation {
        Reservation::Done(StoredResponse::clear(
            201,
            Bytes::new(),
            Bytes::copy_from_slice(body.as_bytes()),
        ))
    }

    /// `cache.get` as the store calls it.
    fn get(cache: &ReplayCache, req: &ReserveRequest<'_>) -> Option<Reservation> {
        cache.get(&key_id(req.client_id, req.key), req)
    }

    /// `cache.insert` as the store calls it.
    fn insert(
        cache: &ReplayCache,
        epoch: u64,
        req: &ReserveRequest<'_>,
        r: &Reservation,
        until: Instant,
    ) {
        cache.insert(epoch, key_id(req.client_id, req.key), req, r, until)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn serves_only_the_same_client_key_and_fingerprint() {
        let cache = ReplayCache::new(1 << 20, true);
        let (fp, other) = ([1; 32], [2; 32]);
        insert(
            &cache,
            cache.epoch(),
            &req("a", "k", &fp),
            &done("a's"),
            later(),
        );
        assert_eq!(get(&cache, &req("a", "k", &fp)), Some(done("a's")));
        assert_eq!(get(&cache, &req("b", "k", &fp)), None, "another client");
        assert_eq!(get(&cache, &req("a", "k2", &fp)), None, "another key");
        assert_eq!(
            get(&cache, &req("a", "k", &other)),
            None,
            "a 422 is the store's"
        );
    }

    #[test]
    fn never_past_the_rows_expiry() {
        let cache = ReplayCache::new(1 << 20, true);
        let fp = [1; 32];
        insert(
            &cache,
            cache.epoch(),
            &req("a", "k", &fp),
            &done("x"),
            Instant::now(),
        );
        assert_eq!(get(&cache, &req("a", "k", &fp)), None);
        assert_eq!(cache.bytes(), 0, "an expired entry is dropped when met");
    }

    #[test]
    fn an_invalidation_wins_over_a_read_that_began_before_it() {
        let cache = ReplayCache::new(1 << 20, true);
        let fp = [1; 32];
        let epoch = cache.epoch();
        cache.invalidate(&key_id("a", "k"));
        insert(&cache, epoch, &req("a", "k", &fp), &done("stale"), later());
        assert_eq!(get(&cache, &req("a", "k", &fp)), None);
        insert(
            &cache,
            cache.epoch(),
            &req("a", "k", &fp),
            &done("x"),
            later(),
        );
        cache.invalidate(&key_id("a", "k"));
        assert_eq!(get(&cache, &req("a", "k", &fp)), None);
    }

    #[test]
    fn nothing_is_served_while_evictions_are_not_heard() {
        let cache = ReplayCache::new(1 << 20, false);
        let fp = [1; 32];
        insert(
            &cache,
            cache.epoch(),
            &req("a", "k", &fp),
            &done("x"),
            later(),
        );
        assert_eq!(get(&cache, &req("a", "k", &fp)), None);
        cache.set_live(true);
        insert(
            &cache,
            cache.epoch(),
            &req("a", "k", &fp),
            &done("x"),
            later(),
        );
        assert!(get(&cache, &req("a", "k", &fp)).is_some());
        cache.set_live(false);
        assert_eq!(get(&cache, &req("a", "k", &fp)), None);
        cache.set_live(true);
        assert_eq!(
            get(&cache, &req("a", "k", &fp)),
            None,
            "dropped on reconnect"
        );
    }

    #[test]
    fn stays_within_its_budget_dropping_the_oldest() {
        let cache = ReplayCache::new(16 * 1024, true);
        let fp = [1; 32];
        let body = "x".repeat(1000);
        for n in 0..100 {
            let key = format!("k{n}");
            insert(
                &cache,
                cache.epoch(),
                &req("a", &key, &fp),
                &done(&body),
                later(),
            );
            assert!(cache.bytes() <= 16 * 1024);
        }
        assert!(get(&cache, &req("a", "k99", &fp)).is_some());
        assert_eq!(get(&cache, &req("a", "k0", &fp)), None);
        // An answer larger than an eighth of the budget is not kept.
        let big = "y".repeat(4 * 1024);
        insert(
            &cache,
            cache.epoch(),
            &req("a", "big", &fp),
            &done(&big),
            later(),
        );
        assert_eq!(get(&cache, &req("a", "big", &fp)), None);
    }
}
