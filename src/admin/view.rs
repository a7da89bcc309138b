//! How the admin API shows a key: its row in JSON, timestamps in RFC 3339 UTC.

use serde::Serialize;

use crate::key::hex;
use crate::store::KeyRecord;

/// A key as the admin API shows it.
#[derive(Serialize)]
pub(super) struct KeyView<'a> {
    client_id: &'a str,
    key: &'a str,
    route: &'a str,
    status: &'static str,
    fingerprint: String,
    lease_token: i64,
    lease_remaining_ms: Option<i64>,
    lease_expired: bool,
    attempts: i32,
    response_status: Option<u16>,
    response_body_bytes: Option<i64>,
    replayable: Option<bool>,
    /// The ring key the stored answer is sealed with (`null`: in clear). The admin API
    /// never shows an answer's headers or body, sealed or not.
    encryption_key: Option<&'a str>,
    created_at: String,
    completed_at: Option<String>,
    expires_at: String,
    /// Inconclusive reconciler probes so far, and when the reconciler may ask again.
    probes: i32,
    next_probe_at: Option<String>,
    /// What the recovery probe last answered (`"503"`, `"no answer"`).
    probe_answer: Option<&'a str>,
    /// Whether a reconciler settles this key by itself: it is unresolved, its route has a
    /// `recovery_probe` and `reconcile` is on. Otherwise only a client retry (takeover)
    /// or an operator (`resolve`, `DELETE`) ends it.
    reconciler: bool,
}

impl<'a> KeyView<'a> {
    /// The row, marked with whether a reconciler will handle it (`probed`: its route has a
    /// recovery probe and the reconciler is on).
    pub fn new(r: &'a KeyRecord, probed: bool) -> Self {
        KeyView {
            reconciler: probed && r.state.is_unresolved(),
            ..KeyView::from(r)
        }
    }
}

impl<'a> From<&'a KeyRecord> for KeyView<'a> {
    fn from(r: &'a KeyRecord) -> Self {
        KeyView {
            client_id: &r.client_id,
            key: &r.key,
            route: &r.route,
            status: r.state.status(),
            fingerprint: hex(&r.fingerprint),
            lease_token: r.lease_token,
            lease_remaining_ms: r.state.lease_remaining_ms(),
            lease_expired: r.state.is_unresolved(),
            attempts: r.attempts,
            response_status: r.response_status,
            response_body_bytes: r.response_body_bytes,
            replayable: r.replayable,
            encryption_key: r.sealed_with.as_deref(),
            created_at: rfc3339(r.created_at_ms),
            completed_at: r.completed_at_ms.map(rfc3339),
            expires_at: rfc3339(r.expires_at_ms),
            probes: r.probes,
            next_probe_at: r.probe_after_ms.map(rfc3339),
            probe_answer: r.probe_answer.as_deref(),
            reconciler: false,
        }
    }
}

/// Unix milliseconds as RFC 3339 UTC (`2026-11-30T06:40:12.495Z`).
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timestamps render as RFC 3339 UTC, across leap years and the epoch.
    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_020_812_495), "2026-11-30T06:40:12.495Z");
    }
}
