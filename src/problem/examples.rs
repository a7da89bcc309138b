//! One answer of each kind the proxy gives itself: for `check-config`, which renders each
//! in a route's error dialect, and for the test that keeps the README's table complete.

use std::time::Duration;

use super::ProxyError;
use crate::fingerprint::BodyError;

impl ProxyError {
    /// One error of each kind, with placeholder details.
    pub fn examples() -> Vec<ProxyError> {
        let io = || Box::<dyn std::error::Error + Send + Sync>::from("x");
        vec![
            ProxyError::MissingKey {
                header: "k".into(),
                body: None,
            },
            ProxyError::InvalidKey {
                header: "k".into(),
                reason: "x".into(),
            },
            ProxyError::KeyPlacement {
                field: "/k".into(),
                reason: "x".into(),
            },
            ProxyError::InvalidBodyKey {
                field: "/k".into(),
                reason: "x".into(),
            },
            ProxyError::MissingClientId {
                what: "x".into(),
                unauthorized: false,
            },
            ProxyError::InvalidPath(crate::path::PathError::NotAbsolute),
            ProxyError::InvalidClientId { reason: "x".into() },
            ProxyError::BodyTooLarge { limit: 1 },
            ProxyError::BodyTimeout,
            ProxyError::BodyRead(io()),
            ProxyError::Body(BodyError::NotJson),
            ProxyError::KeyReused,
            ProxyError::InProgress {
                retry_after: Duration::from_secs(1),
            },
            ProxyError::NotReplayable { status: 201 },
            ProxyError::OutcomeUnknown,
            ProxyError::StoreUnavailable(crate::store::StoreError::Timeout(Duration::from_secs(1))),
            ProxyError::StoreUnavailable(crate::store::StoreError::Corrupt("x".into())),
            ProxyError::UpstreamUnreachable(io()),
            ProxyError::UpstreamFailed(io()),
            ProxyError::UpstreamTimeout,
            ProxyError::StoredAnswerUnreadable(crate::vault::Unreadable::MissingKey("k".into())),
            ProxyError::ProbeInconclusive { status: None },
            ProxyError::HeadTooLarge {
                limit: 1,
                fields: 1,
            },
            ProxyError::MalformedHead("x".into()),
            ProxyError::UnsupportedCoding("gzip".into()),
            ProxyError::UriTooLong(1),
            ProxyError::MalformedH2("x".into()),
            ProxyError::VersionNotSupported("HTTP/2.0".into()),
            ProxyError::NotImplemented("CONNECT".into()),
            ProxyError::Overloaded { bound: "client" },
            ProxyError::Internal,
        ]
    }
}

/// For `check-config`: every answer of the proxy's own, as each error dialect in use
/// (`defaults.errors`, routes' `errors`) gives it — status, the dialect's own headers,
/// body — as comments, so an operator sees what the API's clients will be sent for each
/// kind before they are. Problem documents as they are (the default) are not repeated.
pub fn rendered_templates(config: &crate::config::Config) -> String {
    let mut out = String::new();
    let defaults = std::iter::once(("defaults", &config.errors));
    let routes = config
        .routes
        .routes()
        .iter()
        .map(|r| (&*r.name, &r.policy.errors));
    // Each dialect once: routes inherit the one in `defaults`.
    let mut shown: Vec<(&str, &crate::dialect::Dialect)> = Vec::new();
    for (name, dialect) in defaults.chain(routes) {
        if dialect.is_plain() {
            continue;
        }
        if let Some((first, _)) = shown.iter().find(|(_, d)| d.same_as(dialect)) {
            out.push_str(&format!("# errors on {name}: as on {first}\n"));
            continue;
        }
        shown.push((name, dialect));
        out.push_str(&format!(
            "# errors on {name}, in the `{}` dialect:\n",
            dialect.name()
        ));
        for error in ProxyError::examples() {
            let rendered = error.rendered(dialect);
            let mut own: Vec<String> = rendered
                .headers
                .iter()
                .map(|(h, v)| format!("{h}: {}", String::from_utf8_lossy(v.as_bytes())))
                .collect();
            if let Some(retry) = rendered.should_retry {
                own.push(format!("stripe-should-retry: {retry}"));
            }
            let headers = if own.is_empty() {
                String::new()
            } else {
                format!(" [{}]", own.join(", "))
            };
            out.push_str(&format!(
                "#   {}{headers} {}\n",
                rendered.status.as_u16(),
                String::from_utf8_lossy(&rendered.body)
            ));
        }
    }
    out
}
