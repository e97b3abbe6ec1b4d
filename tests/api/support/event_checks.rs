//! The events outbox under faults: each surviving user's events (`GET
//! /v1/events`, every page) read back and held against the history of file
//! changes and the files read back. A change writes its event in its own
//! transaction, so an event exists exactly when its change does: whatever
//! the faults, the events are numbered 1, 2, 3… with no gap, one per
//! committed upload, rename and delete; the sessions' and agents' events
//! are checked by `container_event_checks.rs`, the keys' by
//! `key_event_checks.rs`. (A user deleted mid-run is not read: their events
//! went with them.)
//!
//! An event is matched to its change by what the history knows of it: a
//! `file.created` by its subject (an id an answer named: an acknowledged
//! plain upload's, a resumable upload's whatever its answer) or else by
//! its filename (each upload's own, shared only by its resends), as the id
//! of a plain upload whose answer was lost is known to nobody; a
//! `file.renamed` by its subject and filename (each rename's name is its
//! own); a `file.deleted` by its subject.
//!
//! What counts as a bad event (`Verdict::bad_events`):
//! - numbering: seqs that are not 1, 2, 3… in order (a gap, a number read
//!   twice), an event of another owner or of a kind no file change writes,
//!   a page whose cursor is not its last event's number;
//! - missing: an acknowledged upload, rename or delete without its event,
//!   a file there at the end without its `file.created`, a file gone whose
//!   `file.created` no `file.deleted` follows;
//! - extra: an event of a change answered as failed or never sent, a
//!   change's event twice, a `file.created` whose data is not what its
//!   upload sent;
//! - order: a file's events not `file.created`, `file.renamed`…,
//!   `file.deleted`; a file there at the end named otherwise than its last
//!   `file.created` or `file.renamed` says.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
};

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{
    container_event_checks,
    history::{Event, FinalEvent, FinalFile, FinalUser, Op},
    key_event_checks,
    model::Told,
    verdict::Verdict,
};

const CREATED: &str = "file.created";
const RENAMED: &str = "file.renamed";
const DELETED: &str = "file.deleted";
const EXPIRED: &str = "upload.expired";
/// Events one read asks for.
const PAGE: usize = 500;
/// Most events one user has here: past it a cursor that never ends stops
/// the reading.
const MOST: usize = 100_000;

/// Every event of the user whose key is `key`, paged with the cursor each
/// answer returns; and what was off about the pages (checked as bad events).
pub async fn read_events(
    client: &reqwest::Client,
    base: &str,
    key: &str,
) -> (Vec<FinalEvent>, Vec<String>) {
    let (mut events, mut off) = (Vec::new(), Vec::new());
    let mut after = "0".to_owned();
    while events.len() <= MOST {
        let url = format!("{base}/v1/events?after={after}&limit={PAGE}");
        let res = client.get(url).bearer_auth(key).send().await.unwrap();
        let status = res.status();
        let page: Value = res.json().await.unwrap_or(Value::Null);
        if status != StatusCode::OK {
            off.push(format!(
                "GET /v1/events?after={after} answered {status}: {page}"
            ));
            break;
        }
        let got: Vec<FinalEvent> = (page["events"].as_array().into_iter().flatten())
            .map(parsed)
            .collect();
        let cursor = page["cursor"].as_str().unwrap_or_default().to_owned();
        let Some(last) = got.last() else {
            if cursor != after {
                off.push(format!(
                    "an empty page after {after} moved the cursor to {cursor:?}"
                ));
            }
            break;
        };
        if cursor != last.seq.to_string() || got.len() > PAGE {
            off.push(format!(
                "the page after {after} has {} events up to {}, its cursor is {cursor:?}",
                got.len(),
                last.seq
            ));
        }
        // A cursor that does not move on would read the same page forever.
        let moved = matches!(
            (cursor.parse::<i64>(), after.parse::<i64>()),
            (Ok(c), Ok(a)) if c > a
        );
        events.extend(got);
        if !moved {
            off.push(format!(
                "the cursor after {after} did not move on: {cursor:?}"
            ));
            break;
        }
        after = cursor;
    }
    (events, off)
}

/// One event of `GET /v1/events` as the checker keeps it (a field that is
/// missing reads as nothing, and the checks find it wrong).
pub fn parsed(e: &Value) -> FinalEvent {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    FinalEvent {
        seq: e["seq"].as_i64().unwrap_or(-1),
        kind: text(&e["type"]).unwrap_or_default(),
        subject: text(&e["subject"]).unwrap_or_default(),
        owner: text(&e["owner_id"]).unwrap_or_default(),
        filename: text(&e["data"]["filename"]),
        size: e["data"]["size"].as_i64(),
        sha256: text(&e["data"]["sha256"]),
        member: ["file_id", "mcp_id", "toolset_id"]
            .iter()
            .find_map(|f| text(&e["data"][f])),
        name: text(&e["data"]["name"]),
    }
}

/// Holds one user's events against their history (`history`: theirs only).
pub fn check_events(history: &[&Event], fin: &FinalUser, v: &mut Verdict) {
    let uploads = uploads(history);
    let wrong = (fin.events_off.iter().cloned())
        .chain(numbering(fin))
        .chain(created(&uploads, fin))
        .chain(deleted(history, fin))
        .chain(renamed(history, fin))
        .chain(per_file(fin))
        .chain(expired(history, fin))
        .chain(container_event_checks::check(history, fin))
        .chain(key_event_checks::check(history, fin));
    for note in wrong {
        v.note(
            |v| &mut v.bad_events,
            format!("events of {}: {note}", fin.id),
        );
    }
}

/// The seqs are 1, 2, 3… in the order read, every event is the user's,
/// and of a kind a change writes (a new kind of event joins here).
fn numbering(fin: &FinalUser) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut next = 1;
    for e in &fin.events {
        match e.seq.cmp(&next) {
            Ordering::Equal => {}
            Ordering::Greater => wrong.push(format!(
                "a gap: no event numbered {next}..={} before {}",
                e.seq - 1,
                e.seq
            )),
            Ordering::Less => wrong.push(format!(
                "event {} numbered again or out of order (after {})",
                e.seq,
                next - 1
            )),
        }
        next = next.max(e.seq + 1);
        if e.owner != fin.id {
            wrong.push(format!("event {} is of the owner {:?}", e.seq, e.owner));
        }
        let kind = e.kind.as_str();
        let known = [CREATED, RENAMED, DELETED, EXPIRED].iter();
        let known = known.chain(&container_event_checks::KINDS);
        if !known.chain(&key_event_checks::KINDS).any(|k| *k == kind) {
            wrong.push(format!(
                "event {} is a {:?}, which no change writes",
                e.seq, e.kind
            ));
        }
    }
    wrong
}

/// One upload with its resends (they share its name).
struct Sent<'a> {
    name: &'a str,
    sha256: &'a str,
    size: u64,
    answers: Vec<Told>,
    /// The ids its attempts were answered with: an acknowledged plain
    /// upload's, a resumable upload's whatever its answer.
    ids: BTreeSet<&'a str>,
}

impl Sent<'_> {
    /// Acknowledged if any attempt was, failed if every one was.
    fn told(&self) -> Told {
        [Told::Ok, Told::Maybe]
            .into_iter()
            .find(|t| self.answers.contains(t))
            .unwrap_or(Told::Failed)
    }
}

fn uploads<'a>(history: &[&'a Event]) -> BTreeMap<&'a str, Sent<'a>> {
    let mut uploads = BTreeMap::new();
    for &e in history {
        let Op::Upload {
            name, sha256, size, ..
        } = &e.op
        else {
            continue;
        };
        let up = uploads.entry(name.as_str()).or_insert_with(|| Sent {
            name: name.as_str(),
            sha256: sha256.as_str(),
            size: *size,
            answers: Vec::new(),
            ids: BTreeSet::new(),
        });
        up.answers.push(e.answer.told());
        up.ids.extend(e.file_id.as_deref());
    }
    uploads
}

fn of_kind<'a>(fin: &'a FinalUser, kind: &'static str) -> impl Iterator<Item = &'a FinalEvent> {
    fin.events.iter().filter(move |e| e.kind == kind)
}

/// Each upload's `file.created`: one for an acknowledged upload (naming
/// the id it was answered with, if its body was read), at most one for one
/// whose outcome is unknown (whether it has one the file's own events
/// tell: `per_file`), none for one answered as failed; each with the bytes
/// its upload sent.
fn created(uploads: &BTreeMap<&str, Sent<'_>>, fin: &FinalUser) -> Vec<String> {
    let by_id: BTreeMap<&str, &Sent<'_>> = uploads
        .values()
        .flat_map(|up| up.ids.iter().map(move |id| (*id, up)))
        .collect();
    let mut made: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for e in of_kind(fin, CREATED) {
        let origin = (by_id.get(e.subject.as_str()).copied())
            .or_else(|| uploads.get(e.filename.as_deref()?));
        let Some(up) = origin else {
            wrong.push(format!(
                "file.created {} names {} ({:?}), which no upload made",
                e.seq, e.subject, e.filename
            ));
            continue;
        };
        if up.told() == Told::Failed {
            wrong.push(format!(
                "file.created {} names {}, of the upload {}, which was answered failed",
                e.seq, e.subject, up.name
            ));
        }
        wrong.extend(data_off(e, up));
        made.entry(up.name).or_default().push(e.subject.as_str());
    }
    for up in uploads.values() {
        let subjects = made.get(up.name).map_or(&[][..], Vec::as_slice);
        wrong.extend(count_off(up, subjects));
    }
    wrong
}

/// A `file.created` tells the file as its upload sent it.
fn data_off(e: &FinalEvent, up: &Sent<'_>) -> Option<String> {
    let sent = (Some(up.name), Some(up.size as i64), Some(up.sha256));
    let told = (e.filename.as_deref(), e.size, e.sha256.as_deref());
    (told != sent).then(|| {
        format!(
            "file.created {} of {} says (name, size, sha256) {told:?}, its upload sent {sent:?}",
            e.seq, e.subject
        )
    })
}

/// What is off about the subjects of an upload's `file.created` events (a
/// failed upload's are reported each on its own).
fn count_off(up: &Sent<'_>, subjects: &[&str]) -> Option<String> {
    let fine = match (up.told(), subjects) {
        (Told::Failed, _) | (Told::Maybe, []) => true,
        // An upload no answer named an id of was matched by its filename.
        (Told::Ok | Told::Maybe, [id]) => up.ids.is_empty() || up.ids.contains(*id),
        _ => false,
    };
    (!fine).then(|| {
        format!(
            "the upload {} ({:?}, answered with {:?}) has the file.created events of {subjects:?}",
            up.name,
            up.told(),
            up.ids
        )
    })
}

/// An `upload.expired` names a resumable upload of the user's that was not
/// acknowledged (one that was committed its file): by its id, or, for one
/// whose creation's answer was lost (its id known to nobody; the workload
/// records it failed, as no file can come of it), by its name (each
/// upload's own). It has no `file.created` (its file never committed), and
/// is told once.
fn expired(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    let mut by_id: BTreeMap<&str, Told> = BTreeMap::new();
    let mut by_name: BTreeMap<&str, Told> = BTreeMap::new();
    let best = |t: &mut Told, now: Told| {
        if now == Told::Ok || (now == Told::Maybe && *t == Told::Failed) {
            *t = now;
        }
    };
    for &e in history {
        let Op::Upload {
            resumable: true,
            name,
            ..
        } = &e.op
        else {
            continue;
        };
        best(by_name.entry(name).or_insert(Told::Failed), e.answer.told());
        if let Some(id) = &e.file_id {
            best(by_id.entry(id).or_insert(Told::Failed), e.answer.told());
        }
    }
    let created: BTreeSet<&str> = of_kind(fin, CREATED).map(|e| e.subject.as_str()).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut wrong = Vec::new();
    for e in of_kind(fin, EXPIRED) {
        let id = e.subject.as_str();
        let named = e.filename.as_deref().and_then(|n| by_name.get(n));
        let off = match (by_id.get(id), named) {
            (None, None) => Some("no resumable upload of the user's"),
            (Some(Told::Ok), _) | (None, Some(Told::Ok)) => Some("an acknowledged upload"),
            _ if created.contains(id) => Some("an upload whose file.created was read"),
            _ if !seen.insert(id) => Some("an upload told expired before"),
            _ => None,
        };
        if let Some(off) = off {
            wrong.push(format!("upload.expired {} names {id}: {off}", e.seq));
        }
    }
    wrong
}

/// An acknowledged delete has its `file.deleted`; a `file.deleted` names a
/// file a delete was sent for, not every one of them answered as failed.
/// (That a file has at most one is `per_file`'s.)
fn deleted(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    let mut sent: BTreeMap<&str, Vec<Told>> = BTreeMap::new();
    for &e in history {
        if let Op::Delete { file_id, .. } = &e.op {
            sent.entry(file_id.as_str())
                .or_default()
                .push(e.answer.told());
        }
    }
    let events: Vec<&FinalEvent> = of_kind(fin, DELETED).collect();
    let mut wrong = Vec::new();
    for (id, answers) in &sent {
        if answers.contains(&Told::Ok) && !events.iter().any(|e| e.subject == *id) {
            wrong.push(format!(
                "a delete of {id} was acknowledged, yet no file.deleted names it"
            ));
        }
    }
    for e in events {
        let answers = sent.get(e.subject.as_str());
        if answers.is_none_or(|a| a.iter().all(|t| *t == Told::Failed)) {
            wrong.push(format!(
                "file.deleted {} names {}, no delete of which may have applied ({answers:?})",
                e.seq, e.subject
            ));
        }
    }
    wrong
}

/// Each rename's name is its own, so a `file.renamed` is matched to the
/// rename that asked for its name: an acknowledged rename has exactly one,
/// one whose outcome is unknown at most one, one answered as failed (or
/// never sent) none.
fn renamed(history: &[&Event], fin: &FinalUser) -> Vec<String> {
    let mut sent: BTreeMap<(&str, &str), Vec<Told>> = BTreeMap::new();
    for &e in history {
        if let Op::Rename { file_id, name, .. } = &e.op {
            sent.entry((file_id.as_str(), name.as_str()))
                .or_default()
                .push(e.answer.told());
        }
    }
    let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for e in of_kind(fin, RENAMED) {
        let key = (
            e.subject.as_str(),
            e.filename.as_deref().unwrap_or_default(),
        );
        match sent.contains_key(&key) {
            true => *seen.entry(key).or_default() += 1,
            false => wrong.push(format!(
                "file.renamed {} names {} as {:?}, which no rename asked for",
                e.seq, e.subject, e.filename
            )),
        }
    }
    for (key, answers) in &sent {
        let count = seen.get(key).copied().unwrap_or_default();
        let surely = answers.iter().filter(|t| **t == Told::Ok).count();
        let maybe = answers.iter().filter(|t| **t != Told::Failed).count();
        if !(surely..=maybe).contains(&count) {
            let (id, name) = key;
            wrong.push(format!(
                "the rename of {id} to {name} ({answers:?}) has {count} file.renamed events"
            ));
        }
    }
    wrong
}

/// Each file's events, in seq order, against the file read back: its
/// `file.created` first, its renames after, at most one `file.deleted`
/// last (`shape_off`); and how they end (`end_off`).
fn per_file(fin: &FinalUser) -> Vec<String> {
    let mut of: BTreeMap<&str, Vec<&FinalEvent>> = BTreeMap::new();
    for e in fin.events.iter().filter(|e| e.kind.starts_with("file.")) {
        of.entry(e.subject.as_str()).or_default().push(e);
    }
    let mut wrong = Vec::new();
    for (id, events) in &mut of {
        events.sort_by_key(|e| e.seq);
        wrong.extend(shape_off(id, events));
        wrong.extend(end_off(id, events, fin.files.get(*id)));
    }
    for id in fin.files.keys().filter(|id| !of.contains_key(id.as_str())) {
        wrong.push(format!("{id} is there, yet no event names it"));
    }
    wrong
}

fn shape_off(id: &str, events: &[&FinalEvent]) -> Option<String> {
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let in_order = match kinds.as_slice() {
        [] => true,
        [only] => *only == CREATED,
        [first, middle @ .., last] => {
            *first == CREATED
                && middle.iter().all(|k| *k == RENAMED)
                && (*last == RENAMED || *last == DELETED)
        }
    };
    (!in_order).then(|| {
        let seqs: Vec<String> = (events.iter())
            .map(|e| format!("{} {}", e.seq, e.kind))
            .collect();
        format!("the events of {id} are {seqs:?}, not created, renamed…, deleted")
    })
}

/// A file there at the end has its `file.created`, no `file.deleted`, and
/// the name its last `file.created` or `file.renamed` gives it; a file gone
/// whose `file.created` was read has its `file.deleted` (its user is alive:
/// only a user's deletion removes a file without one, and their events).
fn end_off(id: &str, events: &[&FinalEvent], file: Option<&FinalFile>) -> Option<String> {
    let has = |kind: &str| events.iter().any(|e| e.kind == kind);
    match file {
        Some(_) if !has(CREATED) => Some(format!("{id} is there, yet no file.created names it")),
        Some(_) if has(DELETED) => Some(format!("{id} is there, yet a file.deleted names it")),
        Some(file) => {
            let last = (events.iter().rev()).find(|e| e.kind == CREATED || e.kind == RENAMED)?;
            (last.filename.as_deref() != Some(file.name.as_str())).then(|| {
                format!(
                    "{id} is named {}, its last {} ({}) says {:?}",
                    file.name, last.kind, last.seq, last.filename
                )
            })
        }
        None if has(CREATED) && !has(DELETED) => Some(format!(
            "{id} is gone, yet no file.deleted follows its file.created"
        )),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::history::Answer;

    const USER: &str = "u1";
    const SHA: &str = "ab12";

    fn sent(op: Op, answer: Answer, file_id: Option<&str>) -> Event {
        Event {
            file_id: file_id.map(str::to_owned),
            ..Event::at_once(op, answer)
        }
    }

    fn upload(name: &str) -> Op {
        Op::Upload {
            user: 0,
            name: name.to_owned(),
            sha256: SHA.to_owned(),
            size: 3,
            key: None,
            attempt: 0,
            resumable: false,
            via: None,
        }
    }

    fn event(seq: i64, kind: &str, id: &str, name: &str) -> FinalEvent {
        FinalEvent {
            filename: Some(name.to_owned()),
            size: Some(3),
            sha256: Some(SHA.to_owned()),
            ..FinalEvent::of(seq, kind, id, USER)
        }
    }

    fn file(name: &str) -> FinalFile {
        FinalFile {
            name: name.to_owned(),
            size: 3,
            sha256: SHA.to_owned(),
            downloaded: Some(SHA.to_owned()),
            sessions: Vec::new(),
            agents: Vec::new(),
        }
    }

    /// Two acknowledged uploads (the first renamed, the second deleted), one
    /// answered failed, one whose answer was lost and that applied.
    fn history() -> Vec<Event> {
        vec![
            sent(upload("a.bin"), Answer::Ok, Some("f1")),
            sent(upload("b.bin"), Answer::Ok, Some("f2")),
            sent(upload("c.bin"), Answer::Failed("unavailable".into()), None),
            sent(upload("d.bin"), Answer::Unknown("transport".into()), None),
            sent(
                Op::Rename {
                    user: 0,
                    file_id: "f1".into(),
                    name: "r.bin".into(),
                },
                Answer::Ok,
                None,
            ),
            sent(
                Op::Delete {
                    user: 0,
                    file_id: "f2".into(),
                },
                Answer::Ok,
                None,
            ),
        ]
    }

    /// The final state that history explains, with its events.
    fn clean() -> FinalUser {
        let mut fin = FinalUser {
            id: USER.to_owned(),
            ..Default::default()
        };
        fin.files.insert("f1".into(), file("r.bin"));
        fin.files.insert("f4".into(), file("d.bin"));
        fin.events = vec![
            event(1, CREATED, "f1", "a.bin"),
            event(2, CREATED, "f2", "b.bin"),
            event(3, CREATED, "f4", "d.bin"),
            event(4, RENAMED, "f1", "r.bin"),
            event(5, DELETED, "f2", "b.bin"),
        ];
        fin
    }

    fn checked(fin: &FinalUser) -> Verdict {
        let history = history();
        let mine: Vec<&Event> = history.iter().collect();
        let mut v = Verdict::default();
        check_events(&mine, fin, &mut v);
        v
    }

    fn assert_reported(v: &Verdict, what: &str) {
        let found = v.notes.iter().any(|n| n.contains(what));
        assert!(v.bad_events > 0 && found, "{what:?} not in {:?}", v.notes);
    }

    #[test]
    fn events_one_per_change_with_no_gap_pass() {
        let v = checked(&clean());
        assert_eq!(v.bad_events, 0, "{:?}", v.notes);
        assert_eq!(v.violations(), 0);
    }

    #[test]
    fn a_gap_a_number_twice_and_an_event_of_a_failed_upload_are_reported() {
        let mut gap = clean();
        gap.events.remove(1);
        let v = checked(&gap);
        assert_reported(&v, "a gap: no event numbered 2");
        // f2's file.deleted is left without the file.created before it.
        assert_reported(&v, "f2 are");

        let mut twice = clean();
        twice.events.insert(2, event(2, CREATED, "f2", "b.bin"));
        let v = checked(&twice);
        assert_reported(&v, "event 2 numbered again");
        // And the upload b.bin has two file.created events.
        assert_reported(&v, "the upload b.bin");

        let mut failed = clean();
        failed.events.push(event(6, CREATED, "f3", "c.bin"));
        let v = checked(&failed);
        assert_reported(&v, "which was answered failed");
        // No file f3 was read back, and no file.deleted names it.
        assert_reported(&v, "f3 is gone");
    }

    #[test]
    fn an_expiry_names_an_unacknowledged_resumable_upload_by_id_or_by_name() {
        let tus = |name: &str| {
            let mut op = upload(name);
            if let Op::Upload { resumable, .. } = &mut op {
                *resumable = true;
            }
            op
        };
        let mut history = history();
        history.push(sent(
            tus("lost.bin"),
            Answer::Unknown("transport".into()),
            None,
        ));
        history.push(sent(
            tus("lost2.bin"),
            Answer::Failed("create: transport".into()),
            None,
        ));
        history.push(sent(
            tus("gone.bin"),
            Answer::Failed("gone".into()),
            Some("t3"),
        ));
        history.push(sent(tus("done.bin"), Answer::Ok, Some("t4")));
        let mine: Vec<&Event> = history.iter().collect();
        let expiry = |seq, id: &str, name: &str| event(seq, EXPIRED, id, name);
        let check = |extra: Vec<FinalEvent>| {
            let mut fin = clean();
            fin.events.extend(extra);
            fin.files.insert("t4".into(), file("done.bin"));
            fin.events.push(event(99, CREATED, "t4", "done.bin"));
            expired(&mine, &fin)
        };
        assert_eq!(
            check(vec![
                expiry(6, "t9", "lost.bin"),
                expiry(7, "t3", "gone.bin"),
                expiry(8, "t8", "lost2.bin"),
            ]),
            Vec::<String>::new()
        );
        let wrong = check(vec![
            expiry(7, "t4", "done.bin"),
            expiry(8, "t3", "gone.bin"),
            expiry(9, "t3", "gone.bin"),
            expiry(10, "t7", "nobody.bin"),
        ]);
        let expected = [
            "upload.expired 7 names t4: an acknowledged upload",
            "upload.expired 9 names t3: an upload told expired before",
            "upload.expired 10 names t7: no resumable upload of the user's",
        ];
        assert_eq!(wrong, expected);
    }

    #[test]
    fn a_missing_event_of_an_acknowledged_change_is_reported() {
        let mut missing = clean();
        missing.events.truncate(4);
        let v = checked(&missing);
        assert_reported(&v, "a delete of f2 was acknowledged");
        assert_reported(&v, "f2 is gone");

        let mut unnamed = clean();
        unnamed.events.retain(|e| e.subject != "f4");
        for (seq, e) in (1..).zip(&mut unnamed.events) {
            e.seq = seq;
        }
        let v = checked(&unnamed);
        assert_reported(&v, "f4 is there, yet no event");
    }
}
