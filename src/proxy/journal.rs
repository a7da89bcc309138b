//! What this replica answered for each recent key — replays, conflicts, refusals — which
//! the key's row does not keep (a replay writes nothing), so that the console can tell a
//! key's story past its reservation and completion. Bounded: the most recent
//! [`CAPACITY`] keys, oldest forgotten first; in memory, per replica.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::clock::now_ms;

/// Keys remembered, over all shards.
pub const CAPACITY: usize = 16 * SHARD_CAPACITY;

const SHARDS: usize = 16;
const SHARD_CAPACITY: usize = 1024;

/// One kind of answer a key got here: how often, first and last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The request outcome (`replayed`, `conflict`, `executed`, …).
    pub outcome: &'static str,
    /// The status last answered with it.
    pub status: u16,
    pub count: u64,
    /// Unix milliseconds.
    pub first_ms: i64,
    pub last_ms: i64,
}

#[derive(Default)]
struct Shard {
    entries: HashMap<String, Vec<Seen>>,
    /// Keys in the order they were first recorded, for forgetting the oldest.
    order: VecDeque<String>,
}

/// The journal; keys are the log lines' short hashes of (client, key).
pub struct Journal {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Journal {
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        &self.shards[(h as usize) % SHARDS]
    }

    /// Notes that `key` was answered with `outcome` and `status` now.
    pub fn record(&self, key: &str, outcome: &'static str, status: u16) {
        let now = now_ms();
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = shard.entries.get_mut(key) {
            match seen.iter_mut().find(|s| s.outcome == outcome) {
                Some(s) => {
                    s.count += 1;
                    s.status = status;
                    s.last_ms = now;
                }
                None => seen.push(Seen {
                    outcome,
                    status,
                    count: 1,
                    first_ms: now,
                    last_ms: now,
                }),
            }
            return;
        }
        if shard.order.len() >= SHARD_CAPACITY
            && let Some(oldest) = shard.order.pop_front()
        {
            shard.entries.remove(&oldest);
        }
        shard.order.push_back(key.to_owned());
        shard.entries.insert(
            key.to_owned(),
            vec![Seen {
                outcome,
                status,
                count: 1,
                first_ms: now,
                last_ms: now,
            }],
        );
    }

    /// What `key` got here, if it is among the keys remembered.
    pub fn seen(&self, key: &str) -> Vec<Seen> {
        let shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        shard.entries.get(key).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers are counted per kind; the oldest keys are forgotten past the capacity.
    #[test]
    fn counts_and_forgets() {
        let j = Journal::default();
        j.record("a", "executed", 201);
        j.record("a", "replayed", 201);
        j.record("a", "replayed", 201);
        let seen = j.seen("a");
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[1].outcome, seen[1].count), ("replayed", 2));
        for i in 0..CAPACITY * 2 {
            j.record(&format!("k{i}"), "executed", 201);
        }
        assert!(j.seen("a").is_empty(), "forgotten");
        assert_eq!(j.seen(&format!("k{}", CAPACITY * 2 - 1)).len(), 1);
        let held: usize = j
            .shards
            .iter()
            .map(|s| s.lock().unwrap().entries.len())
            .sum();
        assert!(held <= CAPACITY);
    }
}
