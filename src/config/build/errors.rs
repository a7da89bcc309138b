//! `errors:` — the dialect of the proxy's own error answers: `problem`, a payment API's
//! preset, or a template; each outcome overridable field by field. Everything that could
//! make an answer unreadable is refused here, at start, with the key named: a template
//! that does not render JSON, an outcome the proxy does not have, a status that is not an
//! error (an SDK would take it for a success), a header the proxy owns.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue, StatusCode};

use super::Problems;
use crate::config::file::{FileErrorSpec, FileErrors, FileOutcome};
use crate::config::policy::Policy;
use crate::dialect::{Answer, Dialect, OUTCOMES, Preset, Shape, Template};

/// Headers an outcome may not set: the answer's framing and the hints every dialect
/// shares.
const OWNED: [&str; 7] = [
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "retry-after",
    "cache-control",
    "idempotent-replayed",
];

/// `errors` of a route (or `defaults`), over `base`'s.
pub(super) fn errors(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: Option<&FileErrors>,
) -> Dialect {
    let key = format!("{at}.errors");
    match own {
        None => base.map(|b| b.errors.clone()).unwrap_or_default(),
        Some(FileErrors::Word(w)) => word(p, &key, w),
        Some(FileErrors::Spec(spec)) => spec_dialect(p, &key, spec),
    }
}

fn word(p: &mut Problems, key: &str, w: &str) -> Dialect {
    if w == "problem" {
        return Dialect::default();
    }
    match Preset::named(w) {
        Some(preset) => Dialect::preset(preset),
        None => {
            p.push(
                key,
                format!(
                    "`{w}`: use `problem`, a preset ({}), or `{{ template: '…' }}`",
                    presets()
                ),
            );
            Dialect::default()
        }
    }
}

fn presets() -> String {
    Preset::ALL
        .iter()
        .map(|p| format!("`{}`", p.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn spec_dialect(p: &mut Problems, key: &str, spec: &FileErrorSpec) -> Dialect {
    let dialect = match (&spec.preset, &spec.template) {
        (Some(_), Some(_)) => {
            p.push(key, "give `preset` or `template`, not both");
            return Dialect::default();
        }
        (Some(name), None) => {
            if spec.content_type.is_some() {
                p.push(
                    format!("{key}.content_type"),
                    "a preset has the API's own content type; `content_type` goes with `template`",
                );
            }
            if name == "problem" {
                Dialect::default()
            } else {
                match Preset::named(name) {
                    Some(preset) => Dialect::preset(preset),
                    None => {
                        p.push(
                            format!("{key}.preset"),
                            format!("`{name}`: the presets are {}", presets()),
                        );
                        return Dialect::default();
                    }
                }
            }
        }
        (None, Some(text)) => match Template::parse(text, spec.content_type.as_deref()) {
            Ok(template) => Dialect::template(template),
            Err(e) => {
                p.push(format!("{key}.template"), e);
                return Dialect::default();
            }
        },
        (None, None) if spec.outcomes.is_some() => Dialect::default(),
        (None, None) => {
            p.push(
                key,
                "give `preset`, `template` or `outcomes` (or a word: `problem`, `stripe`, …)",
            );
            return Dialect::default();
        }
    };
    match &spec.outcomes {
        Some(outcomes) => {
            let overrides = overrides(p, &format!("{key}.outcomes"), outcomes, dialect.shape());
            dialect.with_overrides(overrides)
        }
        None => dialect,
    }
}

fn overrides(
    p: &mut Problems,
    key: &str,
    outcomes: &BTreeMap<String, FileOutcome>,
    shape: &Shape,
) -> Vec<(String, Answer)> {
    let mut out = Vec::new();
    for (name, outcome) in outcomes {
        let at = format!("{key}.{name}");
        if !OUTCOMES.contains(&name.as_str()) {
            p.push(
                at,
                format!(
                    "the proxy has no outcome `{name}`; it has: {}",
                    OUTCOMES.join(", ")
                ),
            );
            continue;
        }
        if let Some(answer) = outcome_answer(p, &at, outcome, shape) {
            out.push((name.clone(), answer));
        }
    }
    out
}

fn outcome_answer(
    p: &mut Problems,
    at: &str,
    outcome: &FileOutcome,
    shape: &Shape,
) -> Option<Answer> {
    let before = p.0.len();
    let status = outcome.status.and_then(|s| match StatusCode::from_u16(s) {
        Ok(status) if status.is_client_error() || status.is_server_error() => Some(status),
        _ => {
            p.push(
                format!("{at}.status"),
                format!("{s} is not an error status (400–599): a client would take the answer for the API's own"),
            );
            None
        }
    });
    if matches!(shape, Shape::Problem) {
        for (field, set) in [("code", &outcome.code), ("category", &outcome.category)] {
            if set.is_some() {
                p.push(
                    format!("{at}.{field}"),
                    "a problem document has no place for it: use a preset or a template (`{code}`, `{category}`)",
                );
            }
        }
    }
    let mut headers = Vec::new();
    for (name, value) in outcome.headers.iter().flatten() {
        let key = format!("{at}.headers.{name}");
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            p.push(key, "not a header name");
            continue;
        };
        if OWNED.contains(&header.as_str()) {
            p.push(
                key,
                "the proxy sets this header itself on every answer it gives",
            );
            continue;
        }
        match HeaderValue::from_str(value) {
            Ok(v) => headers.push((header, v)),
            Err(_) => p.push(key, "not a header value (visible ASCII and spaces)"),
        }
    }
    (p.0.len() == before).then(|| Answer {
        status,
        code: outcome.code.clone(),
        message: outcome.message.clone(),
        category: outcome.category.clone(),
        headers,
    })
}
