//! The events of keys under faults (`key.created`, `key.revoked`), held
//! against the mints and revocations of `account_workload.rs`. Each key the
//! suite mints has a name of its own, which its events carry:
//! - a `key.created` comes from a mint of that name not answered as failed;
//!   an acknowledged mint has exactly one, a mint whose outcome is unknown
//!   at most one;
//! - a `key.revoked` comes after its key's `key.created`, from a
//!   revocation not refused (a 404 may be the resend of one that applied);
//!   an acknowledged (204) revocation has exactly one; a key is revoked at
//!   most once.

use std::collections::BTreeMap;

use crate::support::{
    accounts::revoked,
    history::{Answer, Event, FinalEvent, FinalUser, Op},
    model::Told,
};

pub const KINDS: [&str; 2] = ["key.created", "key.revoked"];

/// What is off about one user's key events.
pub fn check(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    // Per name: (mints not failed, mints acknowledged), and the same of
    // revocations.
    let mut mints: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut revokes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for &e in history {
        let (into, told, ok) = match &e.op {
            Op::MintKey { name, .. } => {
                (mints.entry(name), e.answer.told(), e.answer == Answer::Ok)
            }
            Op::RevokeKey { name, .. } => (revokes.entry(name), revoked(e), e.answer == Answer::Ok),
            _ => continue,
        };
        let n = into.or_default();
        n.0 += usize::from(told != Told::Failed);
        n.1 += usize::from(ok);
    }
    let mut wrong = Vec::new();
    let mut created: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut gone: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for e in fin
        .events
        .iter()
        .filter(|e| KINDS.contains(&e.kind.as_str()))
    {
        let name = e.name.as_deref().unwrap_or_default();
        if e.kind == "key.created" {
            created.entry(name).or_default().push(e.seq);
            continue;
        }
        if !created.contains_key(name) {
            wrong.push(format!(
                "key.revoked {} of {name:?} comes before any key.created of it",
                e.seq
            ));
        }
        gone.entry(name).or_default().push(e.seq);
    }
    for (what, sent, seen) in [("mint", &mints, &created), ("revocation", &revokes, &gone)] {
        for (name, seqs) in seen {
            let (may, _) = sent.get(name).copied().unwrap_or_default();
            if seqs.len() > may.min(1) {
                wrong.push(format!(
                    "the key {name:?} has the events {seqs:?} of its {what}, which {may} requests that may have applied asked for"
                ));
            }
        }
        for (name, (_, acked)) in sent {
            if *acked > 0 && !seen.contains_key(name) {
                wrong.push(format!(
                    "an acknowledged {what} of the key {name:?} has no event"
                ));
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(op: Op, answer: Answer) -> Event {
        Event::at_once(op, answer)
    }

    fn event(seq: i64, kind: &str, name: &str) -> FinalEvent {
        FinalEvent {
            name: Some(name.to_owned()),
            ..FinalEvent::of(seq, kind, &format!("id-{name}"), "u")
        }
    }

    fn mint(name: &str, answer: Answer) -> Event {
        let op = Op::MintKey {
            user: 0,
            name: name.into(),
            parent: None,
        };
        sent(op, answer)
    }

    fn revoke(name: &str, answer: Answer) -> Event {
        sent(
            Op::RevokeKey {
                user: 0,
                name: name.into(),
            },
            answer,
        )
    }

    fn checked(events: Vec<FinalEvent>) -> Vec<String> {
        let history = [
            mint("k1", Answer::Ok),
            mint("k2", Answer::Unknown("transport".into())),
            mint("k3", Answer::Failed("too_many_keys".into())),
            revoke("k1", Answer::Ok),
            revoke("k1", Answer::Failed("not_found".into())),
        ];
        let fin = FinalUser {
            events,
            ..Default::default()
        };
        check(&history.iter().collect::<Vec<_>>(), &fin)
    }

    #[test]
    fn one_event_per_applied_mint_and_revocation_passes() {
        let clean = vec![
            event(1, "key.created", "k1"),
            event(2, "key.created", "k2"),
            event(3, "key.revoked", "k1"),
        ];
        assert_eq!(checked(clean), Vec::<String>::new());
        let unknown_not_applied =
            vec![event(1, "key.created", "k1"), event(2, "key.revoked", "k1")];
        assert_eq!(checked(unknown_not_applied), Vec::<String>::new());
    }

    #[test]
    fn a_missing_a_doubled_or_a_failed_mint_s_event_is_found() {
        let found = |events, what: &str| {
            let wrong = checked(events);
            assert!(
                wrong.iter().any(|w| w.contains(what)),
                "{what:?} not in {wrong:?}"
            );
        };
        found(
            vec![event(1, "key.created", "k1")],
            "an acknowledged revocation of the key \"k1\" has no event",
        );
        found(
            vec![
                event(1, "key.created", "k1"),
                event(2, "key.revoked", "k1"),
                event(3, "key.revoked", "k1"),
            ],
            "the events [2, 3] of its revocation",
        );
        found(
            vec![
                event(1, "key.created", "k1"),
                event(2, "key.revoked", "k1"),
                event(3, "key.created", "k3"),
            ],
            "which 0 requests",
        );
        found(
            vec![event(1, "key.revoked", "k1"), event(2, "key.created", "k1")],
            "comes before any key.created",
        );
    }
}
