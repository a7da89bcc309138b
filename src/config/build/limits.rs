//! `limits:` — defaults (the detached-work bounds sized from the upstream's own limit)
//! and what cannot work.

use super::Problems;
use crate::config::file::FileLimits;
use crate::config::model::*;

/// The limits `file` sets, for an upstream that takes `upstream_connections` at once;
/// `one_client`: every request has the same client id (`client_id: static`), so the
/// per-client bound defaults to the whole.
pub(super) fn build_limits(
    p: &mut Problems,
    file: Option<&FileLimits>,
    upstream_connections: usize,
    one_client: bool,
) -> Limits {
    let duration = |get: fn(&FileLimits) -> Option<crate::config::units::HumanDuration>,
                    default| file.and_then(get).map_or(default, |d| d.0);
    let http2_max_streams = file
        .and_then(|l| l.http2_max_streams)
        .unwrap_or(DEFAULT_HTTP2_MAX_STREAMS);
    let given = file.and_then(|l| l.detached.as_ref());
    let max = given
        .and_then(|d| d.max)
        .unwrap_or_else(|| Detached::default_max(upstream_connections));
    let detached = Detached {
        max,
        per_client: given.and_then(|d| d.per_client).unwrap_or(if one_client {
            max
        } else {
            (max / 2).max(1)
        }),
        per_connection: given
            .and_then(|d| d.per_connection)
            .unwrap_or(http2_max_streams),
    };
    let limits = Limits {
        max_connections: file
            .and_then(|l| l.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        header_read_timeout: duration(|l| l.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT),
        body_read_timeout: duration(|l| l.body_read_timeout, DEFAULT_BODY_READ_TIMEOUT),
        max_header_bytes: file
            .and_then(|l| l.max_header_bytes)
            .map_or(DEFAULT_MAX_HEADER_BYTES, |s| {
                usize::try_from(s.0).unwrap_or(usize::MAX)
            }),
        detached,
        http2_idle_timeout: duration(|l| l.http2_idle_timeout, DEFAULT_HTTP2_IDLE_TIMEOUT),
        http2_ping_interval: duration(|l| l.http2_ping_interval, DEFAULT_HTTP2_PING_INTERVAL),
        http2_ping_timeout: duration(|l| l.http2_ping_timeout, DEFAULT_HTTP2_PING_TIMEOUT),
        http2_max_streams,
        send_timeout: duration(|l| l.send_timeout, DEFAULT_SEND_TIMEOUT),
    };
    check(p, &limits);
    limits
}

/// Every limit that could not work, named.
fn check(p: &mut Problems, limits: &Limits) {
    if limits.max_connections == 0 {
        p.push("limits.max_connections", "must be at least 1");
    }
    for (key, value) in [
        ("limits.header_read_timeout", limits.header_read_timeout),
        ("limits.body_read_timeout", limits.body_read_timeout),
        ("limits.http2_idle_timeout", limits.http2_idle_timeout),
        ("limits.http2_ping_interval", limits.http2_ping_interval),
        ("limits.http2_ping_timeout", limits.http2_ping_timeout),
        ("limits.send_timeout", limits.send_timeout),
    ] {
        if value.is_zero() {
            p.push(key, "must be more than 0s");
        }
    }
    if !(8192..=1 << 24).contains(&limits.max_header_bytes) {
        p.push("limits.max_header_bytes", "must be between 8KiB and 16MiB");
    }
    if limits.http2_max_streams == 0 {
        p.push("limits.http2_max_streams", "must be at least 1");
    }
    let d = limits.detached;
    for (key, value) in [
        ("limits.detached.max", d.max),
        ("limits.detached.per_client", d.per_client),
        ("limits.detached.per_connection", d.per_connection),
    ] {
        if value == 0 {
            p.push(
                key,
                "must be at least 1 (a protected request is detached work)",
            );
        }
    }
    if d.per_client > d.max {
        p.push(
            "limits.detached.per_client",
            format!(
                "{} is more than limits.detached.max ({}): one client could take every slot",
                d.per_client, d.max
            ),
        );
    }
}
