//! idemproxy: an HTTP reverse proxy that enforces `Idempotency-Key` semantics in front of
//! any backend, so that a client's retry can never execute an operation twice.
//!
//! A protected request's `(client_id, key)` is reserved in the store *before* it is
//! forwarded (a unique index picks the winner among concurrent duplicates), held with a
//! renewed lease, forwarded with a derived `client_id:key` header, and its answer — errors
//! included — is stored under a fencing token and replayed to every retry.
//!
//! # Layout
//! - [`config`]: YAML file → validated [`config::Config`]; the only module that knows files.
//! - [`path`]: the one normalised spelling of a request path; [`route`]: path patterns and
//!   the route table.
//! - [`fingerprint`] and [`canonical`]: what makes two requests the same operation.
//! - [`store`]: the key table ([`store::KeyStore`]) and its PostgreSQL implementation.
//! - [`proxy`]: the request path — pass-through, protection, detached execution.
//! - [`problem`]: every error the proxy answers itself, as RFC 9457 problem+json.
//! - [`server`]: accept loop, the client connections' HTTP/1 and graceful drain;
//!   [`shutdown`]: the stop signal.
//! - [`http1`]: HTTP/1.1 on the wire (transport, bodies, messages) and the upstream
//!   connection.
//! - [`admin`]: health, readiness, metrics and the key admin API on the admin listener.
//! - [`metrics`]: the Prometheus registry; [`otlp`]: traces by OTLP; [`sweep`]: retention;
//!   [`rekey`]: stored answers moved to the active encryption key.
//! - [`tls`]: rustls configurations for HTTPS upstreams and the TLS listener.
//! - [`vault`]: the key ring that seals stored answers at rest (`encryption:`);
//!   [`key_form`]: idempotency keys stored as keyed hashes (`encryption.hash_keys`).
//! - [`demo`]: the seed article's story, runnable (`idemproxy demo`, `idemproxy demo-provider`).

pub mod admin;
pub mod background;
pub mod body;
pub mod canonical;
pub mod config;
pub mod demo;
pub mod fingerprint;
pub mod http1;
pub mod key;
pub mod metrics;
pub mod otlp;
pub mod path;
pub mod problem;
pub mod proxy;
pub mod route;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod stored;
pub mod tls;
pub mod vault;
