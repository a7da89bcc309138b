//! The thread group commit's batches and their connections run on.
//!
//! Why: under load one batch runs at a time, and the next is sent only once the proxy has
//! read the last one's answer, so the time between the two is time the database idles.
//! On a server thread that answer waited behind every request task ready before it (a
//! current-thread runtime looks at its sockets between tasks), and the thread itself
//! waited for a core behind the other processes: measured (64 connections, 2 cores), the
//! batch backend sat idle ~40 % of the time while a quarter of the machine did nothing.
//! A thread that does nothing else is woken by the kernel when the answer arrives and
//! sends the next batch at once (bench/RESULTS.md, 2026-12-04).
//!
//! Only batches: a call from a request's own task (a lone write on an idle proxy, a read)
//! keeps to connections of the server threads, since each hop between threads is a
//! wake-up that an idle proxy's latency would pay twice per call. The embedded store's
//! batches stay on the server threads too: measured there, no gain.
//!
//! One thread for the process, started on first use, whatever the number of stores: a
//! batch's I/O is a few microseconds per write, and the database, not this thread, is
//! what one batch at a time waits for.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

/// Runs `task` on the store's thread (on the caller's runtime if that thread could not
/// be started). Connections opened inside it are driven there too: a socket is served by
/// the runtime it was opened on.
pub(super) fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match handle() {
        Some(handle) => drop(handle.spawn(task)),
        None => drop(tokio::spawn(task)),
    }
}

/// Whether the caller runs on the store's thread (a batch's task does).
pub(super) fn is_current() -> bool {
    match (Handle::try_current(), HANDLE.get()) {
        (Ok(current), Some(Some(store))) => current.id() == store.id(),
        _ => false,
    }
}

/// The store thread's runtime, once started (`None` inside: it could not be).
static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();

fn handle() -> Option<&'static Handle> {
    HANDLE.get_or_init(start).as_ref()
}

/// The thread and its runtime, which run until the process ends. The runtime is built on
/// the thread itself: one dropped on a server thread (were the thread refused) would
/// panic there.
fn start() -> Option<Handle> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let started = std::thread::Builder::new()
        .name("idemproxy-store".into())
        .spawn(
            move || match Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => {
                    let _ = tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(std::future::pending::<()>());
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            },
        );
    let built = match started {
        Ok(_) => rx
            .recv()
            .map_err(std::io::Error::other)
            .and_then(|built| built),
        Err(e) => Err(e),
    };
    built
        .inspect_err(|e| {
            tracing::warn!(cause = %e, "no thread for the store; its connections run on the server threads");
        })
        .ok()
}
