//! The key protocol, model-checked (issue 52): a model of DESIGN.md's protocol
//! ([`protocol`], over the table of [`store`]), checked exhaustively within bounds
//! ([`checker`]) for named invariants, with deliberate protocol bugs (mutants) that the
//! check must catch; the same table drives the real stores ([`drives`]); and the state
//! diagram in `docs/internals.md` is generated from the model ([`diagram`]).
//!
//! `IDEMPROXY_MODEL_DEEP=1` checks deeper bounds (a longer clock, more faults, a third
//! process); `IDEMPROXY_MODEL_CASES=N` runs N sequences per store in the model-based tests.

mod checker;
mod diagram;
mod drives;
mod protocol;
mod store;

use checker::{check, show};
use protocol::{AMBIGUOUS_WRITE, CRASH, EVICTION, OUTAGE, PAUSE, Params, UNKNOWN_CALL};
use store::Mutant;

/// The bounds: CI's, or deeper when `IDEMPROXY_MODEL_DEEP` is set; `IDEMPROXY_MODEL_HORIZON`
/// and `IDEMPROXY_MODEL_FAULTS` override the clock's bound and the faults'.
fn bounds(takeover: bool) -> Params {
    let mut p = Params::ci(takeover);
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u8>().ok());
    if let Some(h) = number("IDEMPROXY_MODEL_HORIZON") {
        p.horizon = h;
    }
    if let Some(f) = number("IDEMPROXY_MODEL_FAULTS") {
        p.max_faults = f;
    }
    if std::env::var_os("IDEMPROXY_MODEL_DEEP").is_some() {
        Params {
            horizon: p.horizon + 2,
            max_faults: p.max_faults + 1,
            ..p
        }
    } else {
        p
    }
}

fn kinds(set: u8) -> String {
    let names = [
        (CRASH, "crash"),
        (PAUSE, "pause"),
        (OUTAGE, "store outage"),
        (UNKNOWN_CALL, "unknown upstream outcome"),
        (AMBIGUOUS_WRITE, "write timed out after commit"),
        (EVICTION, "operator eviction"),
    ];
    let named: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| set & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    named.join(" + ")
}

/// Every invariant holds in every reachable state, with takeovers and without, and every
/// state can still come to rest (every retry ends with an answer or a final status).
#[test]
fn the_protocol_keeps_its_invariants() {
    for takeover in [true, false] {
        let p = bounds(takeover);
        let report = check(&p);
        if let Some((name, trace)) = &report.violation {
            panic!("takeover {takeover}: {name} broken after:\n{}", show(trace));
        }
        assert_eq!(
            report.stuck, 0,
            "takeover {takeover}: states that never come to rest"
        );
        eprintln!(
            "takeover {takeover}: {} states, {} transitions; a key executed twice only under: {}",
            report.states,
            report.transitions,
            report
                .double_execution_faults
                .iter()
                .map(|&k| kinds(k))
                .collect::<Vec<_>>()
                .join("; ")
        );
        assert!(
            report.states > 1000,
            "the model explored {} states",
            report.states
        );
    }
}

/// Which faults make a key execute twice (and so need the upstream's deduplication by
/// the derived key): with takeovers, a crash, a pause past the lease, an outage longer than
/// the lease or an unknown upstream outcome each can; with `takeover: never`, none of them
/// alone — only an operator's eviction lets the key run again.
#[test]
fn the_model_says_which_faults_need_the_upstreams_deduplication() {
    let with = check(&bounds(true));
    for alone in [CRASH, PAUSE, OUTAGE, UNKNOWN_CALL] {
        assert!(
            with.double_execution_faults.contains(&alone),
            "with takeovers, {} alone executes again: {:?}",
            kinds(alone),
            with.double_execution_faults
                .iter()
                .map(|&k| kinds(k))
                .collect::<Vec<_>>()
        );
    }
    // With `takeover: never`, a crash, an unknown outcome or a write timing out never
    // execute a key twice; a worker cut off before it sends its request — paused, or its
    // store unreachable — can: the reconciler's probe finds nothing and releases the key,
    // the next request executes, then the cut-off one sends. So can an eviction.
    let without = check(&bounds(false));
    for k in &without.double_execution_faults {
        assert!(
            k & (PAUSE | OUTAGE | EVICTION) != 0,
            "takeover never, yet executed twice under {}",
            kinds(*k)
        );
    }
    eprintln!(
        "takeover never: a key executed twice only under: {}",
        without
            .double_execution_faults
            .iter()
            .map(|&k| kinds(k))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

/// Each planted protocol bug is caught, by the invariant it breaks.
#[test]
fn mutants_are_caught() {
    let cases = [
        (
            Mutant::NoFenceOnCompletion,
            "a_fenced_off_owner_never_writes",
        ),
        (
            Mutant::RenewalIgnoresToken,
            "a_fenced_off_owner_never_writes",
        ),
        (
            Mutant::TakeoverBeforeExpiry,
            "a_live_owners_lease_never_lapses",
        ),
        (
            Mutant::SweepOfUnresolved,
            "an_unresolved_key_is_never_swept",
        ),
        (
            Mutant::RenewalSlowerThanLease,
            "a_live_owners_lease_never_lapses",
        ),
    ];
    for (mutant, invariant) in cases {
        let report = check(&Params::ci(true).with(mutant));
        let Some((name, trace)) = report.violation else {
            panic!("{mutant:?} was not caught ({} states)", report.states);
        };
        assert_eq!(name, invariant, "{mutant:?}, after:\n{}", show(&trace));
    }
}
