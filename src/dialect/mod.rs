//! The shape of the proxy's own error answers (`409` in progress, `422` key reused, the
//! `503`s, …): RFC 9457 problem documents by default, Stripe's error object, an API's own
//! shape from a JSON template, or a built-in preset for a payment API ([`Preset`]); each
//! outcome's status, code, message, category and headers overridable ([`Answer`]).
//!
//! Why: the proxy sits in front of APIs whose clients already parse an error shape of
//! their own, and misread any other — stripe-node takes a JSON body without an `error`
//! member for a success, whatever the status — and branch on the API's own codes (Square's
//! `IDEMPOTENCY_KEY_REUSED`, Adyen's `704`). What an answer *means* (`Retry-After`, the key
//! echo, `Cache-Control`) is the same in every dialect; the status, the body's shape, its
//! content type and the hints a dialect's clients honour (`Stripe-Should-Retry`, Adyen's
//! `transient-error`) are the dialect's.

mod presets;
mod stripe;
mod template;

use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};

pub use presets::Preset;
pub use template::Template;

/// How a route answers with its own errors.
#[derive(Debug, Clone, Default)]
pub struct Dialect {
    shape: Shape,
    /// The payment API whose answers this is, if a preset.
    preset: Option<Preset>,
    /// The configuration's `outcomes:`, by outcome code, over the preset's.
    overrides: Arc<[(String, Answer)]>,
}

/// The body's shape.
#[derive(Debug, Clone, Default)]
pub enum Shape {
    /// `application/problem+json` (RFC 9457).
    #[default]
    Problem,
    /// Stripe's error object, with `Stripe-Should-Retry`.
    Stripe,
    /// An API's own shape.
    Template(Arc<Template>),
}

/// The proxy's own outcomes, by the short code of their problem type: what `outcomes:`
/// may name. (Kept equal to the problem table by a test in [`crate::problem`].)
pub const OUTCOMES: [&str; 28] = [
    "missing-key",
    "invalid-key",
    "missing-client-id",
    "invalid-client-id",
    "invalid-path",
    "body-too-large",
    "body-timeout",
    "body-unreadable",
    "invalid-body",
    "key-reused",
    "in-progress",
    "outcome-unknown",
    "not-replayable",
    "store-unavailable",
    "store-failed",
    "upstream-unreachable",
    "upstream-failed",
    "upstream-timeout",
    "probe-inconclusive",
    "stored-answer-unreadable",
    "head-too-large",
    "malformed-request",
    "uri-too-long",
    "http-version-not-supported",
    "not-implemented",
    "unsupported-transfer-coding",
    "overloaded",
    "internal",
];

/// What one outcome looks like in a dialect, each part optional: the status, the API's
/// error code, its message (instead of the problem's detail), its category (Square's
/// `category`, Adyen's `errorType`, PayPal's `name`, Checkout.com's `error_type`) and
/// headers of its own (Adyen's `transient-error: true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub status: Option<StatusCode>,
    pub code: Option<String>,
    pub message: Option<String>,
    pub category: Option<String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Answer {
    /// This answer with `over`'s parts put over it, field by field (a header of the same
    /// name replaced).
    fn with(mut self, over: &Answer) -> Answer {
        self.status = over.status.or(self.status);
        for (mine, theirs) in [
            (&mut self.code, &over.code),
            (&mut self.message, &over.message),
            (&mut self.category, &over.category),
        ] {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
        for (name, value) in &over.headers {
            self.headers.retain(|(n, _)| n != name);
            self.headers.push((name.clone(), value.clone()));
        }
        self
    }
}

/// What a proxy answer says, whatever its shape.
#[derive(Debug, Clone, Copy)]
pub struct Said<'a> {
    pub status: StatusCode,
    /// The problem type (`urn:idemproxy:problem:key-reused`).
    pub kind: &'a str,
    /// Its short code (`key-reused`); in a template, the dialect's code for it.
    pub code: &'a str,
    /// The dialect's category for it (templates only; empty where there is none).
    pub category: &'a str,
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
    /// The dialect's own headers for this outcome.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Dialect {
    /// Stripe's error object (the `stripe` preset).
    pub fn stripe() -> Self {
        Self {
            shape: Shape::Stripe,
            preset: Some(Preset::Stripe),
            ..Self::default()
        }
    }

    /// An API's own shape.
    pub fn template(template: Template) -> Self {
        Self {
            shape: Shape::Template(Arc::new(template)),
            ..Self::default()
        }
    }

    /// A payment API's answers, as its public error documentation describes them.
    pub fn preset(preset: Preset) -> Self {
        match preset {
            Preset::Stripe => Self::stripe(),
            _ => Self {
                shape: preset.shape(),
                preset: Some(preset),
                ..Self::default()
            },
        }
    }

    /// This dialect with the configuration's `outcomes:` over its own answers.
    pub fn with_overrides(mut self, overrides: Vec<(String, Answer)>) -> Self {
        self.overrides = overrides.into();
        self
    }

    /// The payment API whose preset this is, if any.
    pub fn api(&self) -> Option<Preset> {
        self.preset
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Whether this is the default: problem documents as they are.
    pub fn is_plain(&self) -> bool {
        matches!(self.shape, Shape::Problem) && self.overrides.is_empty()
    }

    /// The answer for `said`'s outcome: the preset's, with the configuration's over it.
    pub fn answer(&self, said: &Said<'_>) -> Answer {
        let own = self.preset.map(|p| p.answer(said)).unwrap_or_default();
        match self.overrides.iter().find(|(code, _)| code == said.code) {
            Some((_, over)) => own.with(over),
            None => own,
        }
    }

    /// The answer `said` in this dialect.
    pub fn render(&self, said: &Said<'_>) -> Rendered {
        let answer = self.answer(said);
        let status = answer.status.unwrap_or(said.status);
        let detail = answer.message.as_deref().unwrap_or(said.detail);
        match &self.shape {
            Shape::Problem => Rendered {
                status,
                content_type: HeaderValue::from_static("application/problem+json"),
                body: serde_json::to_vec(&ProblemDocument {
                    kind: said.kind,
                    title: said.title,
                    status: status.as_u16(),
                    detail,
                })
                .unwrap_or_default(),
                should_retry: None,
                headers: answer.headers,
            },
            Shape::Stripe => stripe::render(said, &answer),
            Shape::Template(t) => {
                let filled = Said {
                    status,
                    code: answer.code.as_deref().unwrap_or(said.code),
                    category: answer.category.as_deref().unwrap_or(said.category),
                    detail,
                    ..*said
                };
                Rendered {
                    status,
                    content_type: t.content_type.clone(),
                    body: t.render(&filled).into_bytes(),
                    should_retry: None,
                    headers: answer.headers,
                }
            }
        }
    }

    /// Whether `other` is this very dialect (a route inheriting `defaults`'), so that
    /// `check-config` prints each once.
    pub fn same_as(&self, other: &Dialect) -> bool {
        let shape = match (&self.shape, &other.shape) {
            (Shape::Template(a), Shape::Template(b)) => Arc::ptr_eq(a, b),
            (Shape::Problem, Shape::Problem) | (Shape::Stripe, Shape::Stripe) => true,
            _ => false,
        };
        shape && self.preset == other.preset && Arc::ptr_eq(&self.overrides, &other.overrides)
    }

    /// The name a configuration gives this dialect.
    pub fn name(&self) -> &'static str {
        match (self.preset, &self.shape) {
            (Some(preset), _) => preset.name(),
            (None, Shape::Problem) => "problem",
            (None, Shape::Stripe) => "stripe",
            (None, Shape::Template(_)) => "template",
        }
    }
}

#[cfg(test)]
mod tests;
