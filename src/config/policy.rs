//! A protected route and its validated policy: how keys are read, scoped and sent on,
//! what a duplicate, an unknown outcome or an expired lease does. Kept apart from the
//! rest of the configuration's model because it is the part the request path reads.

use std::time::Duration;

use http::{HeaderName, Method};

use crate::route::PathPattern;

/// What a duplicate gets while the first request is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// `409` with `Retry-After` at once.
    Reject,
    /// Hold the duplicate up to this long for the first answer, then `409`.
    Wait(Duration),
}

/// A protected route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Shared, because every request's metrics carry it as a label.
    pub name: std::sync::Arc<str>,
    pub methods: Vec<Method>,
    pub pattern: PathPattern,
    pub policy: Policy,
}

/// Per-route idempotency policy (defaults merged with the route's overrides).
#[derive(Debug, Clone)]
pub struct Policy {
    /// Headers that may carry the client's key, in order: the first present one is the
    /// key; two present with different values are refused. Never empty.
    pub key_headers: Vec<HeaderName>,
    /// A JSON Pointer (or, for a form body, the field it names) where the key is read
    /// from the body when no key header is present.
    pub key_from_body: Option<String>,
    /// Whose operations a key names.
    pub key_scope: KeyScope,
    /// Marks every protected answer: `true` on a replay, `false` otherwise.
    pub replayed_header: HeaderName,
    /// Where the key the client sent is echoed on every protected answer.
    pub echo_key: EchoKey,
    pub upstream_key_header: HeaderName,
    /// The form of the derived key sent upstream.
    pub derived_key: DerivedKey,
    /// Where the derived key goes in the body instead of `upstream_key_header`
    /// (`upstream_key: { body: POINTER }`), for providers that read it there.
    pub upstream_key_body: Option<String>,
    pub lease: Duration,
    pub retention: Duration,
    pub max_body: u64,
    pub max_stored_response: u64,
    pub require_key: bool,
    pub on_conflict: OnConflict,
    /// JSON Pointers that define the operation; `None` fingerprints the whole body.
    pub fingerprint_fields: Option<Vec<String>>,
    /// Request headers that change what a request means (an API version), fingerprinted
    /// besides the body.
    pub fingerprint_headers: Vec<HeaderName>,
    /// `fingerprint: none`: the key alone identifies the operation (no `422` safety net).
    pub fingerprint_off: bool,
    /// Extra response headers stored and replayed besides `Content-Type` and `Location`.
    pub store_headers: Vec<HeaderName>,
    /// Upstream statuses after which the key is released instead of stored.
    pub release_on: Vec<u16>,
    /// Asked before re-executing after a takeover, for upstreams that cannot deduplicate.
    pub recovery_probe: Option<RecoveryProbe>,
    /// What an ambiguous outcome (timeout, reset after send, an `ambiguous_statuses`
    /// answer) does to the key.
    pub on_ambiguous: Ambiguous,
    /// Upstream statuses that do not say whether the operation happened (e.g. `502`/`504`
    /// from a gateway behind the proxy).
    pub ambiguous_statuses: Vec<u16>,
    /// What a retry of an unresolved key (lease run out, outcome unknown) does.
    pub takeover: Takeover,
    /// The shape of the proxy's own error answers on this route.
    pub errors: crate::dialect::Dialect,
    /// Whether the console may show this route's stored bodies (on an operator's request;
    /// never a sealed one).
    pub console_body: bool,
}

/// The form of the key sent to the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DerivedKey {
    /// `client_id:key` (up to 511 characters, more with `key_scope: client_and_route`).
    Plain,
    /// The SHA-256 of the plain form, 64 hex characters.
    Sha256,
    /// Plain when it is at most this long, else a SHA-256 form that fits: 64 hex
    /// characters where 64 fit, else base64url cut to the limit (at most 43 characters,
    /// the whole hash; at least [`MIN_HASHED_LEN`]).
    MaxLength(usize),
}

/// The shortest `derived_key.max_length`: 22 base64url characters, 132 bits of the hash.
pub const MIN_HASHED_LEN: usize = 22;

impl DerivedKey {
    /// For `check-config`: which key a route sends and why.
    pub fn explain(self) -> String {
        match self {
            DerivedKey::Plain => "client_id:key as it is (up to 511 characters)".into(),
            DerivedKey::Sha256 => "the SHA-256 of client_id:key, 64 hex characters".into(),
            DerivedKey::MaxLength(n) if n >= 64 => format!(
                "client_id:key where it fits in {n} characters, else its SHA-256 in 64 hex characters"
            ),
            DerivedKey::MaxLength(n) => {
                let len = n.min(43);
                let bits = (len * 6).min(256);
                // Birthday bound at a trillion keys: (10^12)^2 / 2^(bits+1).
                let exponent = (bits as f64 + 1.0) * 2f64.log10() - 24.0;
                format!(
                    "client_id:key where it fits in {n} characters, else its SHA-256 in base64url cut to {len} characters ({bits} bits: among a trillion keys, two meet with odds of about 1 in 10^{exponent:.0}); it never contains `:`, so it never equals another client's plain key"
                )
            }
        }
    }
}

/// Where a protected answer echoes the client's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EchoKey {
    /// Under the header the key was read from (the default).
    AsSent,
    /// Under this header.
    Named(HeaderName),
    /// Not at all (`echo_key_header: none`).
    Off,
}

/// Whose operations a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyScope {
    /// One namespace per client: the same key on two routes is one operation.
    Client,
    /// One namespace per client and route: the same key on two routes is two operations.
    ClientAndRoute,
}

impl Policy {
    /// The first key header: the one named in problems and logs.
    pub fn key_header(&self) -> &HeaderName {
        &self.key_headers[0]
    }

    /// Every accepted key header, for a problem's detail: `a` or `b`.
    pub fn key_header_names(&self) -> String {
        let names: Vec<&str> = self.key_headers.iter().map(HeaderName::as_str).collect();
        names.join("` or `")
    }
}

/// Whether a retry may take over an unresolved key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Re-execute with the same derived key (asking the recovery probe first if one is
    /// configured): for providers that deduplicate on it.
    Execute,
    /// Never execute twice: the retry gets `outcome-unknown`, and the key waits for an
    /// operator (`/admin/keys/…`): for providers that cannot deduplicate.
    Never,
}

/// What to do with a key whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguous {
    /// Keep it in progress: after the lease a retry re-executes with the same derived key.
    Keep,
    /// Store the failure as the final answer: retries replay it.
    Store,
    /// Release it: the next retry executes afresh.
    Release,
}

/// A request that asks the upstream whether the operation carrying a derived key already
/// happened. `{key}` in the path is replaced by the percent-encoded derived key, which is
/// also sent in the upstream key header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryProbe {
    pub method: Method,
    pub path: String,
    /// Statuses meaning "it happened": this answer is stored instead of executing again.
    pub found: Vec<u16>,
    /// Statuses meaning "it did not happen": execute.
    pub not_found: Vec<u16>,
}
