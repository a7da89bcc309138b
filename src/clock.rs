//! The machine's wall clock in Unix milliseconds, in one place: the embedded store's leases
//! are measured by it, and what operators read (the console's ages, the journal's times)
//! is said in it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds (0 before 1970, saturated far after).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
