//! `client_id:` as the proxy holds it: where a key's tenant namespace comes from. A source
//! must be one callers cannot forge, and one that does not change while a tenant retries —
//! an OAuth bearer token is renewed (and fetched anew by each SDK instance), so its hash
//! splits one tenant's keys; a credential's tenant, or a verified JWT's claim, does not.

use std::sync::Arc;

use http::HeaderName;

/// Where the tenant namespace of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientIdSource {
    /// A header set by a trusted auth layer in front of the proxy.
    Header(HeaderName),
    /// SHA-256 of the `Authorization` header: each credential is its own namespace.
    AuthorizationSha256,
    /// Credentials named to tenants, so that a tenant's keys stay one namespace across its
    /// credentials (two API keys during a rotation, one per service).
    Credentials(Arc<Credentials>),
    /// A claim of a verified bearer JWT: the same across the token's renewals.
    Jwt(Arc<JwtSource>),
    /// One fixed namespace (single-tenant sidecar).
    Static(String),
}

/// `client_id.credentials`: which credential belongs to which tenant, by the SHA-256 of
/// the header's value — the configuration never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The header carrying the credential (`Authorization`, `X-API-Key`).
    pub header: HeaderName,
    /// SHA-256 of the header's value → the tenant.
    pub tenants: std::collections::HashMap<[u8; 32], String>,
    /// An unlisted credential gets a namespace of its own (its hash in hex, as
    /// `authorization: sha256` names it) instead of a `401`.
    pub unlisted_own_namespace: bool,
}

/// `client_id.jwt`: the checks, and where the keys were read from (for `check-config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSource {
    pub verifier: crate::jwt::Verifier,
    /// `{ file: "…" }` or `{ env: "…" }`.
    pub keys_from: String,
}

impl ClientIdSource {
    /// Whether the identity is the `Authorization` header's value itself, which changes
    /// whenever an OAuth client renews its bearer token (and each SDK instance fetches its
    /// own); a JWT's claim does not.
    pub fn rotates_with_oauth_tokens(&self) -> bool {
        match self {
            ClientIdSource::AuthorizationSha256 => true,
            ClientIdSource::Credentials(c) => c.header == http::header::AUTHORIZATION,
            ClientIdSource::Header(h) => h == http::header::AUTHORIZATION,
            ClientIdSource::Jwt(_) | ClientIdSource::Static(_) => false,
        }
    }
}
