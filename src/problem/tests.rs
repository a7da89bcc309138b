//! Every outcome's status and problem document, pinned as the README documents them.

use super::*;
use http::header;

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
    let readme = include_str!("../../README.md");
    let all = ProxyError::examples();
    for err in all {
        let problem = err.problem();
        let row = format!("| `{}` | {}", problem.kind, problem.status);
        assert!(readme.contains(&row), "README's Errors lacks {row}");
    }
}

/// Every kind of answer renders as JSON in every dialect, in that dialect's shape, with
/// the same status (but a reused key under Stripe's, `400`) and the same `Retry-After`.
#[test]
fn every_kind_renders_in_every_dialect() {
    use crate::dialect::{Dialect, Shape, Template};
    let template = Template::parse(
        r#"{"errorCode": "{code}", "error": {"message": "{detail}", "status": {status}, "retryAfter": {retry_after}}}"#,
        Some("application/vnd.acme+json"),
    )
    .unwrap();
    let dialects = [
        Dialect::default(),
        Dialect::stripe(),
        Dialect::template(template),
    ];
    for err in ProxyError::examples() {
        let status = err.status();
        let slug = err
            .problem()
            .kind
            .trim_start_matches(TYPE_PREFIX)
            .to_owned();
        for dialect in &dialects {
            let (code, body) = err.render_in(dialect);
            let v: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{slug} in {}: {e}", dialect.name()));
            match dialect.shape() {
                Shape::Problem => assert_eq!(v["status"], status.as_u16()),
                Shape::Stripe => {
                    assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string());
                    let expected = if slug == "key-reused" {
                        400
                    } else {
                        status.as_u16()
                    };
                    assert_eq!(code, expected, "{slug}");
                }
                Shape::Template(_) => {
                    assert_eq!(v["errorCode"], slug.as_str());
                    assert_eq!(v["error"]["status"], status.as_u16());
                    assert_eq!(
                        v["error"]["retryAfter"].as_u64(),
                        err.retry_after(),
                        "{slug}"
                    );
                }
            }
        }
    }
}

/// `errors.outcomes` may name exactly the outcomes the proxy has.
#[test]
fn the_outcomes_a_dialect_may_name_are_the_problem_types() {
    let mut slugs: Vec<String> = ProxyError::examples()
        .iter()
        .map(|e| e.problem().kind.trim_start_matches(TYPE_PREFIX).to_owned())
        .collect();
    slugs.sort();
    slugs.dedup();
    let mut named: Vec<String> = crate::dialect::OUTCOMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    named.sort();
    assert_eq!(slugs, named);
}
