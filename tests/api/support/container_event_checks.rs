//! The events of sessions and agents under faults, held against the
//! history and the containers read back (`event_checks.rs` holds the
//! files'). A change writes its event only when it changed something, so
//! an acknowledged attach of a file already there has none: the check is
//! therefore by replay. The user's events, folded in sequence order from
//! nothing (a `*.created` makes a container, `*.file_attached` adds a file,
//! `agent.mcp_connected` a link…, `*.deleted` removes it, a `file.deleted`
//! takes its file out of every container), must
//! - each change something: no container made twice, no file added to a
//!   container that holds it or taken from one that does not, nothing
//!   written to a container not made or already deleted, no file attached
//!   after its `file.deleted`;
//! - end in exactly the containers read back, each holding exactly the
//!   files and links read back;
//! - each come from a request that may have applied: a creation from a
//!   create (an acknowledged one's id named once, an unknown one's at most
//!   its count of unnamed ids), a deletion from a delete not refused, each
//!   attach, detach, connect and disconnect from a request of its own on
//!   that container and member not answered as failed (no more events than
//!   such requests);
//! - include an acknowledged create's and an acknowledged delete's event.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{
    history::{Answer, Container, Event, FinalEvent, FinalUser, Holder, LinkKind, Op},
    model::Told,
};

/// The types of the events sessions and agents write.
pub const KINDS: [&str; 12] = [
    "session.created",
    "session.deleted",
    "session.file_attached",
    "session.file_detached",
    "agent.created",
    "agent.deleted",
    "agent.file_attached",
    "agent.file_detached",
    "agent.mcp_connected",
    "agent.mcp_disconnected",
    "agent.toolset_connected",
    "agent.toolset_disconnected",
];

/// A container's lists as the events left them.
#[derive(Debug, Default, PartialEq)]
struct Folded {
    files: BTreeSet<String>,
    mcps: BTreeSet<String>,
    toolsets: BTreeSet<String>,
}

/// What one container event does: to which container, which list (`None`:
/// the container itself) and whether it adds.
struct Step<'a> {
    holder: Holder,
    list: Option<&'static str>,
    adds: bool,
    container: &'a str,
    member: &'a str,
}

fn step(e: &FinalEvent) -> Option<Step<'_>> {
    let (holder, rest) = e.kind.split_once('.')?;
    let holder = match holder {
        "session" => Holder::Session,
        "agent" => Holder::Agent,
        _ => return None,
    };
    let (list, adds) = match rest {
        "created" => (None, true),
        "deleted" => (None, false),
        "file_attached" => (Some("files"), true),
        "file_detached" => (Some("files"), false),
        "mcp_connected" => (Some("mcps"), true),
        "mcp_disconnected" => (Some("mcps"), false),
        "toolset_connected" => (Some("toolsets"), true),
        "toolset_disconnected" => (Some("toolsets"), false),
        _ => return None,
    };
    Some(Step {
        holder,
        list,
        adds,
        container: &e.subject,
        member: e.member.as_deref().unwrap_or_default(),
    })
}

impl Folded {
    fn list(&mut self, name: &str) -> &mut BTreeSet<String> {
        match name {
            "files" => &mut self.files,
            "mcps" => &mut self.mcps,
            _ => &mut self.toolsets,
        }
    }
}

/// What is off about one user's container events.
pub fn check(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    let mut wrong = replay(fin);
    wrong.extend(explained(history, fin));
    wrong
}

/// Folds the events and holds the end against what was read back.
fn replay(fin: &FinalUser) -> Vec<String> {
    let mut live: BTreeMap<(Holder, String), Folded> = BTreeMap::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    let mut deleted_files: BTreeSet<&str> = BTreeSet::new();
    let mut wrong = Vec::new();
    for e in &fin.events {
        if e.kind == "file.deleted" {
            deleted_files.insert(&e.subject);
            for c in live.values_mut() {
                c.files.remove(&e.subject);
            }
            continue;
        }
        let Some(s) = step(e) else { continue };
        let key = (s.holder, s.container.to_owned());
        let off = match (s.list, s.adds) {
            (None, true) if live.contains_key(&key) || gone.contains(s.container) => {
                Some("made again".to_owned())
            }
            (None, true) => {
                live.insert(key, Folded::default());
                None
            }
            (None, false) => match live.remove(&key) {
                Some(_) => {
                    gone.insert(key.1);
                    None
                }
                None => Some("deleted, not being there".to_owned()),
            },
            (Some(list), adds) => match live.get_mut(&key) {
                None => Some("written to, not being there".to_owned()),
                Some(_) if adds && list == "files" && deleted_files.contains(s.member) => {
                    Some(format!("given {} after its file.deleted", s.member))
                }
                Some(c) => {
                    let l = c.list(list);
                    let changed = match adds {
                        true => l.insert(s.member.to_owned()),
                        false => l.remove(s.member),
                    };
                    (!changed).then(|| format!("changed nothing of its {list} ({})", s.member))
                }
            },
        };
        if let Some(off) = off {
            wrong.push(format!("{} {} of {}: {off}", e.kind, e.seq, e.subject));
        }
    }
    wrong.extend(end_off(&live, fin));
    wrong
}

/// The containers the events leave, against those read back.
fn end_off(live: &BTreeMap<(Holder, String), Folded>, fin: &FinalUser) -> Vec<String> {
    let set = |l: &[String]| l.iter().cloned().collect::<BTreeSet<_>>();
    let mut read: BTreeMap<(Holder, String), Folded> = BTreeMap::new();
    for (id, files) in &fin.sessions {
        let c = Folded {
            files: set(files),
            ..Default::default()
        };
        read.insert((Holder::Session, id.clone()), c);
    }
    for (id, a) in &fin.agents {
        let c = Folded {
            files: set(&a.files),
            mcps: set(&a.mcps),
            toolsets: set(&a.toolsets),
        };
        read.insert((Holder::Agent, id.clone()), c);
    }
    let mut wrong = Vec::new();
    for key in live.keys().chain(read.keys()).collect::<BTreeSet<_>>() {
        let (told, there) = (live.get(key), read.get(key));
        if told != there {
            wrong.push(format!(
                "{:?} {}: the events leave it {told:?}, it was read back {there:?}",
                key.0, key.1
            ));
        }
    }
    wrong
}

/// What happened to the container `id`: its requests (kind, member,
/// answer, sent and answered in ms from the first) and its events.
fn timeline(history: &[&Event], fin: &FinalUser, id: &str) -> String {
    let mine: Vec<&&Event> = (history.iter())
        .filter(|e| e.op.container().is_some_and(|c| c.id() == id))
        .collect();
    let Some(start) = mine.iter().map(|e| e.invoked).min() else {
        return "no request names it".to_owned();
    };
    let ms = |t: std::time::Instant| t.duration_since(start).as_millis();
    let requests: Vec<String> = (mine.iter())
        .map(|e| {
            let member = match &e.op {
                Op::Attach { file_id, .. } | Op::Detach { file_id, .. } => file_id.as_str(),
                Op::Link { link, .. } => link.as_str(),
                _ => "",
            };
            let (a, b) = (ms(e.invoked), ms(e.completed));
            format!("{} {member} {:?} {a}..{b}", e.op.kind(), e.answer)
        })
        .collect();
    let events: Vec<String> = (fin.events.iter())
        .filter(|e| e.subject == id)
        .map(|e| format!("{} {} {:?}", e.seq, e.kind, e.member))
        .collect();
    format!("requests {requests:?}, events {events:?}")
}

/// Whether a request answered `a` may have applied (a container delete
/// answered 404 may be a resend of one that did).
fn may_have(a: &Answer, delete: bool) -> bool {
    a.told() != Told::Failed || (delete && matches!(a, Answer::Failed(c) if c == "not_found"))
}

/// The events against the requests that could have written them.
fn explained(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    // Requests per (container, list or "" for the container itself,
    // member, adds): how many may have applied, and whether one was acknowledged.
    let mut sent: BTreeMap<(String, &str, String, bool), (usize, bool)> = BTreeMap::new();
    // Every answer per key, to tell what happened when one is off.
    let mut answers: BTreeMap<(String, &str, String, bool), Vec<&Answer>> = BTreeMap::new();
    let mut unnamed: BTreeMap<Holder, usize> = BTreeMap::new();
    for &e in history {
        let (container, list, member, adds, delete) = match &e.op {
            Op::Create { kind, id, .. } => match id {
                Some(id) => (id.clone(), "", String::new(), true, false),
                None => {
                    if may_have(&e.answer, false) {
                        *unnamed.entry(*kind).or_default() += 1;
                    }
                    continue;
                }
            },
            Op::DeleteContainer { container, .. } => {
                (container.id().to_owned(), "", String::new(), false, true)
            }
            Op::Attach {
                container, file_id, ..
            } => (
                container.id().to_owned(),
                "files",
                file_id.clone(),
                true,
                false,
            ),
            Op::Detach {
                container, file_id, ..
            } => (
                container.id().to_owned(),
                "files",
                file_id.clone(),
                false,
                false,
            ),
            Op::Link {
                agent,
                kind,
                link,
                connect,
                ..
            } => {
                let list = match kind {
                    LinkKind::Mcp => "mcps",
                    LinkKind::Toolset => "toolsets",
                };
                (agent.clone(), list, link.clone(), *connect, false)
            }
            _ => continue,
        };
        let key = (container, list, member, adds);
        answers.entry(key.clone()).or_default().push(&e.answer);
        let entry = sent.entry(key).or_default();
        if may_have(&e.answer, delete) {
            entry.0 += 1;
        }
        entry.1 |= e.answer == Answer::Ok;
    }
    let mut seen: BTreeMap<(String, &str, String, bool), usize> = BTreeMap::new();
    let mut unnamed_seen: BTreeMap<Holder, usize> = BTreeMap::new();
    for e in &fin.events {
        let Some(s) = step(e) else { continue };
        let key = (
            s.container.to_owned(),
            s.list.unwrap_or(""),
            if s.list.is_some() {
                s.member.to_owned()
            } else {
                String::new()
            },
            s.adds,
        );
        if s.list.is_none() && s.adds && !sent.contains_key(&key) {
            *unnamed_seen.entry(s.holder).or_default() += 1;
            continue;
        }
        *seen.entry(key).or_default() += 1;
    }
    let mut wrong = Vec::new();
    for (key, n) in &seen {
        let (may, _) = sent.get(key).copied().unwrap_or_default();
        if *n > may {
            let told = answers.get(key);
            wrong.push(format!(
                "{n} events of {key:?}, which {may} requests that may have applied asked for (answers: {told:?}); {}",
                timeline(history, fin, &key.0)
            ));
        }
    }
    for (key, (_, acked)) in &sent {
        let container_itself = key.1.is_empty();
        if container_itself && *acked && !seen.contains_key(key) {
            let what = if key.3 { "create" } else { "delete" };
            wrong.push(format!("an acknowledged {what} of {} has no event", key.0));
        }
    }
    for (holder, n) in &unnamed_seen {
        let may = unnamed.get(holder).copied().unwrap_or_default();
        if *n > may {
            wrong.push(format!(
                "{n} {holder:?} creations no answer named, of {may} creates whose answer was lost"
            ));
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::history::FinalAgent;

    fn sent(op: Op, answer: Answer) -> Event {
        Event::at_once(op, answer)
    }

    fn event(seq: i64, kind: &str, subject: &str, member: Option<&str>) -> FinalEvent {
        FinalEvent {
            member: member.map(str::to_owned),
            ..FinalEvent::of(seq, kind, subject, "u")
        }
    }

    fn history() -> Vec<Event> {
        let session = Container::Session("s1".into());
        vec![
            sent(
                Op::Create {
                    user: 0,
                    kind: Holder::Session,
                    id: Some("s1".into()),
                },
                Answer::Ok,
            ),
            sent(
                Op::Create {
                    user: 0,
                    kind: Holder::Agent,
                    id: Some("a1".into()),
                },
                Answer::Ok,
            ),
            sent(
                Op::Attach {
                    user: 0,
                    container: session.clone(),
                    file_id: "f1".into(),
                },
                Answer::Ok,
            ),
            // Already there: acknowledged, no event.
            sent(
                Op::Attach {
                    user: 0,
                    container: session.clone(),
                    file_id: "f1".into(),
                },
                Answer::Ok,
            ),
            sent(
                Op::Link {
                    user: 0,
                    agent: "a1".into(),
                    kind: LinkKind::Mcp,
                    link: "m".into(),
                    connect: true,
                },
                Answer::Unknown("transport".into()),
            ),
            sent(
                Op::Attach {
                    user: 0,
                    container: Container::Agent("a1".into()),
                    file_id: "f1".into(),
                },
                Answer::Failed("not_found".into()),
            ),
        ]
    }

    fn clean() -> FinalUser {
        let mut fin = FinalUser {
            id: "u".into(),
            ..Default::default()
        };
        fin.sessions.insert("s1".into(), vec!["f1".into()]);
        fin.agents.insert(
            "a1".into(),
            FinalAgent {
                mcps: vec!["m".into()],
                ..Default::default()
            },
        );
        fin.events = vec![
            event(1, "session.created", "s1", None),
            event(2, "agent.created", "a1", None),
            event(3, "session.file_attached", "s1", Some("f1")),
            event(4, "agent.mcp_connected", "a1", Some("m")),
        ];
        fin
    }

    fn checked(fin: &FinalUser) -> Vec<String> {
        let history = history();
        let mine: Vec<&Event> = history.iter().collect();
        check(&mine, fin)
    }

    fn assert_found(wrong: &[String], what: &str) {
        assert!(
            wrong.iter().any(|w| w.contains(what)),
            "{what:?} not in {wrong:?}"
        );
    }

    #[test]
    fn events_that_replay_to_what_was_read_back_pass() {
        assert_eq!(checked(&clean()), Vec::<String>::new());
    }

    #[test]
    fn an_event_of_nothing_a_failed_request_or_a_missing_one_is_found() {
        let mut twice = clean();
        twice
            .events
            .push(event(5, "session.file_attached", "s1", Some("f1")));
        let wrong = checked(&twice);
        assert_found(&wrong, "changed nothing of its files");
        // Two attaches were acknowledged, but one changed nothing: two
        // events are one more than the container's state allows, which the
        // replay finds; the count allows two.
        assert_eq!(wrong.len(), 1, "{wrong:?}");

        let mut failed = clean();
        failed
            .events
            .push(event(5, "agent.file_attached", "a1", Some("f1")));
        let wrong = checked(&failed);
        assert_found(&wrong, "which 0 requests that may have applied");
        assert_found(&wrong, "the events leave it");

        let mut missing = clean();
        missing.events.remove(2);
        let wrong = checked(&missing);
        assert_found(&wrong, "the events leave it");

        let mut no_create = clean();
        no_create.events.remove(0);
        let wrong = checked(&no_create);
        assert_found(&wrong, "an acknowledged create of s1 has no event");
        assert_found(&wrong, "written to, not being there");
    }

    #[test]
    fn a_deleted_file_leaves_every_container_and_is_attached_no_more() {
        let mut fin = clean();
        fin.sessions.insert("s1".into(), vec![]);
        fin.events.push(event(5, "file.deleted", "f1", None));
        assert_eq!(checked(&fin), Vec::<String>::new());
        fin.events
            .push(event(6, "session.file_attached", "s1", Some("f1")));
        assert_found(&checked(&fin), "after its file.deleted");
    }
}
