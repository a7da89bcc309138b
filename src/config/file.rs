//! The YAML file as written: every field optional, unknown keys rejected.
//!
//! This layer only describes shape; meaning and defaults are applied when it is turned
//! into a [`super::Config`], so that one place names the offending key for every error.

use serde::Deserialize;

use super::units::{HumanDuration, HumanSize};

/// The whole configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub upstream: Option<FileUpstream>,
    pub store: Option<FileStore>,
    pub client_id: Option<FileClientId>,
    pub defaults: Option<FilePolicy>,
    pub routes: Option<Vec<FileRoute>>,
    pub shutdown_grace: Option<HumanDuration>,
    pub admin_token: Option<String>,
    pub admin_tokens: Option<Vec<FileAdminToken>>,
    pub sweep: Option<FileSweep>,
    pub reconcile: Option<FileReconcile>,
    pub limits: Option<FileLimits>,
    pub tls: Option<FileListenerTls>,
    pub tracing: Option<FileTracing>,
    pub encryption: Option<FileEncryption>,
}

/// One of `admin_tokens:` — an operator's token, by the SHA-256 of its value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdminToken {
    pub name: String,
    pub sha256: String,
}

/// `encryption:` — the key ring that seals stored answers; off when absent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEncryption {
    /// Key id → where its bytes are. A sorted map: ids are unique, and the parser names a
    /// duplicate.
    pub keys: Option<std::collections::BTreeMap<String, FileSecretSpec>>,
    pub active: Option<String>,
    /// Idempotency keys stored as keyed hashes under `hash_key`.
    pub hash_keys: Option<bool>,
    pub hash_key: Option<FileSecretSpec>,
}

/// Where a secret is read from: `{ env: NAME }` or `{ file: PATH }`; a bare word is the
/// secret written in the file, which is refused.
pub type FileSecretSpec = WordOr<FileSecret>;

/// The mapping form of a secret's source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSecret {
    pub env: Option<String>,
    pub file: Option<String>,
}

impl Shape for FileSecret {
    const EXPECTING: &'static str = "`{ env: NAME }` or `{ file: PATH }`";
}

/// `tracing:` — export spans by OTLP; off when absent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTracing {
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
}

/// `limits:` — what a slow or hostile client may cost.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    pub max_connections: Option<usize>,
    pub header_read_timeout: Option<HumanDuration>,
    pub body_read_timeout: Option<HumanDuration>,
    pub max_header_bytes: Option<HumanSize>,
    pub detached: Option<FileDetached>,
    pub http2_idle_timeout: Option<HumanDuration>,
    pub http2_ping_interval: Option<HumanDuration>,
    pub http2_ping_timeout: Option<HumanDuration>,
    pub http2_max_streams: Option<usize>,
    pub send_timeout: Option<HumanDuration>,
}

/// `limits.detached:` — bounds on work the proxy owns past its client.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDetached {
    pub max: Option<usize>,
    pub per_client: Option<usize>,
    pub per_connection: Option<usize>,
}

/// `sweep:` — the background retention sweep.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSweep {
    pub interval: Option<HumanDuration>,
    pub batch: Option<i64>,
    /// How long an unresolved key is kept after its lease ran out; absent: until resolved.
    pub unresolved_retention: Option<HumanDuration>,
}

/// `reconcile:` — the background reconciler of unresolved keys; off when absent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileReconcile {
    pub interval: Option<HumanDuration>,
    pub batch: Option<i64>,
}

/// `upstream:`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstream {
    pub url: Option<String>,
    pub connect_timeout: Option<HumanDuration>,
    pub timeout: Option<HumanDuration>,
    pub max_connections: Option<usize>,
    pub tls: Option<FileUpstreamTls>,
}

/// `upstream.tls:` — trust and identity towards an HTTPS upstream.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstreamTls {
    pub roots: Option<String>,
    pub ca_file: Option<String>,
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
}

/// `tls:` — terminate TLS on the listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileListenerTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

/// `store:` — exactly one of the two backends.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStore {
    pub postgres: Option<FilePostgres>,
    pub embedded: Option<FileEmbedded>,
    /// Bytes of completed answers kept in memory for replays; `0` turns it off.
    pub replay_cache: Option<HumanSize>,
}

/// `store.postgres:`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePostgres {
    pub url: Option<String>,
    /// A direct connection for `LISTEN`, when `url` goes through a transaction pooler.
    pub listen_url: Option<String>,
    pub pool_size: Option<usize>,
    pub connect_timeout: Option<HumanDuration>,
    pub timeout: Option<HumanDuration>,
    /// libpq's TLS parameters; also accepted in `url`, where they must agree.
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
}

/// `store.embedded:`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEmbedded {
    pub path: Option<String>,
    pub timeout: Option<HumanDuration>,
}

/// `client_id:` — exactly one source.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientId {
    pub header: Option<String>,
    pub authorization: Option<String>,
    pub credentials: Option<FileCredentials>,
    pub jwt: Option<FileJwt>,
    #[serde(rename = "static")]
    pub static_name: Option<String>,
}

/// `client_id: { jwt: { claim, keys: { file: jwks.json }, issuer, audience, leeway } }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileJwt {
    pub claim: Option<String>,
    pub keys: Option<FileSecretSpec>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Option<HumanDuration>,
}

/// `client_id: { credentials: { header, tenants: { name: [sha256:…] }, unlisted } }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCredentials {
    pub header: Option<String>,
    pub tenants: Option<std::collections::BTreeMap<String, Vec<String>>>,
    pub unlisted: Option<String>,
}

/// `on_conflict: reject` or `on_conflict: { wait: 5s }`.
pub type FileOnConflict = WordOr<FileWait>;

/// The `{ wait: 5s }` form of `on_conflict`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWait {
    pub wait: HumanDuration,
}

/// `errors: problem` (or a preset's name: `stripe`, `square`, …), or
/// `errors: { preset: square, outcomes: {…} }`, or
/// `errors: { template: '…', content_type: …, outcomes: {…} }`.
pub type FileErrors = WordOr<FileErrorSpec>;

/// The mapping form of `errors`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileErrorSpec {
    pub preset: Option<String>,
    pub template: Option<String>,
    pub content_type: Option<String>,
    pub outcomes: Option<std::collections::BTreeMap<String, FileOutcome>>,
}

impl Shape for FileErrorSpec {
    const EXPECTING: &'static str = "`problem`, a preset (`stripe`, `adyen`, `paypal`, `checkout`, `square`), `{ preset: square, outcomes: { key-reused: { status: 400, code: … } } }`, or `{ template: '{\"error\": \"{code}\"}', content_type: application/json }`";
}

/// One outcome's answer in `errors.outcomes`, each part optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOutcome {
    pub status: Option<u16>,
    pub code: Option<String>,
    pub message: Option<String>,
    pub category: Option<String>,
    pub headers: Option<std::collections::BTreeMap<String, String>>,
}

/// `key_from: { body: /idempotency_key }` — a key for clients that cannot send headers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileKeyFrom {
    pub body: Option<String>,
}

/// `derived_key: plain`, `{ hash: sha256 }` or `{ max_length: 64 }`.
pub type FileDerivedKey = WordOr<FileDerivedKeySpec>;

/// The mapping form of `derived_key:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDerivedKeySpec {
    pub hash: Option<String>,
    pub max_length: Option<usize>,
}

/// `fingerprint: none` or `fingerprint: { fields: [...], headers: [...] }`.
pub type FileFingerprintSpec = WordOr<FileFingerprint>;

/// A setting written either as a word (`reject`) or as a mapping (`{ wait: 5s }`).
#[derive(Debug, Clone)]
pub enum WordOr<T> {
    Word(String),
    Spec(T),
}

/// What a [`WordOr`] setting accepts, in the words of an error message.
pub trait Shape {
    const EXPECTING: &'static str;
}

impl Shape for FileWait {
    const EXPECTING: &'static str = "`reject` or `{ wait: DURATION }` (e.g. `{ wait: 5s }`)";
}

impl Shape for FileDerivedKeySpec {
    const EXPECTING: &'static str = "`plain`, `{ hash: sha256 }` or `{ max_length: N }`";
}

impl Shape for FileFingerprint {
    const EXPECTING: &'static str = "`none` or a mapping with `fields` and/or `headers`";
}

/// By hand rather than `untagged`, so that a typo inside the mapping is reported as
/// itself (an unknown field, with its name), anything else says what the setting takes
/// (not "data did not match any variant"), and a word YAML reads as a boolean (`off`)
/// reaches the check that names the words.
impl<'de, T: Deserialize<'de> + Shape> Deserialize<'de> for WordOr<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Shape> serde::de::Visitor<'de> for Visitor<T> {
            type Value = WordOr<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(T::EXPECTING)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(WordOr::Word(v.to_owned()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(WordOr::Word(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(WordOr::Spec)
            }
        }
        d.deserialize_any(Visitor(std::marker::PhantomData))
    }
}

/// The `{ fields, headers }` form of `fingerprint:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFingerprint {
    pub fields: Option<Vec<String>>,
    pub headers: Option<Vec<String>>,
}

/// `recovery_probe:` — how to ask the upstream whether an operation already happened.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileProbe {
    pub method: Option<String>,
    pub path: Option<String>,
    pub found: Option<Vec<u16>>,
    pub not_found: Option<Vec<u16>>,
}

/// The knobs shared by `defaults:` and each route. Kept as one macro so the two lists can
/// never drift apart (serde's `flatten` cannot be combined with `deny_unknown_fields`).
macro_rules! policy_struct {
    ($(#[$meta:meta])* $name:ident { $($extra:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(pub $extra: $ty,)*
            pub key_header: Option<String>,
            pub key_headers: Option<Vec<String>>,
            pub key_from: Option<FileKeyFrom>,
            pub upstream_key: Option<FileKeyFrom>,
            pub derived_key: Option<FileDerivedKey>,
            pub key_scope: Option<String>,
            pub replayed_header: Option<String>,
            pub echo_key_header: Option<String>,
            pub upstream_key_header: Option<String>,
            pub lease: Option<HumanDuration>,
            pub retention: Option<HumanDuration>,
            pub max_body: Option<HumanSize>,
            pub max_stored_response: Option<HumanSize>,
            pub require_key: Option<bool>,
            pub on_conflict: Option<FileOnConflict>,
            pub store_headers: Option<Vec<String>>,
            pub release_on: Option<Vec<u16>>,
            pub fingerprint: Option<FileFingerprintSpec>,
            pub recovery_probe: Option<FileProbe>,
            pub on_ambiguous: Option<String>,
            pub ambiguous_statuses: Option<Vec<u16>>,
            pub takeover: Option<String>,
            pub errors: Option<FileErrors>,
            pub console_body: Option<bool>,
        }
    };
}

policy_struct!(
    /// `defaults:` — applies to every route that does not override it.
    FilePolicy {}
);

policy_struct!(
    /// One entry of `routes:`.
    FileRoute {
        name: Option<String>,
        methods: Option<Vec<String>>,
        extension_methods: Option<Vec<String>>,
        path: Option<String>,
    }
);
