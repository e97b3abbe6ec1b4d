//! The checker: holds the state read back after healing against the
//! history of requests and answers. Every key's final value must be
//! explained by the acknowledged order (`model.rs`); every record must agree
//! with the others (the user document with the files, each file with its
//! permission and its object, each idempotency record with its file).
//!
//! What counts as what:
//! - lost: an acknowledged write whose effect is not in the final state (an
//!   upload gone or changed, a 2xx delete whose file or container is still
//!   there or still answers, an attach or connect missing or acknowledged
//!   on a container already deleted);
//! - reordered: a value only an order other than the acknowledged one
//!   explains (a file in a container or a link there after its acknowledged
//!   removal, a container after its acknowledged delete, a name from an
//!   overtaken rename, an array listed out of order);
//! - failed-but-applied: a value only a write answered as failed explains;
//! - half-done: records that disagree (usage, file ids, permissions,
//!   idempotency records, back-references, objects, intents, dangling ids);
//! - duplicated: one upload (with its resends) that made two files;
//! - internal errors: any 500;
//! - bad events: the user's events are not one per committed change to a
//!   file, numbered 1, 2, 3… with no gap (`event_checks.rs`).

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{
    event_checks,
    history::{Answer, Event, FinalFile, FinalState, FinalUser, Op},
    lives,
    model::{Told, Write, explain},
    sets,
    verdict::{Verdict, Wrong, whats, write},
};

/// One upload and its resends (same name, same key).
struct Upload<'a> {
    name: &'a str,
    sha256: &'a str,
    size: u64,
    key: Option<&'a str>,
    attempts: Vec<&'a Event>,
    /// The ids its acknowledged attempts were answered with.
    ids: BTreeSet<&'a str>,
}

impl Upload<'_> {
    fn told(&self) -> Told {
        let answers = || self.attempts.iter().map(|e| e.answer.told());
        if answers().any(|t| t == Told::Ok) {
            Told::Ok
        } else if answers().any(|t| t == Told::Maybe) {
            Told::Maybe
        } else {
            Told::Failed
        }
    }

    /// The upload as one write: from its first attempt to its first
    /// acknowledged one (or its last).
    fn as_write<V>(&self, value: V) -> Write<V> {
        let first = self.attempts[0];
        let done = self
            .attempts
            .iter()
            .find(|e| e.answer == Answer::Ok)
            .unwrap_or(self.attempts.last().unwrap());
        Write {
            value,
            invoked: first.invoked,
            completed: done.completed,
            told: self.told(),
            what: format!("upload {} ({} attempts)", self.name, self.attempts.len()),
        }
    }
}

pub fn check(history: &[Event], fin: &FinalState) -> Verdict {
    let mut v = Verdict {
        requests: history.len(),
        ..Default::default()
    };
    for e in history {
        let kind = v.kinds.entry(e.op.kind()).or_default();
        kind.0 += 1;
        match &e.answer {
            Answer::Ok => {
                v.acknowledged += 1;
                kind.1 += 1;
            }
            Answer::Failed(_) => v.failed += 1,
            Answer::Unknown(_) => v.unknown += 1,
            Answer::Internal(code) => {
                v.internal_errors += 1;
                v.notes
                    .push(format!("500 {code}: {:?} (a bug, whatever it did)", e.op));
            }
        }
        if let Some(code) = e.answer.code() {
            *v.codes
                .entry(format!("{} {code}", e.op.kind()))
                .or_default() += 1;
        }
    }
    for (u, user) in fin.users.iter().enumerate() {
        let mine: Vec<&Event> = history.iter().filter(|e| e.op.user() == u).collect();
        check_user(&mine, user, fin, &mut v);
    }
    let present: BTreeSet<&str> = fin
        .users
        .iter()
        .flat_map(|u| u.files.keys().map(String::as_str))
        .collect();
    for (file, user, role) in &fin.permissions {
        if !present.contains(file.as_str()) {
            v.note(
                |v| &mut v.half_done,
                format!("a {role} permission of {user} on {file}, which is gone"),
            );
        }
    }
    for (user, key, file) in &fin.idempotency {
        if !present.contains(file.as_str()) {
            v.note(
                |v| &mut v.half_done,
                format!("{user}'s idempotency key {key} names {file}, which is gone"),
            );
        }
    }
    if fin.strays + fin.missing + fin.intents > 0 {
        v.half_done += fin.strays + fin.missing + fin.intents;
        v.notes.push(format!(
            "{} stray objects, {} records without objects, {} intents",
            fin.strays, fin.missing, fin.intents
        ));
    }
    let multipart = fin.multipart.unwrap_or(0);
    v.open_defects += fin.multipart_empty;
    if fin.resumables + fin.staging + multipart + fin.multipart_empty > 0 {
        v.half_done += fin.resumables + fin.staging + multipart;
        v.notes.push(format!(
            "after expiry and a sweep: {} resumable states, {} staging objects, {multipart} multipart uploads holding parts, {} empty ones",
            fin.resumables, fin.staging, fin.multipart_empty
        ));
    }
    v
}

fn check_user(history: &[&Event], fin: &FinalUser, all: &FinalState, v: &mut Verdict) {
    let mut uploads: BTreeMap<&str, Upload<'_>> = BTreeMap::new();
    for e in history {
        if let Op::Upload {
            name,
            sha256,
            size,
            key,
            ..
        } = &e.op
        {
            let up = uploads.entry(name).or_insert_with(|| Upload {
                name,
                sha256,
                size: *size,
                key: key.as_deref(),
                attempts: Vec::new(),
                ids: BTreeSet::new(),
            });
            up.attempts.push(e);
            if let (Answer::Ok, Some(id)) = (&e.answer, &e.file_id) {
                up.ids.insert(id);
            }
        }
    }
    let by_id: BTreeMap<&str, &Upload<'_>> = uploads
        .values()
        .flat_map(|up| up.ids.iter().map(move |id| (*id, up)))
        .collect();

    // Every file has an upload it came from, with its bytes; no upload made two.
    let mut made: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, file) in &fin.files {
        let origin = by_id.get(id.as_str()).copied().or_else(|| {
            uploads
                .get(file.name.as_str())
                .filter(|up| up.ids.is_empty())
        });
        let Some(up) = origin else {
            v.note(
                |v| &mut v.half_done,
                format!("{id} ({}) is a file no upload made", file.name),
            );
            continue;
        };
        made.entry(up.name).or_default().push(id);
        if up.told() == Told::Failed {
            v.note(
                |v| &mut v.failed_but_applied,
                format!("upload {} answered failed, yet it is {id}", up.name),
            );
        }
        check_bytes(id, file, up, v);
    }
    for (name, ids) in &made {
        if ids.len() > 1 {
            v.note(
                |v| &mut v.duplicated,
                format!("upload {name} (with its resends) made {ids:?}"),
            );
        }
    }
    for up in uploads.values().filter(|up| up.ids.len() > 1) {
        v.note(
            |v| &mut v.duplicated,
            format!("upload {} was acknowledged as {:?}", up.name, up.ids),
        );
    }

    // An upload answered 2xx whose body named no file (it could not be
    // read) has no id to look for: a file with its name must be there
    // (no rename or delete can have reached it without the id).
    for up in uploads.values().filter(|up| up.ids.is_empty()) {
        let unnamed = up
            .attempts
            .iter()
            .any(|e| e.answer == Answer::Ok && e.file_id.is_none());
        if unnamed && !made.contains_key(up.name) {
            v.note(
                |v| &mut v.lost,
                format!(
                    "upload {} was acknowledged (its body unread), yet no file has its name",
                    up.name
                ),
            );
        }
    }

    let stored: BTreeSet<&str> = fin.files.keys().map(String::as_str).collect();
    let listed: BTreeSet<&str> = fin.listed.iter().map(String::as_str).collect();
    if stored != listed || listed.len() != fin.listed.len() {
        v.note(
            |v| &mut v.half_done,
            format!(
                "{}: the store has {stored:?}, GET /v1/files lists {:?}",
                fin.id, fin.listed
            ),
        );
    }
    check_existence(history, fin, all, &by_id, v);
    check_names(history, fin, &by_id, &uploads, v);
    check_user_document(fin, all, &uploads, v);
    sets::check_containers(history, fin, v);
    sets::check_links(history, fin, v);
    lives::check_lives(history, fin, v);
    event_checks::check_events(history, fin, v);
}

fn check_bytes(id: &str, file: &FinalFile, up: &Upload<'_>, v: &mut Verdict) {
    if file.downloaded.as_deref() != Some(up.sha256) || file.sha256 != up.sha256 {
        v.note(
            |v| &mut v.lost,
            format!(
                "{id} (upload {}) downloads as {:?}, its record says {}, sent {}",
                up.name, file.downloaded, file.sha256, up.sha256
            ),
        );
    }
    if file.size != up.size as i64 {
        v.note(
            |v| &mut v.lost,
            format!("{id} is {} bytes, its upload {}", file.size, up.size),
        );
    }
}

/// Each acknowledged upload's file exists unless a delete may have come
/// after; a file an acknowledged delete removed is not listed and does not
/// download.
fn check_existence(
    history: &[&Event],
    fin: &FinalUser,
    all: &FinalState,
    by_id: &BTreeMap<&str, &Upload<'_>>,
    v: &mut Verdict,
) {
    for (id, up) in by_id {
        let mut writes = vec![up.as_write(true)];
        writes.extend(history.iter().filter_map(|e| match &e.op {
            Op::Delete { file_id, .. } if file_id == id => Some(write(e, false)),
            _ => None,
        }));
        let present = fin.files.contains_key(*id);
        let explained = explain(Some(&false), &writes, &present);
        v.judge(explained, Wrong::Lost, || {
            let now = if present { "there" } else { "gone" };
            format!("{id} (upload {}) is {now}: {:?}", up.name, whats(&writes))
        });
        if let Some((meta, content)) = fin.gone.get(*id)
            && (*meta, *content) != (404, 404)
        {
            v.note(
                |v| &mut v.lost,
                format!("{id} is not listed, yet GET answers {meta} and its content {content}"),
            );
        }
        // A delete puts the blob on the sweeper's list in its transaction
        // (an orphan record), so that no crash or cut leaves it behind.
        let object = format!("files/{}/{id}", fin.id);
        if !present && !all.orphans.contains(&object) {
            v.note(
                |v| &mut v.half_done,
                format!("{id} is gone, but its object {object} was never recorded as an orphan"),
            );
        }
    }
}

/// A file's name is its upload's or a rename's that the acknowledged
/// order can put last.
fn check_names(
    history: &[&Event],
    fin: &FinalUser,
    by_id: &BTreeMap<&str, &Upload<'_>>,
    uploads: &BTreeMap<&str, Upload<'_>>,
    v: &mut Verdict,
) {
    for (id, file) in &fin.files {
        let Some(up) = by_id
            .get(id.as_str())
            .copied()
            .or_else(|| uploads.get(file.name.as_str()))
        else {
            continue;
        };
        let mut writes = vec![up.as_write(up.name.to_owned())];
        writes.extend(history.iter().filter_map(|e| match &e.op {
            Op::Rename { file_id, name, .. } if file_id == id => Some(write(e, name.clone())),
            _ => None,
        }));
        let explained = explain(None, &writes, &file.name);
        v.judge(explained, Wrong::Order, || {
            format!("{id} is named {}: {:?}", file.name, whats(&writes))
        });
    }
}

/// The user document, `/v1/me`, the permissions and the idempotency records
/// agree with the files there are.
fn check_user_document(
    fin: &FinalUser,
    all: &FinalState,
    uploads: &BTreeMap<&str, Upload<'_>>,
    v: &mut Verdict,
) {
    let user = &fin.id;
    let sum: i64 = fin.files.values().map(|f| f.size).sum();
    if fin.used_bytes != sum {
        v.note(
            |v| &mut v.half_done,
            format!(
                "{user}: used_bytes {} but the files add up to {sum}",
                fin.used_bytes
            ),
        );
    }
    let files: Vec<String> = fin.files.keys().cloned().collect();
    if fin.file_count != files.len() as i64 {
        v.note(
            |v| &mut v.half_done,
            format!(
                "{user}: file_count {} but the store holds {} files",
                fin.file_count,
                files.len()
            ),
        );
    }
    if fin.me != (sum, files.len() as i64) {
        v.note(
            |v| &mut v.half_done,
            format!(
                "{user}: /v1/me says {:?}, the files {sum} bytes in {}",
                fin.me,
                files.len()
            ),
        );
    }
    if let Some(off) = fin.counters_off() {
        v.note(|v| &mut v.half_done, off);
    }
    for id in &files {
        let owners: Vec<_> = all
            .permissions
            .iter()
            .filter(|(file, _, _)| file == id)
            .collect();
        if owners.len() != 1 || owners[0].1 != *user || owners[0].2 != "owner" {
            v.note(
                |v| &mut v.half_done,
                format!("{id} of {user} has the permissions {owners:?}"),
            );
        }
    }
    // A file its upload made under a key answers a resend with that key.
    for up in uploads.values() {
        let Some(key) = up.key else { continue };
        let record = all
            .idempotency
            .iter()
            .find(|(u, k, _)| u == user && k == key)
            .map(|(_, _, f)| f.as_str());
        let made: Vec<&str> = fin
            .files
            .iter()
            .filter(|(id, f)| {
                up.ids.contains(id.as_str()) || (up.ids.is_empty() && f.name == up.name)
            })
            .map(|(id, _)| id.as_str())
            .collect();
        match (made.as_slice(), record) {
            ([], _) => {} // deleted (the key is free again) or never made
            ([id], Some(r)) if r == *id => {}
            (made, record) => v.note(
                |v| &mut v.half_done,
                format!("{user}'s key {key}: files {made:?}, its record names {record:?}"),
            ),
        }
    }
}
