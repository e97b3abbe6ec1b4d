//! The fault suite's history: every request it sent and the answer it got,
//! and the checker that holds the final state against it (Jepsen's method).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

/// What a client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: it happened.
    Ok,
    /// 4xx or 503: it did not happen (the code says why).
    Failed(String),
    /// 504 `outcome_unknown`, or no answer at all: it may have happened.
    Unknown(String),
}

/// One request of the workload.
#[derive(Clone, Debug)]
pub enum Op {
    /// `name` is unique per upload, so a failed upload can be looked for.
    Upload {
        name: String,
        sha256: String,
    },
    Delete {
        file_id: String,
    },
    /// `name` is unique per rename, so the rename a file's name came from is known.
    Rename {
        file_id: String,
        name: String,
    },
    AttachSession {
        file_id: String,
    },
    AttachAgent {
        file_id: String,
    },
    /// Connect (true) or disconnect (false) the one MCP link every client shares.
    Link {
        connect: bool,
    },
    /// A link of one client's own: connected once, then perhaps disconnected
    /// once after its connect was acknowledged.
    OwnLink {
        mcp: String,
        connect: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Event {
    pub op: Op,
    pub invoked: Instant,
    pub completed: Instant,
    pub answer: Answer,
    /// The id an acknowledged upload got.
    pub file_id: Option<String>,
}

/// The state read back after healing and one sweep.
#[derive(Debug, Default)]
pub struct FinalState {
    /// Listed files: id → (filename, sha256 of the downloaded bytes, or None if the download failed).
    pub files: HashMap<String, (String, Option<String>)>,
    pub session_files: Vec<String>,
    pub agent_files: Vec<String>,
    pub linked: bool,
    pub mcp_ids: Vec<String>,
    /// Objects without a record, records without an object, intents left.
    pub strays: usize,
    pub missing: usize,
    pub intents: usize,
}

/// What the checker found; every count but the first four must be zero.
#[derive(Debug, Default)]
pub struct Verdict {
    pub requests: usize,
    pub acknowledged: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Acknowledged uploads (not deleted since) that are gone or changed.
    pub lost: usize,
    /// Objects without records, records without objects, intents, dangling ids.
    pub half_done: usize,
    /// The link's final state no acknowledged order explains.
    pub reordered: usize,
    /// Operations answered as failed that nevertheless applied.
    pub failed_but_applied: usize,
    /// 500s: bugs, whatever they did.
    pub internal_errors: usize,
    /// How the answers that were not 2xx break down, by code.
    pub codes: BTreeMap<String, usize>,
    pub notes: Vec<String>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.lost + self.half_done + self.reordered + self.failed_but_applied + self.internal_errors
    }
}

pub fn check(history: &[Event], fin: &FinalState) -> Verdict {
    let mut v = Verdict {
        requests: history.len(),
        ..Default::default()
    };
    for e in history {
        if let Answer::Failed(code) | Answer::Unknown(code) = &e.answer {
            *v.codes.entry(code.clone()).or_default() += 1;
        }
        match &e.answer {
            Answer::Ok => v.acknowledged += 1,
            Answer::Failed(code) if code == "internal" => v.internal_errors += 1,
            Answer::Failed(_) => v.failed += 1,
            Answer::Unknown(_) => v.unknown += 1,
        }
    }
    // Files that may have been deleted: an acknowledged or unknown delete.
    let maybe_deleted: HashSet<&str> = history
        .iter()
        .filter_map(|e| match (&e.op, &e.answer) {
            (Op::Delete { file_id }, Answer::Ok | Answer::Unknown(_)) => Some(file_id.as_str()),
            _ => None,
        })
        .collect();
    let listed_names: HashMap<&str, &str> = fin
        .files
        .iter()
        .map(|(id, (name, _))| (name.as_str(), id.as_str()))
        .collect();
    for e in history {
        match (&e.op, &e.answer) {
            (Op::Upload { sha256, name }, Answer::Ok) => {
                let id = e.file_id.as_deref().unwrap_or_default();
                if maybe_deleted.contains(id) {
                    continue;
                }
                match fin.files.get(id) {
                    Some((_, Some(got))) if got == sha256 => {}
                    other => {
                        v.lost += 1;
                        v.notes
                            .push(format!("upload {name} ({id}) acknowledged, now {other:?}"));
                    }
                }
            }
            (Op::Upload { name, .. }, Answer::Failed(code)) => {
                if let Some(id) = listed_names.get(name.as_str()) {
                    v.failed_but_applied += 1;
                    v.notes
                        .push(format!("upload {name} answered {code} but listed as {id}"));
                }
            }
            (Op::Delete { file_id }, Answer::Failed(code))
                if !fin.files.contains_key(file_id)
                    && !maybe_deleted.contains(file_id.as_str()) =>
            {
                v.failed_but_applied += 1;
                v.notes
                    .push(format!("delete of {file_id} answered {code} but applied"));
            }
            _ => {}
        }
    }
    check_renames(history, fin, &mut v);
    check_attachments(history, fin, &maybe_deleted, &mut v);
    check_link(history, fin, &mut v);
    check_own_links(history, fin, &mut v);
    v.half_done += fin.strays + fin.missing + fin.intents;
    if fin.strays + fin.missing + fin.intents > 0 {
        v.notes.push(format!(
            "{} stray objects, {} records without objects, {} intents",
            fin.strays, fin.missing, fin.intents
        ));
    }
    v
}

/// A file still there bears the name of its last acknowledged rename,
/// unless another rename that may have applied could have come after it;
/// a name only a rename answered failed gave it means that rename applied.
fn check_renames(history: &[Event], fin: &FinalState, v: &mut Verdict) {
    let renames: Vec<(&str, &str, &Event)> = history
        .iter()
        .filter_map(|e| match &e.op {
            Op::Rename { file_id, name } => Some((file_id.as_str(), name.as_str(), e)),
            _ => None,
        })
        .collect();
    for (id, (now, _)) in &fin.files {
        let of_file: Vec<_> = renames.iter().filter(|(f, _, _)| f == id).collect();
        if let Some((_, _, e)) = of_file.iter().find(|(_, name, _)| name == now)
            && let Answer::Failed(code) = &e.answer
        {
            v.failed_but_applied += 1;
            v.notes.push(format!(
                "rename of {id} to {now} answered {code} but applied"
            ));
        }
        for (_, name, r) in of_file.iter().filter(|(_, _, e)| e.answer == Answer::Ok) {
            // Another rename may have applied after this one: it was not
            // answered before this one began, or its outcome is unknown.
            let overtaken = of_file.iter().any(|(_, other, o)| {
                other != name
                    && match o.answer {
                        Answer::Ok => o.completed > r.invoked,
                        Answer::Unknown(_) => true,
                        Answer::Failed(_) => false,
                    }
            });
            if !overtaken && now != name {
                v.lost += 1;
                v.notes.push(format!(
                    "rename of {id} to {name} acknowledged last, but it is named {now}"
                ));
            }
        }
    }
}

/// Acknowledged attaches of files still there are in their container; no
/// container names a file that is gone.
fn check_attachments(
    history: &[Event],
    fin: &FinalState,
    maybe_deleted: &HashSet<&str>,
    v: &mut Verdict,
) {
    for (container, ids) in [("session", &fin.session_files), ("agent", &fin.agent_files)] {
        let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
        for e in history {
            let (Op::AttachSession { file_id } | Op::AttachAgent { file_id }) = &e.op else {
                continue;
            };
            let here = matches!(
                (&e.op, container),
                (Op::AttachSession { .. }, "session") | (Op::AttachAgent { .. }, "agent")
            );
            if here
                && e.answer == Answer::Ok
                && !maybe_deleted.contains(file_id.as_str())
                && !ids.contains(file_id.as_str())
            {
                v.lost += 1;
                v.notes.push(format!(
                    "attach of {file_id} to the {container} acknowledged, now missing"
                ));
            }
        }
        // Only attaches put a file in a container: one that is there with no
        // attach that may have applied came from an attach answered failed.
        let may_have_attached: HashSet<&str> = history
            .iter()
            .filter_map(|e| match (&e.op, &e.answer, container) {
                (Op::AttachSession { file_id }, Answer::Ok | Answer::Unknown(_), "session")
                | (Op::AttachAgent { file_id }, Answer::Ok | Answer::Unknown(_), "agent") => {
                    Some(file_id.as_str())
                }
                _ => None,
            })
            .collect();
        for id in ids.iter().filter(|id| !may_have_attached.contains(*id)) {
            v.failed_but_applied += 1;
            let answers: Vec<String> = history
                .iter()
                .filter(|e| match &e.op {
                    Op::AttachSession { file_id } | Op::AttachAgent { file_id } => file_id == id,
                    _ => false,
                })
                .map(|e| format!("{:?} {:?}", e.op, e.answer))
                .collect();
            v.notes.push(format!(
                "{id} is in the {container}, though every attach of it failed: {answers:?}"
            ));
        }
        for id in &ids {
            if !fin.files.contains_key(*id) {
                v.half_done += 1;
                v.notes
                    .push(format!("the {container} names {id}, which is gone"));
            }
        }
    }
}

/// The shared MCP link ends in the state of some operation that may have
/// applied (acknowledged or unknown) and that no acknowledged operation with
/// the other effect followed in real time.
fn check_link(history: &[Event], fin: &FinalState, v: &mut Verdict) {
    let links: Vec<&Event> = history
        .iter()
        .filter(|e| matches!(e.op, Op::Link { .. }))
        .collect();
    let effect = |e: &Event| matches!(e.op, Op::Link { connect: true });
    let explains = |candidate: Option<&Event>| {
        // An operation whose outcome is unknown may take effect after its
        // answer (a queued one applied once the store is back).
        let done = match candidate {
            None => None,
            Some(c) if matches!(c.answer, Answer::Unknown(_)) => return true,
            Some(c) => Some(c.completed),
        };
        !links.iter().any(|later| {
            later.answer == Answer::Ok
                && effect(later) != fin.linked
                && done.is_none_or(|d| later.invoked > d)
        })
    };
    // The initial state (disconnected) explains it if nothing acknowledged came after.
    let initial = !fin.linked && explains(None);
    let by_op = links.iter().any(|e| {
        !matches!(e.answer, Answer::Failed(_)) && effect(e) == fin.linked && explains(Some(e))
    });
    if !(initial || by_op) {
        v.reordered += 1;
        let tally: BTreeMap<String, usize> = links.iter().fold(BTreeMap::new(), |mut m, e| {
            *m.entry(format!("{:?}/{:?}", e.op, e.answer)).or_default() += 1;
            m
        });
        v.notes.push(format!(
            "link ends {} which no acknowledged order explains: {tally:?}",
            fin.linked
        ));
    }
}

/// Each client's own links end as the history says: an acknowledged
/// connect with no disconnect since is there; an acknowledged disconnect
/// is gone; an operation answered failed changed nothing.
fn check_own_links(history: &[Event], fin: &FinalState, v: &mut Verdict) {
    let present: HashSet<&str> = fin.mcp_ids.iter().map(String::as_str).collect();
    type Answers<'a> = (Option<&'a Answer>, Option<&'a Answer>);
    let mut by_link: BTreeMap<&str, Answers<'_>> = BTreeMap::new();
    for e in history {
        if let Op::OwnLink { mcp, connect } = &e.op {
            let entry = by_link.entry(mcp.as_str()).or_default();
            if *connect {
                entry.0 = Some(&e.answer);
            } else {
                entry.1 = Some(&e.answer);
            }
        }
    }
    for (mcp, (connect, disconnect)) in by_link {
        let here = present.contains(mcp);
        let wrong = match (connect, disconnect) {
            (Some(Answer::Failed(_)), _) if here => {
                Some((&mut v.failed_but_applied, "its connect failed"))
            }
            (Some(Answer::Ok), None) if !here => {
                Some((&mut v.lost, "its connect was acknowledged"))
            }
            (Some(Answer::Ok), Some(Answer::Ok)) if here => Some((
                &mut v.reordered,
                "its disconnect was acknowledged after the connect",
            )),
            (Some(Answer::Ok), Some(Answer::Failed(_))) if !here => {
                Some((&mut v.failed_but_applied, "its disconnect failed"))
            }
            _ => None,
        };
        if let Some((count, why)) = wrong {
            *count += 1;
            let now = if here { "there" } else { "gone" };
            v.notes.push(format!("link {mcp}: {why}, yet it is {now}"));
        }
    }
}
