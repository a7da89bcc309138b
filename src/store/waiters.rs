//! Wake-ups for duplicates that wait (`on_conflict: { wait: … }`) for the first request.
//!
//! A waiter subscribes to its key, then re-checks the row, then sleeps until woken (or a
//! slow fallback tick, so that a lost notification costs latency, never correctness).
//! PostgreSQL wakes waiters through `LISTEN`/`NOTIFY`, which reaches every replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

pub use crate::key::{KeyId, key_id};

/// The keys someone in this process waits on.
#[derive(Default)]
pub struct Waiters {
    /// Weak, so that a key nobody waits on any more costs nothing but its map slot, which
    /// is pruned on the next wake or subscription.
    map: Mutex<HashMap<KeyId, Weak<Notify>>>,
}

impl Waiters {
    /// The notifier for `id`; keep it while waiting.
    pub fn subscribe(&self, id: KeyId) -> Arc<Notify> {
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(existing) = map.get(&id).and_then(Weak::upgrade) {
            return existing;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let notify = Arc::new(Notify::new());
        map.insert(id, Arc::downgrade(&notify));
        notify
    }

    /// Wakes everyone waiting on `id`.
    pub fn wake(&self, id: &KeyId) {
        let notify = {
            let map = self
                .map
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.get(id).and_then(Weak::upgrade)
        };
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter (after a lost notification connection, anything may have changed).
    pub fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = {
            let map = self
                .map
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.values().filter_map(Weak::upgrade).collect()
        };
        for n in all {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client id and key cannot run into one another.
    #[test]
    fn key_ids_are_unambiguous() {
        assert_ne!(key_id("ab", "c"), key_id("a", "bc"));
        assert_eq!(key_id("a", "b"), key_id("a", "b"));
    }

    /// A waiter enabled before the wake is woken; unrelated keys are not.
    #[tokio::test]
    async fn wakes_only_the_key() {
        let w = Waiters::default();
        let a = w.subscribe(key_id("c", "a"));
        let b = w.subscribe(key_id("c", "b"));
        let na = a.notified();
        let nb = b.notified();
        tokio::pin!(na, nb);
        na.as_mut().enable();
        nb.as_mut().enable();
        w.wake(&key_id("c", "a"));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(100), na)
                .await
                .is_ok()
        );
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), nb)
                .await
                .is_err()
        );
    }
}
