//! The checker's part for what credentials minted (issue 42), beside
//! `accounts.rs` (which holds each mint's answer to its key's revocation):
//! - a key minted with a key whose revocation was acknowledged before the
//!   mint was sent is not stored, whatever the mint was answered (an
//!   unknown outcome too: its transaction finds the key gone);
//! - at the end, long past the auth cache's lifetime, every credential
//!   answered 201 is tried at every instance: one works exactly when its
//!   key (itself, or the key a token was minted with) is listed, so a
//!   minted credential works until revoked and nothing of a revoked key's
//!   works; the user's first key works;
//! - the keys listed, every page, are at most the cap, none listed twice;
//! - nothing of a deleted user's works.

use std::{collections::BTreeMap, time::Instant};

use crate::support::{
    account_readback::FinalAccount,
    accounts::{revocations, revoked},
    cluster::MAX_KEYS,
    history::{Answer, Event, Op},
    model::Told,
    verdict::Verdict,
};

/// When the revocation of the key named `key` was first acknowledged (a
/// 404 to one: it was gone already).
pub(super) fn revoked_at(history: &[&Event], key: &str) -> Option<Instant> {
    (revocations(history, key).into_iter())
        .filter(|r| revoked(r) == Told::Ok)
        .map(|r| r.completed)
        .min()
}

/// The minted key a mint went with, if any.
fn parent(e: &Event) -> Option<&str> {
    match &e.op {
        Op::MintKey { parent, .. } | Op::MintToken { parent, .. } => parent.as_deref(),
        _ => None,
    }
}

/// Checks what live user `u`'s credentials minted and answer at the end.
pub fn check_minted(history: &[&Event], u: usize, fin: &FinalAccount, v: &mut Verdict) {
    for e in history {
        let Op::MintKey { name, .. } = &e.op else {
            continue;
        };
        let Some(at) = parent(e).and_then(|p| revoked_at(history, p)) else {
            continue;
        };
        // Answered 201 or failed: `check_credentials` and `check_keys` count it.
        if e.invoked > at && e.answer.told() == Told::Maybe && fin.keys.contains(name) {
            let late = e.invoked - at;
            v.note(
                |v| &mut v.lost,
                format!(
                    "user {u}: key {name} stored, minted {late:?} after its key's revocation was acknowledged: {:?} → {:?}",
                    e.op, e.answer
                ),
            );
        }
    }
    for name in &fin.listed_twice {
        v.note(
            |v| &mut v.duplicated,
            format!("user {u}: key {name} listed twice across pages"),
        );
    }
    if fin.keys.len() > MAX_KEYS {
        v.note(
            |v| &mut v.lost,
            format!(
                "user {u}: {} keys listed, past the cap of {MAX_KEYS}",
                fin.keys.len()
            ),
        );
    }
    // A token's key: the one it was minted with (`None`: the first key).
    let token_key: BTreeMap<&str, Option<&str>> = (history.iter())
        .filter_map(|e| match &e.op {
            Op::MintToken { name, parent, .. } => Some((name.as_str(), parent.as_deref())),
            _ => None,
        })
        .collect();
    for (name, statuses) in &fin.probed {
        let Some(works) = verdict_of(statuses) else {
            let note =
                format!("user {u}: credential {name:?} answers {statuses:?} at the instances");
            v.note(|v| &mut v.half_done, note);
            continue;
        };
        // `""` is the first key, never revoked.
        let key = match token_key.get(name.as_str()) {
            Some(k) => *k,
            None => Some(name.as_str()).filter(|n| !n.is_empty()),
        };
        let alive = key.is_none_or(|k| fin.keys.contains(k));
        let why = match (works, alive) {
            (true, false) => "works, though its key is not listed (revoked, or never stored)",
            (false, true) => "is refused, though its key is listed (its mint was answered 201)",
            _ => continue,
        };
        v.note(
            |v| &mut v.lost,
            format!("user {u}: credential {name} (key {key:?}) {why}"),
        );
    }
}

/// `Some(true)` if every instance accepted a credential, `Some(false)` if
/// every one refused it (401), `None` if they disagree or answered otherwise.
fn verdict_of(statuses: &[u16]) -> Option<bool> {
    if statuses.iter().all(|s| *s == 200) {
        Some(true)
    } else if statuses.iter().all(|s| *s == 401) {
        Some(false)
    } else {
        None
    }
}

/// Nothing of deleted user `u`'s works at the end: `probed` is what each
/// of their credentials answered at each instance.
pub fn check_deleted_creds(u: usize, probed: &BTreeMap<String, Vec<u16>>, v: &mut Verdict) {
    for (name, statuses) in probed {
        if verdict_of(statuses) != Some(false) {
            let note = format!("user {u}, deleted: credential {name:?} answers {statuses:?}");
            v.note(|v| &mut v.lost, note);
        }
    }
}

/// The mints' part of the run's line: mints sent with a key after its
/// revocation was acknowledged, and those sent while it ran (each as
/// sent/acknowledged; acknowledged after: a violation).
pub fn mints_summary(history: &[Event]) -> String {
    let all: Vec<&Event> = history.iter().collect();
    let (mut after, mut racing) = ((0, 0), (0, 0));
    for e in &all {
        let Some(p) = parent(e) else { continue };
        let revokes = revocations(&all, p);
        let count = if revoked_at(&all, p).is_some_and(|at| e.invoked > at) {
            &mut after
        } else if (revokes.iter()).any(|r| r.invoked < e.completed && e.invoked < r.completed) {
            &mut racing
        } else {
            continue;
        };
        count.0 += 1;
        count.1 += usize::from(e.answer == Answer::Ok);
    }
    format!(
        "mints_after_revocation={}/{} mints_racing_revocation={}/{}",
        after.0, after.1, racing.0, racing.1
    )
}
