//! The key side of a policy: which headers carry the key, whose operations it names, how
//! answers are marked, and what the fingerprint covers. Existing clients spell their key
//! in many headers (`Idempotency-Key`, `X-Idempotency-Key`, `PayPal-Request-Id`, ...), and
//! some APIs change meaning with a version header rather than the body.

use http::HeaderName;

use super::{Problems, header_name};
use crate::config::file::{FileDerivedKey, FileFingerprintSpec, FilePolicy};
use crate::config::model::*;
use crate::config::policy::*;

/// What `key_header`/`key_headers`, `key_scope`, `replayed_header`, `echo_key_header`
/// and `fingerprint` resolve to.
pub(super) struct KeyPolicy {
    pub key_headers: Vec<HeaderName>,
    pub key_from_body: Option<String>,
    pub upstream_key_body: Option<String>,
    pub derived_key: DerivedKey,
    pub key_scope: KeyScope,
    pub replayed_header: HeaderName,
    pub echo_key: EchoKey,
    pub fingerprint_fields: Option<Vec<String>>,
    pub fingerprint_headers: Vec<HeaderName>,
    pub fingerprint_off: bool,
}

/// Merges the key knobs of `own` over `base` (or the built-in defaults).
pub(super) fn build_keys(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
) -> KeyPolicy {
    let key_headers = key_headers(p, at, base, own);
    let key_from_body = match own.key_from.as_ref() {
        None => base.and_then(|b| b.key_from_body.clone()),
        Some(from) => body_pointer(p, &format!("{at}.key_from"), from.body.as_deref()),
    };
    let upstream_key_body = match own.upstream_key.as_ref() {
        None => base.and_then(|b| b.upstream_key_body.clone()),
        Some(to) => body_pointer(p, &format!("{at}.upstream_key"), to.body.as_deref()),
    };
    let derived_key = derived_key(p, at, base, own);
    let key_scope = match own.key_scope.as_deref() {
        None => base.map_or(KeyScope::Client, |b| b.key_scope),
        Some("client") => KeyScope::Client,
        Some("client_and_route") => KeyScope::ClientAndRoute,
        Some(other) => {
            p.push(
                format!("{at}.key_scope"),
                format!("`{other}`: use `client` (one key namespace per client) or `client_and_route` (the same key on two routes is two operations)"),
            );
            KeyScope::Client
        }
    };
    let replayed_header = match &own.replayed_header {
        Some(h) => header_name(p, format!("{at}.replayed_header"), h),
        None => None,
    }
    .or_else(|| base.map(|b| b.replayed_header.clone()))
    .unwrap_or_else(|| HeaderName::from_static(DEFAULT_REPLAYED_HEADER));
    let echo_key = match own.echo_key_header.as_deref() {
        Some("none") => EchoKey::Off,
        Some(h) => header_name(p, format!("{at}.echo_key_header"), h)
            .map_or(EchoKey::AsSent, EchoKey::Named),
        None => base.map_or(EchoKey::AsSent, |b| b.echo_key.clone()),
    };
    let (fingerprint_fields, fingerprint_headers, fingerprint_off) = match &own.fingerprint {
        None => base.map_or((None, Vec::new(), false), |b| {
            (
                b.fingerprint_fields.clone(),
                b.fingerprint_headers.clone(),
                b.fingerprint_off,
            )
        }),
        Some(FileFingerprintSpec::Word(w)) if w == "none" => (None, Vec::new(), true),
        Some(FileFingerprintSpec::Word(w)) => {
            p.push(
                format!("{at}.fingerprint"),
                format!("`{w}`: use `none` (the key alone identifies the operation) or `{{ fields: [...], headers: [...] }}`"),
            );
            (None, Vec::new(), false)
        }
        Some(FileFingerprintSpec::Spec(spec)) => {
            let fields = spec.fields.as_ref().map(|fields| {
                if fields.is_empty() {
                    p.push(
                        format!("{at}.fingerprint.fields"),
                        "list at least one JSON Pointer, or leave it out to fingerprint the whole body",
                    );
                }
                for (i, field) in fields.iter().enumerate() {
                    if let Err(e) = crate::fingerprint::check_pointer(field) {
                        p.push(format!("{at}.fingerprint.fields[{i}]"), e);
                    }
                }
                fields.clone()
            });
            let headers = spec
                .headers
                .iter()
                .flatten()
                .enumerate()
                .filter_map(|(i, h)| header_name(p, format!("{at}.fingerprint.headers[{i}]"), h))
                .collect();
            (fields, headers, false)
        }
    };
    KeyPolicy {
        key_headers,
        key_from_body,
        upstream_key_body,
        derived_key,
        key_scope,
        replayed_header,
        echo_key,
        fingerprint_fields,
        fingerprint_headers,
        fingerprint_off,
    }
}

/// `key_header: NAME` (one) or `key_headers: [A, B]` (the first present wins).
fn key_headers(
    p: &mut Problems,
    at: &str,
    base: Option<&Policy>,
    own: &FilePolicy,
) -> Vec<HeaderName> {
    let default = || vec![HeaderName::from_static(DEFAULT_KEY_HEADER)];
    match (&own.key_header, &own.key_headers) {
        (Some(_), Some(_)) => {
            p.push(
                format!("{at}.key_headers"),
                "set `key_header` (one name) or `key_headers` (several), not both",
            );
            default()
        }
        (Some(h), None) => header_name(p, format!("{at}.key_header"), h)
            .map(|h| vec![h])
            .unwrap_or_else(default),
        (None, Some(list)) => {
            if list.is_empty() {
                p.push(
                    format!("{at}.key_headers"),
                    "list at least one header, or leave it out for `Idempotency-Key`",
                );
            }
            let mut names: Vec<HeaderName> = Vec::new();
            for (i, h) in list.iter().enumerate() {
                let Some(name) = header_name(p, format!("{at}.key_headers[{i}]"), h) else {
                    continue;
                };
                if names.contains(&name) {
                    p.push(
                        format!("{at}.key_headers[{i}]"),
                        format!("`{h}` is listed twice"),
                    );
                }
                names.push(name);
            }
            if names.is_empty() { default() } else { names }
        }
        (None, None) => base.map_or_else(default, |b| b.key_headers.clone()),
    }
}

/// `{ body: POINTER }`: a member's JSON Pointer (not the whole body).
fn body_pointer(p: &mut Problems, at: &str, pointer: Option<&str>) -> Option<String> {
    match pointer {
        None => {
            p.push(at, "name the body member: `{ body: /idempotency_key }`");
            None
        }
        Some("") => {
            p.push(
                format!("{at}.body"),
                "`\"\"` is the whole body; point at the member that holds the key, e.g. `/idempotency_key`",
            );
            None
        }
        Some(pointer) => {
            if let Err(e) = crate::fingerprint::check_pointer(pointer) {
                p.push(format!("{at}.body"), e);
            }
            Some(pointer.to_owned())
        }
    }
}

/// `derived_key: plain | { hash: sha256 } | { max_length: N }`.
fn derived_key(p: &mut Problems, at: &str, base: Option<&Policy>, own: &FilePolicy) -> DerivedKey {
    let key = format!("{at}.derived_key");
    match &own.derived_key {
        None => base.map_or(DerivedKey::Plain, |b| b.derived_key),
        Some(FileDerivedKey::Word(w)) if w == "plain" => DerivedKey::Plain,
        Some(FileDerivedKey::Word(w)) => {
            p.push(
                key,
                format!("`{w}`: use `plain` (client_id:key), `{{ hash: sha256 }}` or `{{ max_length: 64 }}`"),
            );
            DerivedKey::Plain
        }
        Some(FileDerivedKey::Spec(spec)) => match (spec.hash.as_deref(), spec.max_length) {
            (Some("sha256"), None) => DerivedKey::Sha256,
            (Some(other), None) => {
                p.push(
                    format!("{key}.hash"),
                    format!("`{other}`: only `sha256` is offered"),
                );
                DerivedKey::Plain
            }
            (None, Some(n)) if n < MIN_HASHED_LEN => {
                p.push(
                    format!("{key}.max_length"),
                    format!("{n} is shorter than the shortest hashed key ({MIN_HASHED_LEN} base64url characters, 132 bits), so a long key could not be sent without letting two keys meet; the provider needs to accept at least {MIN_HASHED_LEN}"),
                );
                DerivedKey::Plain
            }
            (None, Some(n)) => DerivedKey::MaxLength(n),
            (Some(_), Some(_)) => {
                p.push(key, "give `hash` or `max_length`, not both");
                DerivedKey::Plain
            }
            (None, None) => {
                p.push(key, "give `{ hash: sha256 }` or `{ max_length: N }`");
                DerivedKey::Plain
            }
        },
    }
}
