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

/// For `check-config`: every answer of the proxy's own, rendered by each error template
/// in use (`defaults.errors`, routes' `errors`), as comments — so an operator sees what
/// the API's clients will be sent for each kind before they are.
pub fn rendered_templates(config: &crate::config::Config) -> String {
    use crate::dialect::Dialect;
    let mut out = String::new();
    let defaults = std::iter::once(("defaults", &config.errors));
    let routes = config
        .routes
        .routes()
        .iter()
        .map(|r| (&*r.name, &r.policy.errors));
    let mut shown: Vec<&std::sync::Arc<crate::dialect::Template>> = Vec::new();
    for (name, dialect) in defaults.chain(routes) {
        // Each template once: routes inherit the one in `defaults`.
        let Dialect::Template(template) = dialect else {
            continue;
        };
        if shown.iter().any(|t| std::sync::Arc::ptr_eq(t, template)) {
            continue;
        }
        shown.push(template);
        out.push_str(&format!(
            "# errors on {name}, as its template renders them:\n"
        ));
        for error in ProxyError::examples() {
            let (status, body) = error.render_in(dialect);
            out.push_str(&format!(
                "#   {status} {}\n",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    out
}
