//! The sizes the memory figures depend on, guarded: each future below is held once per
//! connection or per request waiting on the store, so its size times a thousand
//! connections is what `bench/run`'s "RSS at 1,000 keyed connections" measures. The
//! `Box::pin`s along the request path keep them small; a refactor that unboxes a stage (or
//! keeps a large local alive across an `.await`) fails here instead of showing up weeks
//! later as a slower, larger proxy. Budgets are today's sizes plus a little room: raise one
//! only with a measurement that says the memory is worth it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::oneshot;

use super::admission::Admission;
use super::machine::{Job, run};
use super::state::Proxy;
use crate::config::{Overrides, load_str};
use crate::store::{AnyStore, EmbeddedStore};

fn proxy() -> (Proxy<AnyStore>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "idemproxy-sizes-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::create_dir_all(&dir);
    let config = load_str(
        "upstream:\n  url: http://127.0.0.1:9\nclient_id:\n  header: X-Client-Id\nroutes:\n  - name: pay\n    methods: [POST]\n    path: /payments\n",
        &Overrides::default(),
    )
    .expect("valid");
    let store = EmbeddedStore::open(&dir.join("keys.db"), std::time::Duration::from_secs(1))
        .expect("store");
    (Proxy::new(Arc::new(config), AnyStore::Embedded(store)), dir)
}

fn job(proxy: &Proxy<AnyStore>) -> Job {
    let route = Arc::clone(&proxy.routes().routes()[0]);
    let (parts, ()) = http::Request::post("/payments")
        .body(())
        .expect("request")
        .into_parts();
    Job {
        route,
        client_id: crate::key::ClientId::new("c".into()),
        key: crate::key::StoredKey::new("k".into()),
        clear_key: None,
        client_key: None,
        derived_key: None,
        fingerprint: [0; 32],
        parts,
        body: Bytes::new(),
        peer: SocketAddr::from(([127, 0, 0, 1], 1)),
        trace: None,
    }
}

/// Every request's future: held by its connection for as long as the request waits on
/// the store and the upstream. Protects "RSS at 1,000 keyed connections" (23–26 MiB in
/// `bench/RESULTS.md`, 2026-12-05).
#[tokio::test]
async fn a_request_waiting_is_small() {
    let (proxy, dir) = proxy();
    let req = http::Request::post("/payments")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let fut = proxy.handle(req, SocketAddr::from(([127, 0, 0, 1], 1)));
    let size = std::mem::size_of_val(&fut);
    // 1,024 bytes when this test was written.
    assert!(
        size <= 1152,
        "a request's future is {size} bytes (budget 1,152)"
    );
    drop(fut);
    let _ = std::fs::remove_dir_all(dir);
}

/// A client connection's future (the proxy's own HTTP/1), held by every open connection,
/// idle or not. Protects the same figure: 2,040 → 1,583 bytes when the refusal of a
/// malformed head was boxed (`bench/RESULTS.md`, 2026-12-05).
#[tokio::test]
async fn a_connection_is_small() {
    let (proxy, dir) = proxy();
    let (io, _other) = tokio::io::duplex(64);
    let draining = tokio_util::sync::CancellationToken::new();
    let limits = crate::http1::server::Limits {
        head_timeout: std::time::Duration::from_secs(1),
        max_head: 8192,
    };
    let fut = crate::http1::server::serve_connection(
        io,
        &proxy,
        SocketAddr::from(([127, 0, 0, 1], 1)),
        limits,
        &draining,
    );
    let size = std::mem::size_of_val(&fut);
    // 1,568 bytes when this test was written.
    assert!(
        size <= 1664,
        "a connection's future is {size} bytes (budget 1,664)"
    );
    drop(fut);
    let _ = std::fs::remove_dir_all(dir);
}

/// The detached execution (reservation to stored answer), one per protected request in
/// flight — and, bounded by `limits.detached`, what an abusive client can make the proxy
/// hold. Its stages are boxed so that a duplicate waiting on a reservation costs this,
/// not the whole state machine.
#[tokio::test]
async fn a_detached_execution_is_small() {
    let (proxy, dir) = proxy();
    let admission = Arc::new(Admission::new(
        proxy.config().limits.detached,
        Arc::clone(proxy.metrics()),
    ));
    let admitted = admission.admit("c", None).expect("a slot");
    let (tx, _rx) = oneshot::channel();
    let fut = run(
        Arc::clone(&proxy.shared),
        Box::new(job(&proxy)),
        admitted,
        tx,
    );
    let size = std::mem::size_of_val(&fut);
    // 272 bytes when this test was written.
    assert!(
        size <= 320,
        "a detached execution's future is {size} bytes (budget 320)"
    );
    drop(fut);
    let _ = std::fs::remove_dir_all(dir);
}

/// What a request hands the detached task: moved into a box, so its size is the request's
/// own cost while it waits (headers and body are held elsewhere).
#[test]
fn a_job_is_small() {
    let size = std::mem::size_of::<Job>();
    // 456 bytes when this test was written.
    assert!(size <= 512, "a job is {size} bytes (budget 512)");
}
