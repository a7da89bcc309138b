//! The request fingerprint: what makes two requests "the same operation".
//!
//! SHA-256 over the method, the concrete path, the query string and the canonical body,
//! each length-prefixed so that no two different inputs can run into one another. A key
//! reused with a different fingerprint is answered `422` instead of replaying someone
//! else's result.

use sha2::{Digest, Sha256};

use crate::canonical::write_canonical;

/// A 32-byte SHA-256 fingerprint.
pub type Fingerprint = [u8; 32];

/// Why a body could not be fingerprinted; the client fixes it and retries with the same key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("this route fingerprints JSON fields, so the body must be a JSON document")]
    NotJson,
}

/// What is fingerprinted of a request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub content_type: Option<&'a [u8]>,
    pub body: &'a [u8],
    /// The route's JSON Pointers; `None` takes the whole body.
    pub fields: Option<&'a [String]>,
}

/// How the body is understood, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    Json,
    Form,
    Raw,
}

fn body_kind(content_type: Option<&[u8]>) -> BodyKind {
    let Some(ct) = content_type else {
        return BodyKind::Raw;
    };
    let essence = ct.split(|b| *b == b';').next().unwrap_or_default();
    let essence = String::from_utf8_lossy(essence).trim().to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        BodyKind::Json
    } else if essence == "application/x-www-form-urlencoded" {
        BodyKind::Form
    } else {
        BodyKind::Raw
    }
}

/// Whether a body of this content type is a URL-encoded form.
pub fn is_form(content_type: Option<&[u8]>) -> bool {
    body_kind(content_type) == BodyKind::Form
}

/// Whether a request with this content type must carry valid JSON.
pub fn is_json(content_type: Option<&[u8]>) -> bool {
    body_kind(content_type) == BodyKind::Json
}

fn put(hasher: &mut Sha256, part: &[u8]) {
    hasher.update((part.len() as u64).to_be_bytes());
    hasher.update(part);
}

/// Computes the fingerprint, or says why the body cannot be understood.
pub fn fingerprint(req: &Request<'_>) -> Result<Fingerprint, BodyError> {
    let mut h = Sha256::new();
    put(&mut h, b"idemproxy-fingerprint-v1");
    put(&mut h, req.method.as_bytes());
    put(&mut h, req.path.as_bytes());
    match req.query {
        Some(q) => {
            h.update([1]);
            put(&mut h, q.as_bytes());
        }
        None => h.update([0]),
    }
    let kind = body_kind(req.content_type);
    if let Some(fields) = req.fields {
        let value: serde_json::Value = match crate::canonical::parse_strict(req.body) {
            Ok(value) => value,
            Err(_) if kind != BodyKind::Json => return Err(BodyError::NotJson),
            Err(e) => return Err(BodyError::InvalidJson(e.to_string())),
        };
        put(&mut h, b"fields");
        let mut canon = Vec::new();
        for field in fields {
            put(&mut h, field.as_bytes());
            match value.pointer(field) {
                Some(v) => {
                    canon.clear();
                    write_canonical(v, &mut canon);
                    h.update([1]);
                    put(&mut h, &canon);
                }
                None => h.update([0]),
            }
        }
        return Ok(h.finalize().into());
    }
    match kind {
        BodyKind::Json if !req.body.is_empty() => {
            let canon = crate::canonical::canonical_strict(req.body)
                .map_err(|e| BodyError::InvalidJson(e.to_string()))?;
            put(&mut h, b"json");
            put(&mut h, &canon);
        }
        BodyKind::Form => {
            let mut pairs: Vec<(String, String)> =
                form_urlencoded::parse(req.body).into_owned().collect();
            pairs.sort();
            put(&mut h, b"form");
            for (k, v) in &pairs {
                put(&mut h, k.as_bytes());
                put(&mut h, v.as_bytes());
            }
        }
        BodyKind::Json | BodyKind::Raw => {
            put(&mut h, b"raw");
            put(&mut h, req.body);
        }
    }
    Ok(h.finalize().into())
}

/// The fingerprint of a route with `fingerprint: none`: every request under one key is
/// the same operation, whatever it carries (no `422` safety net).
pub fn none() -> Fingerprint {
    let mut h = Sha256::new();
    put(&mut h, b"idemproxy-fingerprint-none");
    h.finalize().into()
}

/// `base` extended with the values of the route's `fingerprint.headers` (each name with
/// all its values in order, or marked absent), so that an API version header sent with
/// the same body makes a different operation. Routes without such headers keep `base`
/// as it is, so their stored fingerprints stay valid.
pub fn with_headers<'a>(
    base: Fingerprint,
    headers: impl IntoIterator<Item = (&'a str, Vec<&'a [u8]>)>,
) -> Fingerprint {
    let mut h = Sha256::new();
    put(&mut h, b"idemproxy-fingerprint-headers-v1");
    put(&mut h, &base);
    for (name, values) in headers {
        put(&mut h, name.as_bytes());
        h.update((values.len() as u64).to_be_bytes());
        for value in values {
            put(&mut h, value);
        }
    }
    h.finalize().into()
}

/// Checks that `pointer` is an RFC 6901 JSON Pointer (`""`, or `/a/b` with `~0`/`~1` escapes).
pub fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(format!(
            "`{pointer}` is not a JSON Pointer; did you mean `/{pointer}`?"
        ));
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!("`{pointer}`: `~` must be followed by 0 or 1"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(ct: &str, body: &str, fields: Option<&[String]>) -> Result<Fingerprint, BodyError> {
        fingerprint(&Request {
            method: "POST",
            path: "/payments",
            query: None,
            content_type: Some(ct.as_bytes()),
            body: body.as_bytes(),
            fields,
        })
    }

    const JSON: &str = "application/json; charset=utf-8";

    /// Reordered keys, other whitespace and other number spellings are the same operation.
    #[test]
    fn json_is_canonical() {
        let a = fp(JSON, r#"{"amount":100,"currency":"RUB"}"#, None).unwrap();
        let b = fp(
            JSON,
            "{ \"currency\" : \"RUB\",\n \"amount\" : 1.00e2 }",
            None,
        )
        .unwrap();
        assert_eq!(a, b);
        let c = fp(JSON, r#"{"amount":500,"currency":"RUB"}"#, None).unwrap();
        assert_ne!(a, c);
    }

    /// Only the configured fields count; others may change freely.
    #[test]
    fn fields_select_the_operation() {
        let fields = vec!["/amount".to_owned(), "/currency".to_owned()];
        let a = fp(
            JSON,
            r#"{"amount":100,"currency":"RUB","sent_at":1}"#,
            Some(&fields),
        )
        .unwrap();
        let b = fp(
            JSON,
            r#"{"sent_at":2,"currency":"RUB","amount":100,"attempt":3}"#,
            Some(&fields),
        )
        .unwrap();
        assert_eq!(a, b);
        let c = fp(JSON, r#"{"amount":101,"currency":"RUB"}"#, Some(&fields)).unwrap();
        assert_ne!(a, c);
        // A missing field differs from a null one.
        let d = fp(JSON, r#"{"amount":100}"#, Some(&fields)).unwrap();
        let e = fp(JSON, r#"{"amount":100,"currency":null}"#, Some(&fields)).unwrap();
        assert_ne!(d, e);
    }

    /// Method, path and query are part of the operation.
    #[test]
    fn request_line_counts() {
        let base = Request {
            method: "POST",
            path: "/payments",
            query: None,
            content_type: None,
            body: b"x",
            fields: None,
        };
        let a = fingerprint(&base).unwrap();
        assert_ne!(
            a,
            fingerprint(&Request {
                method: "PUT",
                ..base
            })
            .unwrap()
        );
        assert_ne!(
            a,
            fingerprint(&Request {
                path: "/refunds",
                ..base
            })
            .unwrap()
        );
        assert_ne!(
            a,
            fingerprint(&Request {
                query: Some(""),
                ..base
            })
            .unwrap()
        );
        assert_ne!(
            a,
            fingerprint(&Request {
                query: Some("a=1"),
                ..base
            })
            .unwrap()
        );
    }

    /// Form pairs are order-insensitive; other bodies are raw bytes.
    #[test]
    fn form_and_raw() {
        let form = "application/x-www-form-urlencoded";
        assert_eq!(fp(form, "a=1&b=2", None), fp(form, "b=2&a=1", None));
        assert_ne!(fp(form, "a=1&b=2", None), fp(form, "a=2&b=1", None));
        assert_ne!(
            fp("text/plain", "a=1&b=2", None),
            fp("text/plain", "b=2&a=1", None)
        );
    }

    /// Invalid JSON is reported, not hashed as bytes.
    #[test]
    fn invalid_json_is_an_error() {
        assert!(matches!(
            fp(JSON, "{\"amount\":", None),
            Err(BodyError::InvalidJson(_))
        ));
        let fields = vec!["/amount".to_owned()];
        assert_eq!(
            fp("text/plain", "amount=1", Some(&fields)),
            Err(BodyError::NotJson)
        );
    }

    /// JSON Pointer syntax is checked at configuration time.
    #[test]
    fn pointers() {
        assert!(check_pointer("/amount").is_ok());
        assert!(check_pointer("/a~1b/~0c").is_ok());
        assert!(check_pointer("").is_ok());
        assert!(check_pointer("amount").is_err());
        assert!(check_pointer("/a~2").is_err());
    }
}
