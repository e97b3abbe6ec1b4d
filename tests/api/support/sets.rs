//! The checker's sets: a session's or an agent's files and an agent's MCP
//! servers and toolsets. Each element's membership is a key of the model
//! (added by an attach or a connect, removed by a detach, a disconnect or
//! the file's delete), and each array must list its elements in an order
//! the acknowledged operations allow.

use std::collections::BTreeSet;

use crate::support::{
    history::{Container, Event, FinalUser, LinkKind, Op},
    model::{Write, explain, misordered},
    verdict::{Verdict, Wrong, whats, write},
};

/// Checks one set: `array` as read back, `writes_of` an element's writes.
fn check_set(
    what: &str,
    array: &[String],
    touched: BTreeSet<String>,
    writes_of: impl Fn(&str) -> Vec<Write<bool>>,
    exists: impl Fn(&str) -> Result<(), String>,
    v: &mut Verdict,
) {
    let unique: BTreeSet<&String> = array.iter().collect();
    if unique.len() != array.len() {
        v.note(
            |v| &mut v.half_done,
            format!("{what} lists an element twice: {array:?}"),
        );
    }
    let elements: BTreeSet<&str> = touched
        .iter()
        .map(String::as_str)
        .chain(array.iter().map(String::as_str))
        .collect();
    for e in elements {
        let present = unique.iter().any(|a| a.as_str() == e);
        if present && let Err(why) = exists(e) {
            v.note(|v| &mut v.half_done, format!("{what} names {e}: {why}"));
            continue;
        }
        let writes = writes_of(e);
        let wrong = if present { Wrong::Order } else { Wrong::Lost };
        v.judge(explain(Some(&false), &writes, &present), wrong, || {
            let now = if present { "in" } else { "not in" };
            format!("{e} is {now} {what}: {:?}", whats(&writes))
        });
    }
    for (first, after) in misordered(array, &writes_of) {
        v.note(
            |v| &mut v.reordered,
            format!(
                "{what} lists {after} before {first}, though {first} was in first: {array:?}; {:?}; {:?}",
                whats(&writes_of(first)),
                whats(&writes_of(after))
            ),
        );
    }
}

/// The files of every session and agent of the user.
pub fn check_containers(history: &[&Event], fin: &FinalUser, v: &mut Verdict) {
    let containers = fin
        .sessions
        .iter()
        .map(|(id, files)| (Container::Session(id.clone()), files))
        .chain(
            fin.agents
                .iter()
                .map(|(id, a)| (Container::Agent(id.clone()), &a.files)),
        );
    for (container, array) in containers {
        let touched = history
            .iter()
            .filter_map(|e| match &e.op {
                Op::Attach {
                    container: c,
                    file_id,
                    ..
                }
                | Op::Detach {
                    container: c,
                    file_id,
                    ..
                } if *c == container => Some(file_id.clone()),
                _ => None,
            })
            .collect();
        let writes_of = |f: &str| -> Vec<Write<bool>> {
            history
                .iter()
                .filter_map(|e| match &e.op {
                    Op::Attach {
                        container: c,
                        file_id,
                        ..
                    } if *c == container && file_id == f => Some(write(e, true)),
                    Op::Detach {
                        container: c,
                        file_id,
                        ..
                    } if *c == container && file_id == f => Some(write(e, false)),
                    // A delete detaches the file everywhere.
                    Op::Delete { file_id, .. } if file_id == f => Some(write(e, false)),
                    _ => None,
                })
                .collect()
        };
        let exists = |f: &str| {
            let Some(file) = fin.files.get(f) else {
                return Err("a file that is gone".to_owned());
            };
            let back = match &container {
                Container::Session(id) => file.sessions.contains(id),
                Container::Agent(id) => file.agents.contains(id),
            };
            if back {
                Ok(())
            } else {
                Err(format!(
                    "a file whose record does not name it (a delete would leave it dangling): {file:?}"
                ))
            }
        };
        check_set(&container.to_string(), array, touched, writes_of, exists, v);
    }
}

/// The MCP servers and toolsets of every agent of the user.
pub fn check_links(history: &[&Event], fin: &FinalUser, v: &mut Verdict) {
    for (agent, state) in &fin.agents {
        for (kind, array) in [
            (LinkKind::Mcp, &state.mcps),
            (LinkKind::Toolset, &state.toolsets),
        ] {
            let ops = || {
                history.iter().filter_map(move |e| match &e.op {
                    Op::Link {
                        agent: a,
                        kind: k,
                        link,
                        connect,
                        ..
                    } if a == agent && *k == kind => Some((*e, link, *connect)),
                    _ => None,
                })
            };
            let touched = ops().map(|(_, link, _)| link.clone()).collect();
            let writes_of = |l: &str| -> Vec<Write<bool>> {
                ops()
                    .filter(|(_, link, _)| link.as_str() == l)
                    .map(|(e, _, connect)| write(e, connect))
                    .collect()
            };
            let what = format!("agent {agent}'s {}", kind.segment());
            check_set(&what, array, touched, writes_of, |_| Ok(()), v);
        }
    }
}
