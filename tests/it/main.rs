//! The integration tests, as one test binary: each module a topic, `support` what they
//! share (databases, upstreams, proxies, clients, throwaway clusters).
//!
//! Why one binary: each integration-test file is a crate of its own that links idemproxy
//! and the support code again; 33 of them made linking most of a clean CI run. nextest
//! still runs every test in a process of its own, so a test that sets something
//! process-wide affects no other.

#![allow(clippy::unwrap_used)]

mod support;

mod citus;
mod concurrency;
mod console;
mod crash;
mod dead_versions;
mod demo;
mod deployment;
mod dialects;
mod disconnect;
mod encryption;
mod failover;
mod group_commit;
mod hashed_keys;
mod hostile;
mod http1;
mod http1_differential;
mod http1_rfc;
mod http2_refusals;
mod identities;
mod key_forms;
mod kubernetes;
mod model;
mod operations;
mod outages;
mod overload;
mod paths;
mod pg_tls;
mod pgbouncer;
mod prometheus;
mod properties;
mod reconcile;
mod rejections;
mod reload;
mod replay;
mod replay_cache;
mod replicas;
mod schema;
mod sdk_apis;
mod sdk_stripe;
mod server_threads;
mod server_tuning;
mod storage_faults;
mod storage_faults_pg;
mod store_conformance;
mod tls;
mod tracing_otlp;
mod upstream_failures;
mod upstream_pool;
mod wait_probe;
