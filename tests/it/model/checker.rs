//! An exhaustive, bounded check of the protocol model: every reachable state, breadth
//! first, each checked for the invariants the steps record; a broken one is reported with
//! the shortest trace of actions that leads to it. Written here rather than taken from a
//! crate (stateright was the candidate) because the model is small and the checker is
//! ~100 lines: no dependency to build, and the trace speaks the model's own actions.

use std::collections::{HashMap, VecDeque};

use super::protocol::{Action, Params, State};

/// What a check found.
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    /// The first broken invariant and the trace to it.
    pub violation: Option<(&'static str, Vec<Action>)>,
    /// The fault sets under which the key executed twice (each a bit set of
    /// `protocol::{CRASH, PAUSE, OUTAGE, UNKNOWN_CALL, AMBIGUOUS_WRITE}`): what the
    /// upstream's deduplication by the derived key is needed for.
    pub double_execution_faults: Vec<u8>,
    /// States from which no state at rest can be reached (well before the horizon):
    /// retries that would never end.
    pub stuck: usize,
}

/// Explores every state reachable from the initial one under `p`.
pub fn check(p: &Params) -> Report {
    let initial = State::initial(p);
    let mut index: HashMap<State, usize> = HashMap::new();
    let mut states: Vec<State> = Vec::new();
    let mut parent: Vec<Option<(usize, Action)>> = Vec::new();
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut queue = VecDeque::new();
    index.insert(initial.clone(), 0);
    states.push(initial);
    parent.push(None);
    queue.push_back(0);
    let mut doubles: Vec<u8> = Vec::new();
    while let Some(at) = queue.pop_front() {
        let state = states[at].clone();
        if let Some(name) = state.violation {
            return Report {
                states: states.len(),
                transitions: edges.len(),
                violation: Some((name, trace(&parent, at))),
                double_execution_faults: doubles,
                stuck: 0,
            };
        }
        if state.executions_now > 1 && !doubles.contains(&state.fault_kinds) {
            doubles.push(state.fault_kinds);
        }
        for action in state.actions(p) {
            let next = state.step(p, action);
            let to = match index.get(&next) {
                Some(&to) => to,
                None => {
                    let to = states.len();
                    index.insert(next.clone(), to);
                    states.push(next);
                    parent.push(Some((at, action)));
                    queue.push_back(to);
                    to
                }
            };
            edges.push((at, to));
        }
    }
    let stuck = unable_to_rest(p, &states, &edges);
    doubles.sort_unstable();
    Report {
        states: states.len(),
        transitions: edges.len(),
        violation: None,
        double_execution_faults: doubles,
        stuck,
    }
}

/// The actions from the initial state to state `at`.
fn trace(parent: &[Option<(usize, Action)>], mut at: usize) -> Vec<Action> {
    let mut actions = Vec::new();
    while let Some((from, action)) = parent[at] {
        actions.push(action);
        at = from;
    }
    actions.reverse();
    actions
}

/// How many states, early enough that every lease can still run out before the horizon,
/// cannot reach a state at rest: under fair scheduling every retry ends with an answer or
/// a documented final status.
fn unable_to_rest(p: &Params, states: &[State], edges: &[(usize, usize)]) -> usize {
    let mut back: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for &(from, to) in edges {
        back[to].push(from);
    }
    let mut can = vec![false; states.len()];
    let mut queue: VecDeque<usize> = (0..states.len()).filter(|&i| states[i].at_rest()).collect();
    for &i in &queue {
        can[i] = true;
    }
    while let Some(i) = queue.pop_front() {
        for &j in &back[i] {
            if !can[j] {
                can[j] = true;
                queue.push_back(j);
            }
        }
    }
    let early = p.horizon.saturating_sub(p.lease + p.renew_every + 2);
    (0..states.len())
        .filter(|&i| !can[i] && states[i].table.now <= early)
        .count()
}

/// A trace, one action a line, for a failing test's message.
pub fn show(trace: &[Action]) -> String {
    trace
        .iter()
        .enumerate()
        .map(|(i, a)| format!("  {:>2}. {a:?}", i + 1))
        .collect::<Vec<_>>()
        .join("\n")
}
