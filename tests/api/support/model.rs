//! The per-key model the checker holds the final state against: every key
//! (a file's existence, its name, a file's membership of a session or an
//! agent, a link's membership of an agent) is a register written by the
//! operations of the history, and its final value must be the value of a
//! write that some linearization of the history puts last. For set
//! semantics that is a small linearizability check per key (Jepsen's
//! Knossos does it in general; a register read once at the end needs only
//! this). An array (a container's `file_ids`, an agent's links) must also
//! list its elements in an order the acknowledged operations allow.

use std::time::Instant;

/// Whether the client was told the write happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    /// 2xx: it took effect between its invocation and its answer.
    Ok,
    /// No definite answer (504, 500, a dropped connection): it may have
    /// taken effect at any time after its invocation, even after its answer.
    Maybe,
    /// A definite refusal: it must not have taken effect.
    Failed,
}

/// One write of a register.
#[derive(Clone, Debug)]
pub struct Write<V> {
    pub value: V,
    pub invoked: Instant,
    pub completed: Instant,
    pub told: Told,
    /// What it was, for the notes.
    pub what: String,
}

impl<V> Write<V> {
    /// When it took effect at the latest (`None`: it may have at any time).
    fn effect_by(&self) -> Option<Instant> {
        (self.told == Told::Ok).then_some(self.completed)
    }

    fn may_apply(&self) -> bool {
        self.told != Told::Failed
    }
}

/// How a key's final value is explained.
#[derive(Debug, PartialEq, Eq)]
pub enum Explained {
    /// By a linearization of the acknowledged and possibly applied writes.
    Yes,
    /// Only if a write answered as failed applied.
    ByFailedWrite,
    /// The value was written, but only an order other than the acknowledged
    /// one makes it last.
    OutOfOrder,
    /// Nothing explains it (an acknowledged write vanished, or the value
    /// was never written).
    No,
}

/// Explains `fin`, the final value of a key whose value was `initial`
/// before `writes` (`None`: no value, the key did not exist).
pub fn explain<V: PartialEq>(initial: Option<&V>, writes: &[Write<V>], fin: &V) -> Explained {
    // `w` can be last iff no acknowledged write of another value must come
    // after it (was invoked after `w` took effect at the latest).
    let can_be_last = |w: &Write<V>| {
        writes.iter().all(|x| {
            x.told != Told::Ok
                || x.value == *fin
                || w.effect_by().is_none_or(|done| x.invoked <= done)
        })
    };
    let initial_last =
        initial == Some(fin) && writes.iter().all(|x| x.told != Told::Ok || x.value == *fin);
    if initial_last
        || writes
            .iter()
            .any(|w| w.may_apply() && w.value == *fin && can_be_last(w))
    {
        return Explained::Yes;
    }
    let by_failed = writes.iter().any(|w| {
        w.told == Told::Failed
            && w.value == *fin
            && writes
                .iter()
                .all(|x| x.told != Told::Ok || x.value == *fin || x.invoked <= w.completed)
    });
    if by_failed {
        Explained::ByFailedWrite
    } else if writes.iter().any(|w| w.may_apply() && w.value == *fin) {
        Explained::OutOfOrder
    } else {
        Explained::No
    }
}

/// When an element's final stay in a set began, as far as the history
/// bounds it: after `earliest`, and (if known) by `latest`. `writes` are
/// the element's adds (`true`) and removes (`false`); it is in the set now.
pub fn stay_began(writes: &[Write<bool>]) -> (Option<Instant>, Option<Instant>) {
    let adds = || writes.iter().filter(|w| w.value && w.may_apply());
    let removes = || writes.iter().filter(|w| !w.value && w.may_apply());
    // The add that began it was invoked before it; every acknowledged
    // remove took effect before it.
    let first_add = adds().map(|w| w.invoked).min();
    let last_remove = removes()
        .filter(|w| w.told == Told::Ok)
        .map(|w| w.invoked)
        .max();
    let earliest = first_add.max(last_remove);
    // An acknowledged add after which no remove can have taken effect
    // bounds it from above.
    let latest = adds()
        .filter(|a| a.told == Told::Ok)
        .filter(|a| removes().all(|r| r.effect_by().is_some_and(|done| done < a.invoked)))
        .map(|a| a.completed)
        .min();
    (earliest, latest)
}

/// Pairs of elements of `array` listed out of the order the history
/// forces: `b` before `a` although `a`'s stay began before `b`'s could.
pub fn misordered(
    array: &[String],
    writes_of: impl Fn(&str) -> Vec<Write<bool>>,
) -> Vec<(&str, &str)> {
    let bounds: Vec<_> = array.iter().map(|e| stay_began(&writes_of(e))).collect();
    let mut wrong = Vec::new();
    for (i, b) in array.iter().enumerate() {
        for (j, a) in array.iter().enumerate().skip(i + 1) {
            // `b` is listed before `a`: wrong if `a` was surely in first.
            let (Some(a_latest), Some(b_earliest)) = (bounds[j].1, bounds[i].0) else {
                continue;
            };
            if a_latest < b_earliest {
                wrong.push((a.as_str(), b.as_str()));
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(base: Instant, from: u64, to: u64, value: bool, told: Told) -> Write<bool> {
        Write {
            value,
            invoked: base + Duration::from_millis(from),
            completed: base + Duration::from_millis(to),
            told,
            what: String::new(),
        }
    }

    #[test]
    fn the_last_acknowledged_write_wins_unless_a_concurrent_one_may_follow() {
        let t = Instant::now();
        let add = at(t, 0, 10, true, Told::Ok);
        let remove = at(t, 20, 30, false, Told::Ok);
        assert_eq!(
            explain(Some(&false), &[add.clone(), remove.clone()], &false),
            Explained::Yes
        );
        assert_eq!(
            explain(Some(&false), &[add.clone(), remove.clone()], &true),
            Explained::OutOfOrder
        );
        let overlapping = at(t, 5, 30, false, Told::Ok);
        assert_eq!(
            explain(Some(&false), &[add.clone(), overlapping], &true),
            Explained::Yes
        );
        assert_eq!(
            explain(Some(&false), std::slice::from_ref(&add), &false),
            Explained::No
        );
        let unknown = at(t, 20, 30, false, Told::Maybe);
        assert_eq!(
            explain(Some(&false), &[add.clone(), unknown], &false),
            Explained::Yes
        );
        let failed = at(t, 20, 30, false, Told::Failed);
        assert_eq!(
            explain(Some(&false), &[add, failed], &false),
            Explained::ByFailedWrite
        );
    }

    #[test]
    fn an_array_lists_what_was_surely_added_first_first() {
        let t = Instant::now();
        let writes = |e: &str| match e {
            "a" => vec![at(t, 0, 10, true, Told::Ok)],
            "b" => vec![at(t, 20, 30, true, Told::Ok)],
            _ => vec![at(t, 5, 25, true, Told::Ok)],
        };
        let ordered = ["a", "b"].map(String::from);
        assert!(misordered(&ordered, writes).is_empty());
        let swapped = ["b", "a"].map(String::from);
        assert_eq!(misordered(&swapped, writes), [("a", "b")]);
        let concurrent = ["c", "a", "b"].map(String::from);
        assert!(misordered(&concurrent, writes).is_empty());
    }
}
