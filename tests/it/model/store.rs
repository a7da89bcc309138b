//! The key table as the protocol assumes it: one linearizable row with its own clock.
//! Both the protocol model ([`super::protocol`]) and the model-based tests against the real
//! stores ([`super::drives`]) use this one definition, so the SQL cannot drift from what
//! the protocol was checked against.

/// One key's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Row {
    Absent,
    /// Reserved under `token`, leased until `until` (the store's clock).
    InProgress {
        token: u8,
        until: u8,
    },
    /// Answered with `answer`, written under `token`.
    Done {
        answer: u8,
        token: u8,
    },
}

/// What a reservation comes to, as the request path sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reserved {
    /// A fresh lease under this token; `takeover`: an expired one was taken over.
    Granted { token: u8, takeover: bool },
    /// Another holder's lease is live: `409`.
    InProgress,
    /// The lease ran out and the route never takes over: `424`.
    Unresolved,
    /// The stored answer: a replay.
    Done { answer: u8 },
}

/// A deliberate protocol bug, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// A completion applied whatever token the row carries.
    NoFenceOnCompletion,
    /// A renewal extends the lease whatever token the row carries.
    RenewalIgnoresToken,
    /// A live lease is taken over as if it had run out.
    TakeoverBeforeExpiry,
    /// The sweep deletes unresolved keys with the completed ones.
    SweepOfUnresolved,
    /// Renewals come less often than the lease runs out.
    RenewalSlowerThanLease,
}

/// The table: its row, its clock, its token sequence (never reused), and the mutant, if
/// one is planted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    pub row: Row,
    pub now: u8,
    pub next_token: u8,
    pub mutant: Option<Mutant>,
}

impl Table {
    pub fn new(mutant: Option<Mutant>) -> Self {
        Table {
            row: Row::Absent,
            now: 0,
            next_token: 1,
            mutant,
        }
    }

    fn grant(&mut self, lease: u8, takeover: bool) -> Reserved {
        let token = self.next_token;
        self.next_token += 1;
        self.row = Row::InProgress {
            token,
            until: self.now.saturating_add(lease),
        };
        Reserved::Granted { token, takeover }
    }

    /// Reserves the key for `lease`; `takeover`: the route may take an expired lease over.
    pub fn reserve(&mut self, lease: u8, takeover: bool) -> Reserved {
        match self.row {
            Row::Absent => self.grant(lease, false),
            Row::Done { answer, .. } => Reserved::Done { answer },
            Row::InProgress { until, .. } => {
                let expired =
                    until <= self.now || self.mutant == Some(Mutant::TakeoverBeforeExpiry);
                match (expired, takeover) {
                    (false, _) => Reserved::InProgress,
                    (true, true) => self.grant(lease, true),
                    (true, false) => Reserved::Unresolved,
                }
            }
        }
    }

    /// Extends `token`'s lease; whether it applied.
    pub fn renew(&mut self, token: u8, lease: u8) -> bool {
        match self.row {
            Row::InProgress { token: t, .. }
                if t == token || self.mutant == Some(Mutant::RenewalIgnoresToken) =>
            {
                self.row = Row::InProgress {
                    token: t,
                    until: self.now.saturating_add(lease),
                };
                true
            }
            _ => false,
        }
    }

    /// Stores `answer` under `token`; whether it applied.
    pub fn complete(&mut self, token: u8, answer: u8) -> bool {
        match self.row {
            Row::InProgress { token: t, .. }
                if t == token || self.mutant == Some(Mutant::NoFenceOnCompletion) =>
            {
                self.row = Row::Done { answer, token };
                true
            }
            _ => false,
        }
    }

    /// Deletes `token`'s reservation; whether it applied.
    pub fn release(&mut self, token: u8) -> bool {
        match self.row {
            Row::InProgress { token: t, .. } if t == token => {
                self.row = Row::Absent;
                true
            }
            _ => false,
        }
    }

    /// The sweep: a completed row past its retention goes; an unresolved one never does
    /// (unless the mutant says so). Whether it deleted a row.
    pub fn sweep(&mut self) -> bool {
        match self.row {
            Row::Done { .. } => {
                self.row = Row::Absent;
                true
            }
            Row::InProgress { until, .. }
                if until <= self.now && self.mutant == Some(Mutant::SweepOfUnresolved) =>
            {
                self.row = Row::Absent;
                true
            }
            _ => false,
        }
    }

    /// Whether the row is in progress with its lease run out.
    pub fn unresolved(&self) -> bool {
        matches!(self.row, Row::InProgress { until, .. } if until <= self.now)
    }
}
