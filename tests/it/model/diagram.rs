//! The life of a key as the model has it, drawn from the model: every reachable state is
//! projected onto its row (absent, in progress with a live lease, unresolved, done), and
//! every transition that changes the row becomes an arrow named for what did it. The
//! diagram in `docs/internals.md` is this output; the test fails when they differ, so the
//! docs cannot drift from the model (`IDEMPROXY_WRITE_DIAGRAM=1` rewrites the docs' copy).

use std::collections::{BTreeSet, HashSet, VecDeque};

use super::protocol::{Action, Params, State, Work};
use super::store::Row;

const BEGIN: &str = "<!-- generated from the model: tests/it/model/diagram.rs -->";
const END: &str = "<!-- end of the generated diagram -->";

fn class(s: &State) -> &'static str {
    match s.table.row {
        Row::Absent => "absent",
        Row::Done { .. } => "done",
        Row::InProgress { .. } if s.table.unresolved() => "unresolved",
        Row::InProgress { .. } => "in_progress",
    }
}

/// What moved the row, in the docs' words.
fn label(before: &State, action: Action, after: &State) -> &'static str {
    match action {
        Action::Arrive(_) if class(before) == "unresolved" => {
            "retry takes over (takeover: execute)"
        }
        Action::Arrive(_) if class(before) == "absent" && class(after) == "done" => {
            "retry stores the answer its process holds"
        }
        Action::Arrive(_) => "request reserves",
        Action::Write(i) | Action::WriteCommittedButTimedOut(i) => {
            match before.workers[i as usize].work {
                Work::Releasing => "release (nothing was sent)",
                _ => "complete (fenced by the token)",
            }
        }
        Action::Tick => "lease runs out (no renewal)",
        Action::Renew(_) => "renewal",
        Action::Sweep => "sweep after retention",
        Action::Evict => "operator evicts",
        Action::Reconcile if class(after) == "done" => "reconciler: probe found it",
        Action::Reconcile => "reconciler: probe did not",
        _ => "other",
    }
}

/// The diagram, as Mermaid, for both takeover policies.
fn generate() -> String {
    let mut edges: BTreeSet<(&'static str, &'static str, &'static str)> = BTreeSet::new();
    for takeover in [true, false] {
        let p = Params {
            horizon: 4,
            max_faults: 1,
            ..Params::ci(takeover)
        };
        let start = State::initial(&p);
        let mut seen: HashSet<State> = HashSet::from([start.clone()]);
        let mut queue = VecDeque::from([start]);
        while let Some(state) = queue.pop_front() {
            for action in state.actions(&p) {
                let next = state.step(&p, action);
                if class(&state) != class(&next) {
                    edges.insert((class(&state), class(&next), label(&state, action, &next)));
                }
                if seen.insert(next.clone()) {
                    queue.push_back(next);
                }
            }
        }
    }
    let mut out = String::from("```mermaid\nstateDiagram-v2\n    [*] --> absent\n");
    for (from, to, what) in edges {
        out.push_str(&format!("    {from} --> {to}: {what}\n"));
    }
    out.push_str("```\n");
    out
}

/// The diagram in the docs is the model's.
#[test]
fn the_docs_draw_the_models_state_diagram() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/internals.md");
    let docs = std::fs::read_to_string(&path).expect("docs/internals.md");
    let diagram = generate();
    let (Some(begin), Some(end)) = (docs.find(BEGIN), docs.find(END)) else {
        panic!("docs/internals.md has no generated diagram between {BEGIN} and {END}");
    };
    let current = &docs[begin + BEGIN.len()..end];
    let wanted = format!("\n{diagram}");
    if current != wanted {
        if std::env::var_os("IDEMPROXY_WRITE_DIAGRAM").is_some() {
            let updated = format!("{}{BEGIN}{wanted}{}", &docs[..begin], &docs[end..]);
            std::fs::write(&path, updated).expect("write docs/internals.md");
            return;
        }
        panic!(
            "docs/internals.md's diagram is not the model's; run with IDEMPROXY_WRITE_DIAGRAM=1. The model's:\n{diagram}"
        );
    }
}
