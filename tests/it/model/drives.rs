//! The model drives the real stores: random sequences of the table's operations —
//! reserve (with and without takeover), renew, complete, release, a lease running out, an
//! eviction — run against PostgreSQL and the embedded store, and each answer compared with
//! [`super::store::Table`]'s. A change to the SQL that departs from the table the protocol
//! was checked against fails here.
//!
//! The model's clock is the lease's: a "lease runs out" step sleeps past a real lease of
//! `LEASE`; every other step must take well under it. On a machine so loaded that one did
//! not, the sequence stops there (its steps so far compared), rather than guess.

use std::time::{Duration, Instant};

use bytes::Bytes;
use idemproxy::store::{
    AnyStore, Completion, Fence, Fenced, Inspect, KeyStore, Reservation, ReserveRequest,
    StoredResponse,
};
use proptest::prelude::*;

use super::store::{Mutant, Reserved, Table};
use crate::support::*;

/// The real lease, and the model's (in ticks).
const LEASE: Duration = Duration::from_millis(400);
const MODEL_LEASE: u8 = 3;
/// A step taking longer than this leaves the outcome of the next one to timing.
const SLOW: Duration = Duration::from_millis(250);
const FP: [u8; 32] = [7; 32];

/// One operation of the table, by one of two workers.
#[derive(Clone, Copy, Debug)]
enum Op {
    Reserve { worker: usize, takeover: bool },
    Renew { worker: usize },
    Complete { worker: usize },
    Release { worker: usize },
    LeaseRunsOut,
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<bool>()).prop_map(|(worker, takeover)| Op::Reserve { worker, takeover }),
        2 => (0..2usize).prop_map(|worker| Op::Renew { worker }),
        3 => (0..2usize).prop_map(|worker| Op::Complete { worker }),
        1 => (0..2usize).prop_map(|worker| Op::Release { worker }),
        1 => Just(Op::LeaseRunsOut),
        1 => Just(Op::Evict),
    ]
}

fn request(takeover: bool) -> ReserveRequest<'static> {
    ReserveRequest {
        client_id: "model",
        key: "k",
        fingerprint: &FP,
        route: "route",
        lease: LEASE,
        retention: Duration::from_secs(3600),
        takeover,
        derived_key: None,
    }
}

fn fence(token: i64) -> Fence {
    Fence {
        client_id: "model".into(),
        key: "k".into(),
        token,
        notify: false,
        retention: Duration::from_secs(3600),
    }
}

fn answer(n: u8) -> StoredResponse {
    StoredResponse::clear(201, Bytes::new(), Bytes::from(format!("answer-{n}")))
}

/// What each worker holds: the model's token and the store's.
#[derive(Clone, Copy, Default)]
struct Held {
    model: u8,
    real: i64,
}

/// Runs `ops` against `store` and the model side by side; the first difference fails.
async fn run(store: &AnyStore, ops: &[Op], mutant: Option<Mutant>) -> Result<(), String> {
    let mut table = Table::new(mutant);
    let mut workers = [None::<Held>; 2];
    let mut answers = 0u8;
    let mut since = Instant::now();
    for (i, &op) in ops.iter().enumerate() {
        if since.elapsed() > SLOW {
            return Ok(()); // too slow to tell a live lease from one run out
        }
        let at = format!("step {i} ({op:?}) of {ops:?}");
        match op {
            Op::Reserve { worker, takeover } => {
                let want = table.reserve(MODEL_LEASE, takeover);
                let got = store
                    .reserve(&request(takeover))
                    .await
                    .map_err(|e| format!("{at}: {e}"))?;
                match (want, got) {
                    (Reserved::Granted { token, takeover: t }, Reservation::Reserved(lease))
                        if lease.takeover == t =>
                    {
                        workers[worker] = Some(Held {
                            model: token,
                            real: lease.token,
                        });
                        since = Instant::now();
                    }
                    (Reserved::InProgress, Reservation::InProgress { .. })
                    | (Reserved::Unresolved, Reservation::Unresolved { .. }) => {}
                    (Reserved::Done { answer: n }, Reservation::Done(stored))
                        if stored.body == format!("answer-{n}") => {}
                    (want, got) => return Err(format!("{at}: model {want:?}, store {got:?}")),
                }
            }
            Op::Renew { worker } | Op::Complete { worker } | Op::Release { worker } => {
                let Some(held) = workers[worker] else {
                    continue;
                };
                let (want, got) = match op {
                    Op::Renew { .. } => (
                        table.renew(held.model, MODEL_LEASE),
                        store.renew(&fence(held.real), LEASE).await,
                    ),
                    Op::Complete { .. } => {
                        answers += 1;
                        (
                            table.complete(held.model, answers),
                            store
                                .complete(&fence(held.real), &Completion::Stored(answer(answers)))
                                .await,
                        )
                    }
                    _ => (
                        table.release(held.model),
                        store.release(&fence(held.real)).await,
                    ),
                };
                let got = got.map_err(|e| format!("{at}: {e}"))?;
                if want != (got == Fenced::Applied) {
                    return Err(format!("{at}: model {want}, store {got:?}"));
                }
                if want && matches!(op, Op::Renew { .. }) {
                    since = Instant::now();
                }
            }
            Op::LeaseRunsOut => {
                tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
                table.now += MODEL_LEASE;
                since = Instant::now();
            }
            Op::Evict => {
                let gone = store
                    .evict("model", "k")
                    .await
                    .map_err(|e| format!("{at}: {e}"))?;
                let had = table.row != super::store::Row::Absent;
                table.row = super::store::Row::Absent;
                if gone != had {
                    return Err(format!("{at}: model had a row: {had}, store: {gone}"));
                }
            }
        }
    }
    Ok(())
}

/// Sequences a case: `IDEMPROXY_MODEL_CASES` (default 10) per store.
fn cases() -> u32 {
    std::env::var("IDEMPROXY_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

fn drive(postgres: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in prop::collection::vec(op(), 4..14))| {
        let result = rt.block_on(async {
            let db = if postgres {
                Backend::postgres().await
            } else {
                Backend::embedded()
            };
            run(&db.store(), &ops, None).await
        });
        prop_assert!(result.is_ok(), "{}", result.err().unwrap_or_default());
    });
}

/// The model against PostgreSQL.
#[test]
fn postgres_follows_the_model() {
    drive(true);
}

/// The model against the embedded store.
#[test]
fn embedded_follows_the_model() {
    drive(false);
}

/// The store's row agrees with the model after a takeover: a quick look that the lookup
/// speaks of the same token the model handed out (the sequences above compare answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_hands_out_a_new_token() {
    let db = Backend::embedded();
    let store = db.store();
    let Reservation::Reserved(first) = store.reserve(&request(true)).await.unwrap() else {
        panic!("reserved");
    };
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let Reservation::Reserved(second) = store.reserve(&request(true)).await.unwrap() else {
        panic!("taken over");
    };
    assert!(second.takeover && second.token > first.token);
    let row = store.lookup("model", "k").await.unwrap().unwrap();
    assert_eq!(row.lease_token, second.token);
}

/// The comparison has teeth: a table with a protocol bug planted disagrees with both real
/// stores on a sequence that exercises it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutated_model_disagrees_with_the_stores() {
    let stale_completion = [
        Op::Reserve {
            worker: 0,
            takeover: true,
        },
        Op::LeaseRunsOut,
        Op::Reserve {
            worker: 1,
            takeover: true,
        },
        Op::Complete { worker: 0 },
    ];
    let early_takeover = [
        Op::Reserve {
            worker: 0,
            takeover: true,
        },
        Op::Reserve {
            worker: 1,
            takeover: true,
        },
    ];
    for db in [Backend::postgres().await, Backend::embedded()] {
        let store = db.store();
        run(&store, &stale_completion, None)
            .await
            .expect("the model as it is");
        let fresh = if matches!(db, Backend::Postgres(_)) {
            Backend::postgres().await
        } else {
            Backend::embedded()
        };
        let mutated = run(
            &fresh.store(),
            &stale_completion,
            Some(Mutant::NoFenceOnCompletion),
        )
        .await;
        assert!(mutated.is_err(), "no fence on completion went unnoticed");
        let again = if matches!(db, Backend::Postgres(_)) {
            Backend::postgres().await
        } else {
            Backend::embedded()
        };
        let mutated = run(
            &again.store(),
            &early_takeover,
            Some(Mutant::TakeoverBeforeExpiry),
        )
        .await;
        assert!(mutated.is_err(), "a takeover before expiry went unnoticed");
    }
}
