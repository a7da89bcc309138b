//! Error templates: an API's own error shape as JSON text with placeholders, checked at
//! start to render valid JSON for every answer.

use http::{HeaderValue, StatusCode};

use super::Said;

/// A JSON body with placeholders: `{status}` and `{retry_after}` become numbers (`null`
/// when there is no retry delay), `{type}`, `{title}`, `{detail}`, `{code}` and
/// `{category}` become the text of a JSON string, escaped, for use between quotes.
#[derive(Debug)]
pub struct Template {
    parts: Vec<Part>,
    pub(super) content_type: HeaderValue,
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
    Category,
    RetryAfter,
}

const FIELDS: [(&str, Field); 7] = [
    ("status", Field::Status),
    ("type", Field::Type),
    ("title", Field::Title),
    ("detail", Field::Detail),
    ("code", Field::Code),
    ("category", Field::Category),
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
                        "unknown placeholder `{{{name}}}` (use status, type, title, detail, code, category, retry_after)"
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
                category: "a \"category\"",
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
                Part::Field(Field::Category) => escaped(&mut out, said.category),
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
