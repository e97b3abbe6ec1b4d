//! The checker's containers themselves: each session's and agent's
//! existence is a key of the model (made by its create, removed by its
//! delete), so one deleted with a 204 is gone (neither stored nor listed,
//! and `GET` answers 404), one whose delete's outcome is unknown may be
//! either (if there, `sets.rs` holds its contents to the model as for any
//! other); no file names a container that does not list it (a deleted one
//! above all: the delete and an attach that found it gone must leave no
//! back-reference); no attach or connect is acknowledged on a container
//! after its delete was; and a container no answer named (a create whose
//! answer was lost) is explained by such a create and holds nothing.

use std::collections::BTreeSet;

use crate::support::{
    history::{Answer, Container, Event, FinalUser, Holder, Op},
    model::{Told, Write, explain},
    verdict::{Verdict, Wrong, whats, write},
};

pub fn check_lives(history: &[&Event], fin: &FinalUser, v: &mut Verdict) {
    let stored: BTreeSet<Container> = (fin.sessions.keys().cloned().map(Container::Session))
        .chain(fin.agents.keys().cloned().map(Container::Agent))
        .collect();
    let listed: BTreeSet<&Container> = fin.listed_containers.iter().collect();
    if stored.iter().collect::<BTreeSet<_>>() != listed
        || listed.len() != fin.listed_containers.len()
    {
        v.note(
            |v| &mut v.half_done,
            format!(
                "{}: the store has the containers {stored:?}, the API lists {:?}",
                fin.id, fin.listed_containers
            ),
        );
    }
    let known: BTreeSet<Container> = history.iter().filter_map(|e| e.op.container()).collect();
    for c in &known {
        let writes: Vec<Write<bool>> = history
            .iter()
            .filter_map(|e| match &e.op {
                Op::Create { .. } if e.op.container().as_ref() == Some(c) => Some(write(e, true)),
                Op::DeleteContainer { container, .. } if container == c => Some(write(e, false)),
                _ => None,
            })
            .collect();
        let present = stored.contains(c);
        let wrong = if present { Wrong::Order } else { Wrong::Lost };
        v.judge(explain(Some(&false), &writes, &present), wrong, || {
            let now = if present { "there" } else { "gone" };
            format!("{c} is {now}: {:?}", whats(&writes))
        });
        if let Some(status) = fin.gone_containers.get(c)
            && *status != 404
        {
            v.note(
                |v| &mut v.lost,
                format!("{c} is not stored, yet GET answers {status}"),
            );
        }
    }
    for kind in [Holder::Session, Holder::Agent] {
        let strangers = stored
            .iter()
            .filter(|c| c.kind() == kind && !known.contains(c));
        check_strangers(history, fin, kind, strangers.collect(), v);
    }
    acknowledged_after_delete(history, v);
    back_references(fin, v);
}

/// Containers no answer named: each a create's whose answer was lost (or
/// unread), and empty (nobody knew its id to attach or connect).
fn check_strangers(
    history: &[&Event],
    fin: &FinalUser,
    kind: Holder,
    strangers: Vec<&Container>,
    v: &mut Verdict,
) {
    let unnamed: Vec<Told> = history
        .iter()
        .filter(|e| matches!(&e.op, Op::Create { kind: k, id: None, .. } if *k == kind))
        .map(|e| e.answer.told())
        .collect();
    let count = |t: Told| unnamed.iter().filter(|u| **u == t).count();
    let (ok, maybe) = (count(Told::Ok), count(Told::Ok) + count(Told::Maybe));
    if strangers.len() < ok {
        v.note(
            |v| &mut v.lost,
            format!(
                "{}: {ok} creates of a {kind:?} acknowledged with their bodies unread, but only {} such there",
                fin.id,
                strangers.len()
            ),
        );
    }
    for (i, c) in strangers.into_iter().enumerate() {
        if i >= maybe + count(Told::Failed) {
            v.note(|v| &mut v.half_done, format!("{c}: no create made it"));
        } else if i >= maybe {
            v.note(
                |v| &mut v.failed_but_applied,
                format!("{c}: only a create answered failed made it"),
            );
        }
        let empty = match c {
            Container::Session(id) => fin.sessions[id].is_empty(),
            Container::Agent(id) => {
                let a = &fin.agents[id];
                a.files.is_empty() && a.mcps.is_empty() && a.toolsets.is_empty()
            }
        };
        if !empty {
            v.note(
                |v| &mut v.half_done,
                format!("{c}, whose id no answer named, holds something"),
            );
        }
    }
}

/// An attach or connect acknowledged though it was sent after its
/// container's delete was acknowledged (it must have found it gone: 404).
fn acknowledged_after_delete(history: &[&Event], v: &mut Verdict) {
    for e in history.iter().filter(|e| e.answer == Answer::Ok) {
        let adds = matches!(e.op, Op::Attach { .. } | Op::Link { connect: true, .. });
        let Some(c) = e.op.container().filter(|_| adds) else {
            continue;
        };
        let deleted = history.iter().find(|d| {
            d.answer == Answer::Ok
                && d.completed < e.invoked
                && matches!(&d.op, Op::DeleteContainer { container, .. } if *container == c)
        });
        if let Some(d) = deleted {
            v.note(
                |v| &mut v.lost,
                format!("{:?} was acknowledged after {:?} was", e.op, d.op),
            );
        }
    }
}

/// Every session and agent a file's record names lists the file.
fn back_references(fin: &FinalUser, v: &mut Verdict) {
    for (id, file) in &fin.files {
        let named = (file.sessions.iter().map(|s| Container::Session(s.clone())))
            .chain(file.agents.iter().map(|a| Container::Agent(a.clone())));
        for c in named {
            let lists = match &c {
                Container::Session(s) => fin.sessions.get(s),
                Container::Agent(a) => fin.agents.get(a).map(|a| &a.files),
            };
            let why = match lists {
                None => "which is gone",
                Some(files) if !files.contains(id) => "which does not list it",
                Some(_) => continue,
            };
            v.note(
                |v| &mut v.half_done,
                format!("{id}'s record names {c}, {why}"),
            );
        }
    }
}

/// For the summary line: how the container deletes were answered (sent,
/// 204, unknown, 404, refused otherwise), and how many attaches, detaches
/// and links were answered 404 (a container deleted before or beside).
pub fn deletes_summary(history: &[Event]) -> String {
    let deletes: Vec<&Answer> = history
        .iter()
        .filter(|e| matches!(e.op, Op::DeleteContainer { .. }))
        .map(|e| &e.answer)
        .collect();
    let not_found = |a: &Answer| matches!(a, Answer::Failed(c) if c == "not_found");
    let count = |f: &dyn Fn(&Answer) -> bool| deletes.iter().filter(|a| f(a)).count();
    let ok = count(&|a| *a == Answer::Ok);
    let unknown = count(&|a| a.told() == Told::Maybe);
    let gone = count(&not_found);
    let refused = deletes.len() - ok - unknown - gone;
    let on_deleted = history
        .iter()
        .filter(|e| {
            matches!(
                e.op,
                Op::Attach { .. } | Op::Detach { .. } | Op::Link { .. }
            )
        })
        .filter(|e| not_found(&e.answer))
        .count();
    format!(
        "container_deletes={} deletes_ok={ok} deletes_unknown={unknown} deletes_404={gone} deletes_refused={refused} container_ops_404={on_deleted}",
        deletes.len()
    )
}
