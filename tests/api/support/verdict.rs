//! The checker's verdict: what it counts, how a key's unexplained final
//! value is counted (`checker.rs` says what counts as what), and the
//! helpers that make the model's writes of the history and the notes.

use std::collections::BTreeMap;

use crate::support::{
    history::Event,
    model::{Explained, Write},
};

/// What the checker found; every count from `lost` on must be zero.
#[derive(Debug, Default)]
pub struct Verdict {
    pub requests: usize,
    pub acknowledged: usize,
    pub failed: usize,
    pub unknown: usize,
    pub lost: usize,
    pub half_done: usize,
    pub reordered: usize,
    pub failed_but_applied: usize,
    pub duplicated: usize,
    pub internal_errors: usize,
    /// Events (`event_checks.rs`) that are not one per committed change to
    /// a file, numbered 1, 2, 3… with no gap: missing, extra, or out of order.
    pub bad_events: usize,
    /// Webhook deliveries (`webhook_receiver.rs`) that break the promise:
    /// an event of the feed never accepted, one owner's first acceptances
    /// out of sequence order, a duplicate with another id or body, a
    /// signature the verifier refused.
    pub bad_webhooks: usize,
    /// Uploads the pre-commit hook refuses that were acknowledged, and hook
    /// calls whose signature did not verify.
    pub bad_hook: usize,
    /// Leftovers of two open defects, counted and printed but not failing
    /// the run (README "Guarantees", "Open"): strays reconcile found beside
    /// the faults, and empty multipart uploads left after the resumable
    /// uploads' expiry and a sweep (one holding a part is half-done).
    pub open_defects: usize,
    /// Per operation kind: sent, acknowledged.
    pub kinds: BTreeMap<&'static str, (usize, usize)>,
    /// How the answers that were not 2xx break down, by kind and code.
    pub codes: BTreeMap<String, usize>,
    pub notes: Vec<String>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.lost
            + self.half_done
            + self.reordered
            + self.failed_but_applied
            + self.duplicated
            + self.internal_errors
            + self.bad_events
            + self.bad_webhooks
            + self.bad_hook
    }

    /// Counts a key whose final value `explained` judged: `absent_or_value`
    /// says which count a value nothing explains goes to.
    pub fn judge(&mut self, explained: Explained, wrong: Wrong, note: impl FnOnce() -> String) {
        let count = match (explained, wrong) {
            (Explained::Yes, _) => return,
            (Explained::ByFailedWrite, _) => &mut self.failed_but_applied,
            (Explained::OutOfOrder, Wrong::Order) => &mut self.reordered,
            (Explained::No, Wrong::Order) => &mut self.half_done,
            (Explained::OutOfOrder | Explained::No, Wrong::Lost) => &mut self.lost,
        };
        *count += 1;
        self.notes.push(note());
    }

    pub fn note(&mut self, count: fn(&mut Verdict) -> &mut usize, note: String) {
        *count(self) += 1;
        self.notes.push(note);
    }
}

/// What an unexplained value means for a key.
#[derive(Clone, Copy)]
pub enum Wrong {
    /// The effect of an acknowledged write is missing.
    Lost,
    /// Something is there that the acknowledged order removed (or nothing
    /// put there: then the records disagree).
    Order,
}

/// A write of the history, for the model.
pub fn write<V>(e: &Event, value: V) -> Write<V> {
    Write {
        value,
        invoked: e.invoked,
        completed: e.completed,
        told: e.answer.told(),
        what: format!("{:?} → {:?}", e.op, e.answer),
    }
}

/// The writes of a key, for a note.
pub fn whats<V: std::fmt::Debug>(writes: &[Write<V>]) -> Vec<String> {
    writes
        .iter()
        .map(|w| format!("{:?}: {}", w.value, w.what))
        .collect()
}
