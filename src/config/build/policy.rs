//! `defaults:` and each route's own policy: merged over the defaults, every knob checked.

use std::time::Duration;

use http::{HeaderName, Method};

use super::keys::build_keys;
use super::{Problems, header_name};
use crate::config::file::{FileOnConflict, FilePolicy};
use crate::config::model::*;
use crate::config::policy::*;
use crate::config::units::format_duration;

/// Merges `own` over `base` (or over the built-in defaults when `base` is `None`).
pub(super) fn merge_policy(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
    store_timeout: Duration,
) -> Option<Policy> {
    let before = p.0.len();
    let keys = build_keys(p, at, base, own);
    let default_key = HeaderName::from_static(DEFAULT_KEY_HEADER);
    let upstream_key_header = match &own.upstream_key_header {
        Some(h) => header_name(p, format!("{at}.upstream_key_header"), h),
        None => Some(base.map_or(default_key, |b| b.upstream_key_header.clone())),
    };
    let (lease, retention) = lease_and_retention(p, at, base, own, store_timeout);
    let (max_body, max_stored_response) = sizes(p, at, base, own);
    let require_key = own
        .require_key
        .or(base.map(|b| b.require_key))
        .unwrap_or(false);
    let on_conflict = on_conflict(p, at, base, own);
    let console_body = own
        .console_body
        .or(base.map(|b| b.console_body))
        .unwrap_or(true);
    let after = after_the_upstream(p, at, base, own);
    let errors = super::errors::errors(p, at, base, own.errors.as_ref());
    if p.0.len() != before {
        return None;
    }
    Some(Policy {
        key_headers: keys.key_headers,
        key_from_body: keys.key_from_body,
        key_scope: keys.key_scope,
        replayed_header: keys.replayed_header,
        echo_key: keys.echo_key,
        upstream_key_header: upstream_key_header?,
        upstream_key_body: keys.upstream_key_body,
        derived_key: keys.derived_key,
        lease,
        retention,
        max_body,
        max_stored_response,
        require_key,
        on_conflict,
        fingerprint_fields: keys.fingerprint_fields,
        fingerprint_headers: keys.fingerprint_headers,
        fingerprint_off: keys.fingerprint_off,
        store_headers: after.store_headers,
        release_on: after.release_on,
        recovery_probe: after.recovery_probe,
        on_ambiguous: after.on_ambiguous,
        ambiguous_statuses: after.ambiguous_statuses,
        takeover: after.takeover,
        errors,
        console_body,
    })
}

/// The lease (long enough to be renewed within the store's timeout) and the retention
/// (longer than the lease).
fn lease_and_retention(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
    store_timeout: Duration,
) -> (Duration, Duration) {
    let lease = own
        .lease
        .map(|d| d.0)
        .or(base.map(|b| b.lease))
        .unwrap_or(DEFAULT_LEASE);
    let retention = own
        .retention
        .map(|d| d.0)
        .or(base.map(|b| b.retention))
        .unwrap_or(DEFAULT_RETENTION);
    let min_lease = (store_timeout * 3).max(Duration::from_secs(1));
    if lease < min_lease {
        p.push(
            format!("{at}.lease"),
            format!(
                "{} is too short to be renewed in time: it must be at least {} (3 × the store timeout of {}, and 1s at least)",
                format_duration(lease),
                format_duration(min_lease),
                format_duration(store_timeout)
            ),
        );
    }
    if retention <= lease {
        p.push(
            format!("{at}.retention"),
            format!(
                "{} must be longer than the lease ({})",
                format_duration(retention),
                format_duration(lease)
            ),
        );
    }
    (lease, retention)
}

/// The largest request body and the largest answer kept for replay.
fn sizes(p: &mut Problems, at: &str, base: Option<&Policy>, own: &FilePolicy) -> (u64, u64) {
    let max_body = own
        .max_body
        .map(|s| s.0)
        .or(base.map(|b| b.max_body))
        .unwrap_or(DEFAULT_MAX_BODY);
    let max_stored_response = own
        .max_stored_response
        .map(|s| s.0)
        .or(base.map(|b| b.max_stored_response))
        .unwrap_or(DEFAULT_MAX_STORED_RESPONSE);
    for (name, value) in [
        ("max_body", max_body),
        ("max_stored_response", max_stored_response),
    ] {
        if value == 0 {
            p.push(format!("{at}.{name}"), "must be more than 0");
        } else if value > 1 << 30 {
            p.push(format!("{at}.{name}"), "must be at most 1GiB");
        }
    }
    (max_body, max_stored_response)
}

/// What a duplicate gets while the first request runs.
fn on_conflict(p: &mut Problems, at: &str, base: Option<&Policy>, own: &FilePolicy) -> OnConflict {
    match &own.on_conflict {
        None => base.map_or(OnConflict::Reject, |b| b.on_conflict),
        Some(FileOnConflict::Word(w)) if w == "reject" => OnConflict::Reject,
        Some(FileOnConflict::Word(w)) => {
            p.push(
                format!("{at}.on_conflict"),
                format!("`{w}`: use `reject` or `{{ wait: 5s }}`"),
            );
            OnConflict::Reject
        }
        Some(FileOnConflict::Spec(w)) => OnConflict::Wait(w.wait.0),
    }
}

/// The policy's decisions about the upstream's answer and the unknown outcomes.
struct AfterTheUpstream {
    store_headers: Vec<HeaderName>,
    release_on: Vec<u16>,
    on_ambiguous: Ambiguous,
    takeover: Takeover,
    ambiguous_statuses: Vec<u16>,
    recovery_probe: Option<RecoveryProbe>,
}

/// Which answers are kept, released or unknown, and what a retry does about an unknown
/// one.
fn after_the_upstream(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
) -> AfterTheUpstream {
    let store_headers = match &own.store_headers {
        Some(list) => list
            .iter()
            .enumerate()
            .filter_map(|(i, h)| header_name(p, format!("{at}.store_headers[{i}]"), h))
            .collect(),
        None => base.map(|b| b.store_headers.clone()).unwrap_or_default(),
    };
    let release_on = statuses(p, &format!("{at}.release_on"), own.release_on.as_ref())
        .unwrap_or_else(|| base.map(|b| b.release_on.clone()).unwrap_or_default());
    let on_ambiguous = match own.on_ambiguous.as_deref() {
        None => base.map_or(Ambiguous::Keep, |b| b.on_ambiguous),
        Some("keep") => Ambiguous::Keep,
        Some("store") => Ambiguous::Store,
        Some("release") => Ambiguous::Release,
        Some(other) => {
            p.push(
                format!("{at}.on_ambiguous"),
                format!("`{other}`: use `keep`, `store` or `release`"),
            );
            Ambiguous::Keep
        }
    };
    let takeover = match own.takeover.as_deref() {
        None => base.map_or(Takeover::Execute, |b| b.takeover),
        Some("execute") => Takeover::Execute,
        Some("never") => Takeover::Never,
        Some(other) => {
            p.push(
                format!("{at}.takeover"),
                format!("`{other}`: use `execute` (a retry after the lease re-executes with the same derived key) or `never` (it gets outcome-unknown)"),
            );
            Takeover::Execute
        }
    };
    let ambiguous_statuses = statuses(
        p,
        &format!("{at}.ambiguous_statuses"),
        own.ambiguous_statuses.as_ref(),
    )
    .unwrap_or_else(|| {
        base.map(|b| b.ambiguous_statuses.clone())
            .unwrap_or_default()
    });
    let recovery_probe = match &own.recovery_probe {
        Some(probe) => build_probe(p, &format!("{at}.recovery_probe"), probe),
        None => base.and_then(|b| b.recovery_probe.clone()),
    };
    AfterTheUpstream {
        store_headers,
        release_on,
        on_ambiguous,
        takeover,
        ambiguous_statuses,
        recovery_probe,
    }
}

/// A list of HTTP statuses as configured (`None`: not configured), each one checked.
fn statuses(p: &mut Problems, at: &str, list: Option<&Vec<u16>>) -> Option<Vec<u16>> {
    let list = list?;
    for (i, code) in list.iter().enumerate() {
        if !(100..=599).contains(code) {
            p.push(
                format!("{at}[{i}]"),
                format!("{code} is not an HTTP status"),
            );
        }
    }
    Some(list.clone())
}

fn build_probe(
    p: &mut Problems,
    at: &str,
    probe: &crate::config::file::FileProbe,
) -> Option<RecoveryProbe> {
    let written = probe
        .method
        .as_deref()
        .unwrap_or("GET")
        .to_ascii_uppercase();
    let Ok(method) = Method::from_bytes(written.as_bytes()) else {
        p.push(format!("{at}.method"), "not an HTTP method");
        return None;
    };
    let Some(path) = probe.path.clone() else {
        p.push(
            format!("{at}.path"),
            "required, e.g. /payments/by-key/{key}",
        );
        return None;
    };
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        p.push(
            format!("{at}.path"),
            format!("`{path}` must be a path starting with `/`"),
        );
        return None;
    }
    let found = probe.found.clone().unwrap_or_else(|| vec![200]);
    let not_found = probe.not_found.clone().unwrap_or_else(|| vec![404]);
    if let Some(both) = found.iter().find(|s| not_found.contains(s)) {
        p.push(
            at,
            format!("status {both} is in both `found` and `not_found`"),
        );
        return None;
    }
    Some(RecoveryProbe {
        method,
        path,
        found,
        not_found,
    })
}
