//! idemproxy: an HTTP reverse proxy that enforces `Idempotency-Key` semantics in front of
//! any backend, so that a client's retry can never execute an operation twice.
//!
//! A protected request's `(client_id, key)` is reserved in the store *before* it is
//! forwarded (a unique index picks the winner among concurrent duplicates), held with a
//! renewed lease, forwarded with a derived `client_id:key` header, and its answer — errors
//! included — is stored under a fencing token and replayed to every retry.
//!
//! # Layout
//! The top-level modules form layers, each using only those above it (CI checks there is
//! no import cycle between them, with `shared/tools/modcycles.py`):
//! - Leaves: [`body`] (the one response body type), [`key`] (a key's id, hash, derived
//!   form, and [`key::form`] — keys kept as keyed hashes), [`stored`] (a stored answer),
//!   [`path`] and [`route`] (the normalised path, route patterns), [`fingerprint`] and
//!   [`canonical`] (what makes two requests the same operation), [`http1`] (HTTP/1.1 on the
//!   wire: shared parts, [`http1::server`] for clients' connections, [`http1::client`] for
//!   the upstream's), [`tls`], [`vault`] (the key ring that seals stored answers),
//!   [`shutdown`].
//! - [`config`]: YAML file → validated [`config::Config`] with its
//!   [`config::RouteTable`]; the only module that knows files.
//! - [`store`]: the key table's contract ([`store::KeyStore`], group commit, the replay
//!   cache) and its two backends, each in a folder of its own (`store/postgres/`,
//!   `store/embedded/`); [`metrics`] and [`otlp`]: what the proxy reports.
//! - [`problem`]: every error the proxy answers itself, as RFC 9457 problem+json, from one
//!   table.
//! - [`upstream`]: the upstream client — the connection pool, forwarding headers.
//! - [`proxy`]: the request path — pass-through, protection, the key state machine
//!   (`proxy/machine.rs`).
//! - [`background`]: the sweep, the reconciler's and the gauge's loops, rekey — started
//!   together by [`background::Background::start`].
//! - [`app`]: the composition root — opening the store for a serving process, and a proxy
//!   with its admin listener and background
//!   loops, started the same way by the binary and the tests.
//! - [`server`]: accept loops, protocol sniffing and graceful drain; [`admin`]: health,
//!   readiness, metrics and the key admin API; [`demo`]: the seed article's story,
//!   runnable (`idemproxy demo`, `idemproxy demo-provider`).
//! - The binary (`src/bin/idemproxy/`): the command line, `serve`, reloads, one-shot
//!   commands.

pub mod admin;
pub mod app;
pub mod background;
pub mod body;
pub mod canonical;
pub mod clock;
pub mod config;
pub mod demo;
pub mod dialect;
pub mod fingerprint;
pub mod http1;
pub mod jwt;
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
pub mod upstream;
pub mod vault;
