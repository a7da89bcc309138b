//! Every outcome's status and problem document, pinned as the README documents them.

use super::*;

/// Pin the status of every client-side outcome the README documents.
#[test]
fn statuses() {
    let h = || "Idempotency-Key".to_owned();
    assert_eq!(
        ProxyError::MissingKey {
            header: h(),
            body: None
        }
        .status(),
        400
    );
    assert_eq!(
        ProxyError::InvalidKey {
            header: h(),
            reason: "x".into()
        }
        .status(),
        400
    );
    assert_eq!(
        ProxyError::MissingClientId {
            what: "x".into(),
            unauthorized: true
        }
        .status(),
        401
    );
    assert_eq!(ProxyError::BodyTooLarge { limit: 1 }.status(), 413);
    assert_eq!(ProxyError::KeyReused.status(), 422);
    assert_eq!(
        ProxyError::InProgress {
            retry_after: Duration::from_millis(10)
        }
        .status(),
        409
    );
    assert_eq!(ProxyError::UpstreamTimeout.status(), 504);
    assert_eq!(ProxyError::NotReplayable { status: 201 }.status(), 410);
}

/// The problem body is valid RFC 9457 JSON and 409 carries a whole-second Retry-After.
#[test]
fn problem_json() {
    let resp = ProxyError::InProgress {
        retry_after: Duration::from_millis(1500),
    }
    .into_response();
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    let p = ProxyError::KeyReused.problem();
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["status"], 422);
    assert!(v["type"].as_str().unwrap().ends_with("key-reused"));
    assert!(!v["detail"].as_str().unwrap().is_empty());
}

/// Every problem type the proxy answers with is in the README's table of errors, so a
/// new one cannot ship undocumented.
#[test]
fn every_problem_type_is_documented() {
    let readme = include_str!("../README.md");
    let io = || Box::<dyn std::error::Error + Send + Sync>::from("x");
    let all = [
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
        ProxyError::Internal,
    ];
    for err in all {
        let problem = err.problem();
        let row = format!("| `{}` | {}", problem.kind, problem.status);
        assert!(readme.contains(&row), "README's Errors lacks {row}");
    }
}
