//! The shape of the proxy's own error answers (`409` in progress, `422` key reused, the
//! `503`s, …): RFC 9457 problem documents by default, Stripe's error object, or an API's
//! own shape from a JSON template.
//!
//! Why: the proxy sits in front of APIs whose clients already parse an error shape of
//! their own, and misread any other — stripe-node takes a JSON body without an `error`
//! member for a success, whatever the status. What an answer *says* (its status,
//! `Retry-After`, the key echo) is the same in every dialect; only the body's shape, its
//! content type and the hints a dialect's clients honour (`Stripe-Should-Retry`) differ.

use std::sync::Arc;

use http::{HeaderValue, StatusCode};
use serde_json::json;

/// How a route answers with its own errors.
#[derive(Debug, Clone, Default)]
pub enum Dialect {
    /// `application/problem+json` (RFC 9457).
    #[default]
    Problem,
    /// Stripe's error object, with `Stripe-Should-Retry`.
    Stripe,
    /// An API's own shape.
    Template(Arc<Template>),
}

/// What a proxy answer says, whatever its shape.
#[derive(Debug, Clone, Copy)]
pub struct Said<'a> {
    pub status: StatusCode,
    /// The problem type (`urn:idemproxy:problem:key-reused`).
    pub kind: &'a str,
    /// Its short code (`key-reused`).
    pub code: &'a str,
    pub title: &'a str,
    pub detail: &'a str,
    /// Seconds after which a retry with the same key can help, where one can.
    pub retry_after: Option<u64>,
    /// Whether sending the same request with the same key again can have another outcome.
    pub retry_helps: bool,
}

/// An RFC 9457 problem document, its members in the RFC's order.
#[derive(serde::Serialize)]
struct ProblemDocument<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// An answer's body in a dialect.
#[derive(Debug)]
pub struct Rendered {
    /// The status: the problem's, except where a dialect's clients need another to read
    /// it right (Stripe's SDKs raise their idempotency error only for a `400`).
    pub status: StatusCode,
    pub content_type: HeaderValue,
    pub body: Vec<u8>,
    /// `Stripe-Should-Retry`, in the Stripe dialect.
    pub should_retry: Option<bool>,
}

impl Dialect {
    /// The answer `said` in this dialect.
    pub fn render(&self, said: &Said<'_>) -> Rendered {
        match self {
            Dialect::Problem => Rendered {
                status: said.status,
                content_type: HeaderValue::from_static("application/problem+json"),
                body: serde_json::to_vec(&ProblemDocument {
                    kind: said.kind,
                    title: said.title,
                    status: said.status.as_u16(),
                    detail: said.detail,
                })
                .unwrap_or_default(),
                should_retry: None,
            },
            Dialect::Stripe => stripe(said),
            Dialect::Template(t) => Rendered {
                status: said.status,
                content_type: t.content_type.clone(),
                body: t.render(said).into_bytes(),
                should_retry: None,
            },
        }
    }

    /// The name a configuration gives this dialect.
    pub fn name(&self) -> &'static str {
        match self {
            Dialect::Problem => "problem",
            Dialect::Stripe => "stripe",
            Dialect::Template(_) => "template",
        }
    }
}

/// Stripe's error object (`{"error": {"type", "code", "message"}}`), typed the way
/// stripe-node and stripe-python pick their exception classes: a reused key is an
/// `idempotency_error` with status `400` (the SDKs' `IdempotencyError`), a key in use is
/// Stripe's `409 idempotency_key_in_use` (retried by the SDKs), the store or the upstream
/// failing is an `api_error`; `Stripe-Should-Retry` says whether the same key can help.
fn stripe(said: &Said<'_>) -> Rendered {
    let (status, kind, code) = match said.code {
        "key-reused" => (StatusCode::BAD_REQUEST, "idempotency_error", None),
        "in-progress" => (
            said.status,
            "invalid_request_error",
            Some("idempotency_key_in_use"),
        ),
        "missing-key" => (
            said.status,
            "invalid_request_error",
            Some("parameter_missing"),
        ),
        _ if said.status == StatusCode::UNAUTHORIZED => (said.status, "authentication_error", None),
        _ if said.status.is_server_error()
            || said.status == StatusCode::GONE
            || said.status == StatusCode::FAILED_DEPENDENCY =>
        {
            (said.status, "api_error", None)
        }
        _ => (said.status, "invalid_request_error", None),
    };
    let mut error = json!({
        "type": kind,
        "code": code.map_or_else(|| said.code.replace('-', "_"), str::to_owned),
        "message": said.detail,
        "idemproxy_problem": said.kind,
    });
    if said.code == "missing-key" {
        error["param"] = json!("Idempotency-Key");
    }
    Rendered {
        status,
        content_type: HeaderValue::from_static("application/json"),
        body: serde_json::to_vec(&json!({ "error": error })).unwrap_or_default(),
        should_retry: Some(said.retry_helps),
    }
}

/// A JSON body with placeholders: `{status}` and `{retry_after}` become numbers (`null`
/// when there is no retry delay), `{type}`, `{title}`, `{detail}` and `{code}` become
/// the text of a JSON string, escaped, for use between quotes.
#[derive(Debug)]
pub struct Template {
    parts: Vec<Part>,
    content_type: HeaderValue,
}

#[derive(Debug)]
enum Part {
    Text(String),
    Field(Field),
}

#[derive(Debug, Clone, Copy)]
enum Field {
    Status,
    Type,
    Title,
    Detail,
    Code,
    RetryAfter,
}

const FIELDS: [(&str, Field); 6] = [
    ("status", Field::Status),
    ("type", Field::Type),
    ("title", Field::Title),
    ("detail", Field::Detail),
    ("code", Field::Code),
    ("retry_after", Field::RetryAfter),
];

impl Template {
    /// Reads a template and checks that it renders valid JSON for any answer: with and
    /// without a retry delay, with text that needs escaping. (Strings are always escaped
    /// and numbers always numbers, so these cover every problem kind.)
    pub fn parse(text: &str, content_type: Option<&str>) -> Result<Self, String> {
        let content_type = content_type.unwrap_or("application/json");
        let content_type = HeaderValue::from_str(content_type)
            .map_err(|_| format!("content_type `{content_type}` is not a header value"))?;
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let name_len = after
                .bytes()
                .take_while(|b| b.is_ascii_lowercase() || *b == b'_')
                .count();
            if name_len == 0 || after.as_bytes().get(name_len) != Some(&b'}') {
                push_text(&mut parts, &rest[..=open]);
                rest = after;
                continue;
            }
            let name = &after[..name_len];
            let field = FIELDS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| *f)
                .ok_or_else(|| {
                    format!(
                        "unknown placeholder `{{{name}}}` (use status, type, title, detail, code, retry_after)"
                    )
                })?;
            push_text(&mut parts, &rest[..open]);
            parts.push(Part::Field(field));
            rest = &after[name_len + 1..];
        }
        push_text(&mut parts, rest);
        let template = Template {
            parts,
            content_type,
        };
        for (retry_after, detail) in [
            (Some(1), "a \"quoted\" detail\\ with\nlines and ünïcode"),
            (None, ""),
        ] {
            let said = Said {
                status: StatusCode::CONFLICT,
                kind: "urn:idemproxy:problem:in-progress",
                code: "in-progress",
                title: "Request in progress",
                detail,
                retry_after,
                retry_helps: true,
            };
            let body = template.render(&said);
            serde_json::from_str::<serde_json::Value>(&body).map_err(|e| {
                format!(
                    "does not render valid JSON ({e}), e.g. for a 409 {}: {body}",
                    if retry_after.is_some() {
                        "with a retry delay"
                    } else {
                        "without a retry delay"
                    }
                )
            })?;
        }
        Ok(template)
    }

    /// The body for `said`.
    pub fn render(&self, said: &Said<'_>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(Field::Status) => out.push_str(&said.status.as_u16().to_string()),
                Part::Field(Field::RetryAfter) => match said.retry_after {
                    Some(s) => out.push_str(&s.to_string()),
                    None => out.push_str("null"),
                },
                Part::Field(Field::Type) => escaped(&mut out, said.kind),
                Part::Field(Field::Title) => escaped(&mut out, said.title),
                Part::Field(Field::Detail) => escaped(&mut out, said.detail),
                Part::Field(Field::Code) => escaped(&mut out, said.code),
            }
        }
        out
    }
}

fn push_text(parts: &mut Vec<Part>, text: &str) {
    if text.is_empty() {
        return;
    }
    match parts.last_mut() {
        Some(Part::Text(t)) => t.push_str(text),
        _ => parts.push(Part::Text(text.to_owned())),
    }
}

/// `text` as the inside of a JSON string.
fn escaped(out: &mut String, text: &str) {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    out.push_str(
        quoted
            .get(1..quoted.len().saturating_sub(1))
            .unwrap_or_default(),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn said(code: &str, status: StatusCode, retry_after: Option<u64>, helps: bool) -> Said<'_> {
        Said {
            status,
            kind: "urn:idemproxy:problem:x",
            code,
            title: "T",
            detail: "said \"so\"",
            retry_after,
            retry_helps: helps,
        }
    }

    #[test]
    fn templates_render_json_or_are_refused() {
        let t = Template::parse(
            r#"{"errorCode": "{code}", "error": {"message": "{detail}", "status": {status}, "retryIn": {retry_after}}, "lit": "{x-1}", "o": {}}"#,
            None,
        )
        .unwrap();
        let body = t.render(&said(
            "key-reused",
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            false,
        ));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["errorCode"], "key-reused");
        assert_eq!(v["error"]["message"], "said \"so\"");
        assert_eq!(v["error"]["status"], 422);
        assert!(v["error"]["retryIn"].is_null());
        for bad in [
            r#"{"code": {code}}"#,
            r#"{"code": "{code}""#,
            r#"{"code": "{cdoe}"}"#,
            r#"{"s": "{status}"#,
        ] {
            assert!(Template::parse(bad, None).is_err(), "{bad}");
        }
        assert!(Template::parse("{}", Some("bad\nvalue")).is_err());
    }

    #[test]
    fn stripe_types_follow_the_sdks() {
        let r = Dialect::Stripe.render(&said(
            "key-reused",
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            false,
        ));
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["type"], "idempotency_error");
        assert_eq!(r.should_retry, Some(false));
        let r = Dialect::Stripe.render(&said("in-progress", StatusCode::CONFLICT, Some(1), true));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (r.status, r.should_retry),
            (StatusCode::CONFLICT, Some(true))
        );
        assert_eq!(v["error"]["code"], "idempotency_key_in_use");
        let r = Dialect::Stripe.render(&said(
            "store-unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            Some(1),
            true,
        ));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["type"], "api_error");
        assert_eq!(v["error"]["code"], "store_unavailable");
    }
}
