//! `client_id:` — whose namespace a key lives in — and the warning where the chosen source
//! would split one tenant's keys: an identity that rotates (an OAuth bearer token) gives the
//! same key a new namespace after every renewal, and the retry executes again.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;

use super::Problems;
use super::encryption::{Env, read_secret};
use crate::config::Route;
use crate::config::file::{FileClientId, FileConfig, FileCredentials, FileJwt};
use crate::config::identity::{ClientIdSource, Credentials, JwtSource};
use crate::dialect::Preset;
use crate::key::MAX_CLIENT_ID_LEN;

/// Whether `name` has the form of an unlisted credential's namespace (`unlisted: sha256`:
/// the hash in hex, as `authorization: sha256` names it); no tenant may, so the two never
/// meet.
fn is_hash_like(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How far a token's `exp` and `nbf` may be off the proxy's clock by default.
const DEFAULT_LEEWAY: std::time::Duration = std::time::Duration::from_secs(60);

pub(super) fn build_client_id(
    p: &mut Problems,
    file: &FileConfig,
    env: Env<'_>,
) -> Option<ClientIdSource> {
    let Some(c) = &file.client_id else {
        return Some(ClientIdSource::Static("default".into()));
    };
    let given = [
        c.header.is_some(),
        c.authorization.is_some(),
        c.credentials.is_some(),
        c.jwt.is_some(),
        c.static_name.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        p.push(
            "client_id",
            "set exactly one of `header`, `authorization`, `credentials`, `jwt` or `static`",
        );
        return None;
    }
    match c {
        FileClientId {
            header: Some(h), ..
        } => match HeaderName::from_bytes(h.as_bytes()) {
            Ok(name) => Some(ClientIdSource::Header(name)),
            Err(_) => {
                p.push("client_id.header", format!("`{h}` is not a header name"));
                None
            }
        },
        FileClientId {
            authorization: Some(a),
            ..
        } => {
            if a != "sha256" {
                p.push(
                    "client_id.authorization",
                    format!("`{a}`: the only supported value is `sha256`"),
                );
                return None;
            }
            Some(ClientIdSource::AuthorizationSha256)
        }
        FileClientId {
            credentials: Some(creds),
            ..
        } => build_credentials(p, creds).map(|c| ClientIdSource::Credentials(Arc::new(c))),
        FileClientId { jwt: Some(jwt), .. } => {
            build_jwt(p, jwt, env).map(|j| ClientIdSource::Jwt(Arc::new(j)))
        }
        _ => {
            let name = c.static_name.clone().unwrap_or_default();
            if name.is_empty() || !crate::key::is_visible_ascii(&name) {
                p.push(
                    "client_id.static",
                    "must be a non-empty printable ASCII name",
                );
                return None;
            }
            Some(ClientIdSource::Static(name))
        }
    }
}

/// `client_id.credentials`: every hash well formed and listed once, every tenant a name a
/// header-set client id could be.
fn build_credentials(p: &mut Problems, file: &FileCredentials) -> Option<Credentials> {
    let before = p.0.len();
    let header_text = file.header.as_deref().unwrap_or("Authorization");
    let header = super::header_name(p, "client_id.credentials.header".into(), header_text);
    let unlisted_own_namespace = match file.unlisted.as_deref() {
        None | Some("refuse") => false,
        Some("sha256") => true,
        Some(other) => {
            p.push(
                "client_id.credentials.unlisted",
                format!("`{other}`: use `refuse` (a 401 for a credential no tenant lists; the default) or `sha256` (its own namespace, as `authorization: sha256` gives)"),
            );
            false
        }
    };
    let mut tenants: HashMap<[u8; 32], String> = HashMap::new();
    let listed = file.tenants.as_ref().filter(|t| !t.is_empty());
    let Some(listed) = listed else {
        p.push(
            "client_id.credentials.tenants",
            "name at least one tenant and its credentials' hashes (`shop-1: [sha256:…]`; `printf %s \"$VALUE\" | sha256sum` gives one)",
        );
        return None;
    };
    for (tenant, hashes) in listed {
        let key = format!("client_id.credentials.tenants.{tenant}");
        if tenant.is_empty()
            || tenant.len() > MAX_CLIENT_ID_LEN
            || !crate::key::is_visible_ascii(tenant)
        {
            p.push(
                &key,
                format!("a tenant's name is 1 to {MAX_CLIENT_ID_LEN} printable ASCII characters"),
            );
        } else if is_hash_like(tenant) {
            p.push(
                &key,
                "64 hex digits name an unlisted credential's namespace (its SHA-256); name the tenant otherwise",
            );
        }
        if hashes.is_empty() {
            p.push(&key, "list at least one credential's hash");
        }
        for (i, text) in hashes.iter().enumerate() {
            let Some(hash) = parse_sha256(text) else {
                p.push(
                    format!("{key}[{i}]"),
                    format!("`{text}` is not `sha256:` and 64 hex digits (the SHA-256 of the header's whole value, e.g. of `Bearer sk_live_…`; the configuration holds no secret)"),
                );
                continue;
            };
            if let Some(other) = tenants.insert(hash, tenant.clone()) {
                p.push(
                    format!("{key}[{i}]"),
                    format!(
                        "this credential is listed for `{other}` too: one credential, one tenant"
                    ),
                );
            }
        }
    }
    let header = header?;
    (p.0.len() == before).then_some(Credentials {
        header,
        tenants,
        unlisted_own_namespace,
    })
}

/// `client_id.jwt`: the keys read and parsed now, so that a JWKS the proxy could not check
/// with stops the start instead of refusing every request.
fn build_jwt(p: &mut Problems, file: &FileJwt, env: Env<'_>) -> Option<JwtSource> {
    let claim = file.claim.clone().unwrap_or_else(|| "sub".to_owned());
    if claim.is_empty() {
        p.push(
            "client_id.jwt.claim",
            "name the claim that identifies the tenant (`sub`, `client_id`, `tenant_id`, …)",
        );
        return None;
    }
    let Some(spec) = &file.keys else {
        p.push(
            "client_id.jwt.keys",
            "required: the JWKS the tokens are verified with, `{ file: /etc/idemproxy/jwks.json }` (your identity provider's jwks_uri document) or `{ env: NAME }`",
        );
        return None;
    };
    let (keys_from, text) = match read_secret(spec, env) {
        Ok(read) => read,
        Err(e) => {
            p.push("client_id.jwt.keys", e);
            return None;
        }
    };
    let empty = |v: &Option<String>| v.as_deref().is_some_and(str::is_empty);
    if empty(&file.issuer) || empty(&file.audience) {
        p.push(
            "client_id.jwt",
            "`issuer` and `audience` are checked when given: leave them out rather than empty",
        );
        return None;
    }
    let leeway = file.leeway.map_or(DEFAULT_LEEWAY, |d| d.0);
    match crate::jwt::Verifier::from_jwks(
        &text,
        claim,
        file.issuer.clone(),
        file.audience.clone(),
        leeway,
    ) {
        Ok(verifier) => Some(JwtSource {
            verifier,
            keys_from,
        }),
        Err(e) => {
            p.push("client_id.jwt.keys", e);
            None
        }
    }
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    crate::key::from_hex(text.strip_prefix("sha256:")?)
}

/// Routes whose API's clients authenticate with OAuth bearer tokens (PayPal's SDKs fetch a
/// token per instance and renew it every few hours) while the identity comes from the
/// `Authorization` header: the same key under a renewed token lands in another namespace.
pub(super) fn rotating_identity_warnings(source: &ClientIdSource, routes: &[Route]) -> Vec<String> {
    if !source.rotates_with_oauth_tokens() {
        return Vec::new();
    }
    routes
        .iter()
        .filter(|r| {
            r.policy.errors.api() == Some(Preset::PayPal)
                || r.policy.upstream_key_header == "paypal-request-id"
                || r.policy.key_headers.iter().any(|h| h == "paypal-request-id")
        })
        .map(|r| {
            format!(
                "routes `{}`: PayPal's clients send an OAuth access token that changes with every renewal and every SDK instance, and client_id comes from `Authorization`: a retry under a new token is a new key there and executes again (PayPal could not deduplicate it either: the derived PayPal-Request-Id differs); take client_id from a header your gateway sets per merchant (`client_id: {{header: X-Tenant}}`) or, for one merchant, `static` — see docs/apis/paypal.md",
                r.name
            )
        })
        .collect()
}
