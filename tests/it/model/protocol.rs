//! The key protocol of DESIGN.md as a state machine: proxy workers (request handlers in
//! one or more processes), one key, the table ([`super::store::Table`], linearizable, with
//! its own clock), the upstream as a count of executions under the one derived key, and the
//! faults — a process crashes (its memory lost), a worker pauses past its lease and
//! resumes, the store goes away and comes back, a store call times out after it committed,
//! the upstream's outcome is unknown — with the client retrying at any point, the sweep,
//! the reconciler and an operator's eviction.
//!
//! Timing is the code's: a lease of `lease` ticks renewed every `renew_every` (a third of
//! it), and time cannot pass a renewal that is due: a live worker renews on time. Ghost
//! variables record what the invariants are about; a violation is recorded by the step
//! that commits it, so the checker can print the trace that led there.

use super::store::{Mutant, Reserved, Row, Table};

/// What one worker is doing with the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    Idle,
    /// Reserved; the upstream call is running.
    Calling,
    /// The upstream answered `answer`; the completion is to be written.
    Answered {
        answer: u8,
    },
    /// Nothing was sent upstream; the release is to be written.
    Releasing,
}

/// One request handler. Ordered by process first: workers of one process are
/// interchangeable, so a state keeps them sorted (one state, not one per permutation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    pub process: u8,
    pub work: Work,
    pub token: u8,
    /// When its next renewal is due (the store's clock; 255: none).
    pub renew_at: u8,
    pub paused: bool,
    /// Its ending is held in its process (the store refused it).
    pub held: bool,
    /// It could not renew on time — a store call failed (the store away) or it was paused:
    /// its lease may lapse, as documented.
    pub lapsable: bool,
}

/// Kinds of fault, as a bit set: which faults a double execution needs.
pub const CRASH: u8 = 1;
pub const PAUSE: u8 = 2;
pub const OUTAGE: u8 = 4;
pub const UNKNOWN_CALL: u8 = 8;
pub const AMBIGUOUS_WRITE: u8 = 16;
/// Not a fault: an operator's decision, documented to let the next request execute.
pub const EVICTION: u8 = 32;

/// The model's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// The process of each worker.
    pub processes: &'static [u8],
    pub lease: u8,
    pub renew_every: u8,
    /// The clock stops here: the check is bounded.
    pub horizon: u8,
    /// Faults (and operator actions) at most in one run.
    pub max_faults: u8,
    /// Upstream executions at most in one run (a key is completed, swept and asked
    /// again only so often).
    pub max_executions: u8,
    /// The route takes expired leases over (`takeover: execute`), or never.
    pub takeover: bool,
    pub mutant: Option<Mutant>,
}

impl Params {
    /// The bounded configuration CI checks exhaustively.
    pub fn ci(takeover: bool) -> Self {
        Params {
            processes: &[0, 0, 1],
            lease: 3,
            renew_every: 1,
            horizon: 6,
            max_faults: 2,
            max_executions: 3,
            takeover,
            mutant: None,
        }
    }

    pub fn with(self, mutant: Mutant) -> Self {
        let renew_every = if mutant == Mutant::RenewalSlowerThanLease {
            self.lease + 1
        } else {
            self.renew_every
        };
        Params {
            mutant: Some(mutant),
            renew_every,
            ..self
        }
    }
}

/// One state of the whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub table: Table,
    pub store_up: bool,
    pub workers: Vec<Worker>,
    /// Executions at the upstream (all under the key's one derived key), and the answers
    /// they produced, numbered 1, 2, ….
    pub executions: u8,
    /// Executions since the last eviction or sweep (after which a request is a new
    /// operation).
    pub executions_now: u8,
    pub faults: u8,
    /// Which kinds of fault happened.
    pub fault_kinds: u8,
    /// Ghost: the answer stored first since the last eviction or sweep.
    pub stored: Option<u8>,
    /// The first invariant broken, by name.
    pub violation: Option<&'static str>,
}

/// What can happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client's request — the first, or a retry — reaches an idle worker.
    Arrive(u8),
    /// The upstream answers.
    Call(u8),
    /// The upstream acted, but its answer never came (timeout, reset after sending).
    CallUnknown(u8),
    /// Nothing reached the upstream.
    CallNotSent(u8),
    /// The completion or release is written.
    Write(u8),
    /// The store takes the write but the call times out: the worker holds its ending.
    WriteCommittedButTimedOut(u8),
    Renew(u8),
    Tick,
    StoreDown,
    StoreUp,
    Crash(u8),
    Pause(u8),
    Resume(u8),
    Sweep,
    Evict,
    /// The reconciler claims an unresolved key, asks the recovery probe, and ends it as
    /// the probe says.
    Reconcile,
}

impl State {
    pub fn initial(p: &Params) -> Self {
        State {
            table: Table::new(p.mutant),
            store_up: true,
            workers: p
                .processes
                .iter()
                .map(|&process| Worker {
                    process,
                    work: Work::Idle,
                    token: 0,
                    renew_at: 255,
                    paused: false,
                    held: false,
                    lapsable: false,
                })
                .collect(),
            executions: 0,
            executions_now: 0,
            faults: 0,
            fault_kinds: 0,
            stored: None,
            violation: None,
        }
    }

    fn busy(w: &Worker) -> bool {
        w.work != Work::Idle
    }

    /// Whether no worker is busy with the key (none holds an ending, none is calling):
    /// the sweep deletes rows long past any request's life (a retention of hours against
    /// leases and a retry window of minutes), and an operator evicts a key nobody still
    /// works on (`idemproxy_held_answers` at 0, its lease long run out).
    fn nobody_works_on_it(&self) -> bool {
        self.workers.iter().all(|w| !Self::busy(w))
    }

    /// The answer a process holds for the key, if any.
    fn held_in(&self, process: u8) -> Option<u8> {
        self.workers.iter().find_map(|w| match w.work {
            Work::Answered { answer } if w.held && w.process == process => Some(answer),
            _ => None,
        })
    }

    /// Every action enabled here.
    pub fn actions(&self, p: &Params) -> Vec<Action> {
        let mut out = Vec::new();
        if self.violation.is_some() {
            return out;
        }
        let faults_left = self.faults < p.max_faults;
        let mut renewal_due = false;
        for (i, w) in self.workers.iter().enumerate() {
            let i = i as u8;
            if w.paused {
                out.push(Action::Resume(i));
                continue;
            }
            match w.work {
                Work::Idle => out.push(Action::Arrive(i)),
                Work::Calling => {
                    if self.executions < p.max_executions {
                        out.extend([Action::Call(i), Action::CallUnknown(i)]);
                    }
                    out.push(Action::CallNotSent(i));
                }
                Work::Answered { .. } | Work::Releasing => {
                    out.push(Action::Write(i));
                    if self.store_up && faults_left {
                        out.push(Action::WriteCommittedButTimedOut(i));
                    }
                }
            }
            if Self::busy(w) && w.renew_at <= self.table.now {
                renewal_due = true;
                out.push(Action::Renew(i));
            }
            if Self::busy(w) && faults_left {
                out.push(Action::Pause(i));
            }
        }
        // Timers fire before time passes: a due renewal is made on time.
        if !renewal_due && self.table.now < p.horizon {
            out.push(Action::Tick);
        }
        if faults_left {
            if self.store_up {
                out.push(Action::StoreDown);
            }
            let mut seen = Vec::new();
            for w in &self.workers {
                if !seen.contains(&w.process) {
                    seen.push(w.process);
                    out.push(Action::Crash(w.process));
                }
            }
            // An operator evicts a stuck key — completed, or unresolved — that nobody works
            // on any more; evicting a key in flight is outside what the protocol promises.
            let stuck = matches!(self.table.row, Row::Done { .. }) || self.table.unresolved();
            if self.store_up && stuck && self.nobody_works_on_it() {
                out.push(Action::Evict);
            }
        }
        if !self.store_up {
            out.push(Action::StoreUp);
        }
        if self.store_up {
            if self.nobody_works_on_it()
                && (matches!(self.table.row, Row::Done { .. })
                    || (self.table.unresolved() && p.mutant == Some(Mutant::SweepOfUnresolved)))
            {
                out.push(Action::Sweep);
            }
            if self.table.unresolved() {
                out.push(Action::Reconcile);
            }
        }
        out
    }

    fn violate(&mut self, invariant: &'static str) {
        if self.violation.is_none() {
            self.violation = Some(invariant);
        }
    }

    /// A client gets `answer` as the key's answer (replayed or held): once an answer is
    /// stored, it must be that one — unless the key executed twice, which only the
    /// upstream's deduplication by the derived key makes one operation (with it, the
    /// provider answers the second execution with the first one's answer); the model lists
    /// the faults that lead there.
    fn answered(&mut self, answer: u8) {
        if self.stored.is_some_and(|s| s != answer) && self.executions_now <= 1 {
            self.violate("every_answer_equals_the_stored_one");
        }
    }

    /// The table stored `answer`: a stored answer never changes.
    fn stored_now(&mut self, answer: u8) {
        match self.stored {
            Some(s) if s != answer => self.violate("a_stored_answer_never_changes"),
            _ => self.stored = Some(answer),
        }
    }

    /// A write under `token` took effect: it must be the row's owner's.
    fn wrote_under(&mut self, token: u8, row_token: u8) {
        if token != row_token {
            self.violate("a_fenced_off_owner_never_writes");
        }
    }

    fn fault(&mut self, kind: u8) {
        self.faults += 1;
        self.fault_kinds |= kind;
    }

    /// The state after `action`, its interchangeable workers in order.
    pub fn step(&self, p: &Params, action: Action) -> State {
        let mut s = self.apply(p, action);
        for w in s.workers.iter_mut().filter(|w| w.work == Work::Idle) {
            // An idle worker remembers nothing of the key.
            *w = Worker {
                process: w.process,
                work: Work::Idle,
                token: 0,
                renew_at: 255,
                paused: false,
                held: false,
                lapsable: false,
            };
        }
        s.renumber_tokens();
        s.workers.sort_unstable();
        s
    }

    /// Tokens matter only by equality and order: they are renumbered 1, 2, … in order, so
    /// that reserving again does not make a new state out of an old one.
    fn renumber_tokens(&mut self) {
        let mut live: Vec<u8> = self
            .workers
            .iter()
            .filter(|w| w.work != Work::Idle)
            .map(|w| w.token)
            .collect();
        match self.table.row {
            Row::InProgress { token, .. } | Row::Done { token, .. } => live.push(token),
            Row::Absent => {}
        }
        live.sort_unstable();
        live.dedup();
        let new = |t: u8| live.iter().position(|&l| l == t).map_or(0, |i| i as u8 + 1);
        for w in self.workers.iter_mut().filter(|w| w.work != Work::Idle) {
            w.token = new(w.token);
        }
        self.table.row = match self.table.row {
            Row::InProgress { token, until } => Row::InProgress {
                token: new(token),
                until,
            },
            Row::Done { answer, token } => Row::Done {
                answer,
                token: new(token),
            },
            Row::Absent => Row::Absent,
        };
        self.table.next_token = live.len() as u8 + 1;
    }

    fn apply(&self, p: &Params, action: Action) -> State {
        let mut s = self.clone();
        match action {
            Action::Arrive(i) => s.arrive(p, i as usize),
            Action::Call(i) => {
                s.executions += 1;
                s.executions_now += 1;
                let answer = s.executions;
                s.workers[i as usize].work = Work::Answered { answer };
                s.after_execution();
            }
            Action::CallUnknown(i) => {
                // The upstream acted; the key stays in progress and renewal stops.
                s.executions += 1;
                s.executions_now += 1;
                s.fault_kinds |= UNKNOWN_CALL;
                s.workers[i as usize].work = Work::Idle;
                s.workers[i as usize].renew_at = 255;
                s.after_execution();
            }
            Action::CallNotSent(i) => s.workers[i as usize].work = Work::Releasing,
            Action::Write(i) => s.write(i as usize, false),
            Action::WriteCommittedButTimedOut(i) => {
                s.fault(AMBIGUOUS_WRITE);
                s.write(i as usize, true);
            }
            Action::Renew(i) => s.renew(p, i as usize),
            Action::Tick => s.table.now += 1,
            Action::StoreDown => {
                s.fault(OUTAGE);
                s.store_up = false;
            }
            Action::StoreUp => s.store_up = true,
            Action::Crash(process) => {
                s.fault(CRASH);
                for w in s.workers.iter_mut().filter(|w| w.process == process) {
                    w.work = Work::Idle;
                    w.renew_at = 255;
                    w.held = false;
                    w.paused = false;
                    w.lapsable = false;
                }
            }
            Action::Pause(i) => {
                s.fault(PAUSE);
                s.workers[i as usize].paused = true;
                s.workers[i as usize].lapsable = true;
            }
            Action::Resume(i) => s.workers[i as usize].paused = false,
            Action::Sweep => {
                if s.table.unresolved() {
                    s.violate("an_unresolved_key_is_never_swept");
                }
                s.table.sweep();
                // Past its retention a request is a new operation.
                s.stored = None;
                s.executions_now = 0;
            }
            Action::Evict => {
                s.fault(EVICTION);
                s.table.row = Row::Absent;
                s.stored = None;
                s.executions_now = 0;
            }
            Action::Reconcile => {
                // The probe finds the operation when the upstream executed it (by the
                // derived key): its answer is stored; otherwise the key is released.
                if s.executions_now > 0 {
                    let token = s.table.next_token;
                    s.table.next_token += 1;
                    s.table.row = Row::Done {
                        answer: s.executions,
                        token,
                    };
                    s.stored_now(s.executions);
                } else {
                    s.table.row = Row::Absent;
                }
            }
        }
        s
    }

    /// Two executions of one key since it was last forgotten need a fault: the model says
    /// which (see [`super::checker`]).
    fn after_execution(&mut self) {
        if self.executions_now > 1 && self.fault_kinds == 0 {
            self.violate("a_key_executes_twice_only_after_a_fault");
        }
    }

    fn arrive(&mut self, p: &Params, i: usize) {
        let process = self.workers[i].process;
        if let Some(held) = self.held_in(process) {
            // The process holds the key's answer: the store is asked first, without
            // taking anything over.
            if self.store_up {
                match self.table.reserve(p.lease, false) {
                    Reserved::Done { answer } => return self.answered(answer),
                    Reserved::Granted { token, .. } => {
                        // The row was gone: the held answer is stored under the new lease.
                        if self.table.complete(token, held) {
                            self.stored_now(held);
                        }
                    }
                    Reserved::InProgress | Reserved::Unresolved => {}
                }
            }
            return self.answered(held);
        }
        if !self.store_up {
            return; // 503: nothing forwarded, nothing reserved
        }
        let previous = match self.table.row {
            Row::InProgress { token, .. } => Some(token),
            _ => None,
        };
        match self.table.reserve(p.lease, p.takeover) {
            Reserved::Granted { token, takeover } => {
                if takeover {
                    self.check_takeover(previous);
                }
                let w = &mut self.workers[i];
                w.work = Work::Calling;
                w.token = token;
                w.renew_at = self.table.now + p.renew_every;
                w.held = false;
                w.lapsable = false;
            }
            Reserved::InProgress => {}
            Reserved::Unresolved => {} // 424: final
            Reserved::Done { answer } => self.answered(answer),
        }
    }

    /// A takeover of `previous`'s lease: its holder must not be a live, unpaused worker
    /// whose store calls all succeeded — such a worker renews on time.
    fn check_takeover(&mut self, previous: Option<u8>) {
        let live = self.workers.iter().any(|w| {
            Some(w.token) == previous
                && Self::busy(w)
                && !w.paused
                && !w.lapsable
                && w.renew_at != 255
        });
        if live {
            self.violate("a_live_owners_lease_never_lapses");
        }
    }

    fn write(&mut self, i: usize, timed_out: bool) {
        let w = self.workers[i];
        if !self.store_up {
            // Refused: held in the process, retried later.
            let w = &mut self.workers[i];
            w.held = true;
            w.lapsable = true;
            return;
        }
        let row_token = match self.table.row {
            Row::InProgress { token, .. } => Some(token),
            _ => None,
        };
        match w.work {
            Work::Answered { answer } => {
                if self.table.complete(w.token, answer) {
                    self.wrote_under(w.token, row_token.unwrap_or(0));
                    self.stored_now(answer);
                }
            }
            Work::Releasing => {
                self.table.release(w.token);
            }
            Work::Idle | Work::Calling => {}
        }
        let w = &mut self.workers[i];
        if timed_out {
            // It took effect, but the worker cannot know: it holds the ending and tries
            // again (which the fence then refuses).
            w.held = true;
            return;
        }
        // The client gets the upstream's answer (a fenced-off worker's client its own).
        w.work = Work::Idle;
        w.held = false;
        w.renew_at = 255;
    }

    fn renew(&mut self, p: &Params, i: usize) {
        let w = self.workers[i];
        if !self.store_up {
            let w = &mut self.workers[i];
            w.lapsable = true;
            w.renew_at = self.table.now + 1;
            return;
        }
        let row_token = match self.table.row {
            Row::InProgress { token, .. } => Some(token),
            _ => None,
        };
        if self.table.renew(w.token, p.lease) {
            self.wrote_under(w.token, row_token.unwrap_or(0));
            self.workers[i].renew_at = self.table.now + p.renew_every;
        } else {
            // Lost to a takeover or an eviction: renewal stops.
            self.workers[i].renew_at = 255;
        }
    }

    /// A state where the key's story is over for now: an answer is stored, or nothing is
    /// held and nobody works on it.
    pub fn at_rest(&self) -> bool {
        self.workers.iter().all(|w| !Self::busy(w))
            && (matches!(self.table.row, Row::Done { .. } | Row::Absent) || self.table.unresolved())
    }
}
