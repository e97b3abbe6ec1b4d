//! The checker's account part (issue 25), for the writes of
//! `account_workload.rs`:
//! - a key is a register (listed or not) written by its mint and its
//!   revocations; a user's own quota is one written by the quota changes;
//! - a credential whose revocation was acknowledged is refused once the
//!   auth cache has forgotten it (accepted later: the revocation is lost),
//!   and mints nothing from the moment it was (`mints.rs` holds what was
//!   minted, and what every credential answers at the end); one never
//!   revoked is never refused (the mint is lost);
//! - an upload past a quota that was in effect for the whole of it is
//!   refused (acknowledged: the quota is lost);
//! - a deleted user leaves nothing in any store, and no upload of theirs
//!   sent after the deletion was acknowledged is acknowledged (nor any
//!   other write once the auth cache has forgotten them).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use crate::support::{
    account_readback::FinalAccount,
    history::{Answer, Event, Op},
    mints::check_minted,
    model::{Told, Write, explain},
    verdict::{Verdict, Wrong, whats},
};

/// How late past the auth cache's lifetime a credential may still pass:
/// the cache's own clock, a request received a little after it was sent.
pub(super) const SLACK: Duration = Duration::from_secs(1);

/// When the upload `e` is one attempt of was first sent: a resend with its
/// `Idempotency-Key` may be answered with what the first attempt did.
fn first_sent(history: &[&Event], e: &Event) -> Instant {
    let Op::Upload { name, .. } = &e.op else {
        return e.invoked;
    };
    (history.iter())
        .filter(|x| matches!(&x.op, Op::Upload { name: n, .. } if n == name))
        .map(|x| x.invoked)
        .min()
        .unwrap_or(e.invoked)
}

/// A revocation (or a user's deletion) that may have applied: a 404 to it
/// says the key (or the user) was already gone.
pub fn revoked(e: &Event) -> Told {
    match &e.answer {
        Answer::Failed(c) if c == "not_found" => Told::Ok,
        a => a.told(),
    }
}

/// Checks live user `u`'s keys, credentials and quota against `fin`.
pub fn check_account(
    history: &[&Event],
    u: usize,
    fin: &FinalAccount,
    cache: Duration,
    v: &mut Verdict,
) {
    check_keys(history, fin, v);
    check_credentials(history, cache, v);
    check_minted(history, u, fin, v);
    let quotas: Vec<Write<Option<u64>>> = history
        .iter()
        .filter_map(|e| match &e.op {
            Op::SetQuota { quota, .. } => Some(crate::support::verdict::write(e, *quota)),
            _ => None,
        })
        .collect();
    let explained = explain(Some(&None), &quotas, &fin.quota);
    v.judge(explained, Wrong::Lost, || {
        format!(
            "user {u}: quota {:?}, written by {:?}",
            fin.quota,
            whats(&quotas)
        )
    });
    check_quota_held(history, &quotas, v);
}

/// Every key the workload minted: listed at the end iff some order of its
/// mint and revocations the answers allow leaves it.
fn check_keys(history: &[&Event], fin: &FinalAccount, v: &mut Verdict) {
    let names: BTreeSet<&str> = history
        .iter()
        .filter_map(|e| match &e.op {
            Op::MintKey { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    for name in names {
        let writes: Vec<Write<bool>> = history
            .iter()
            .filter_map(|e| {
                let (value, told) = match &e.op {
                    Op::MintKey { name: n, .. } if n == name => (true, e.answer.told()),
                    Op::RevokeKey { name: n, .. } if n == name => (false, revoked(e)),
                    _ => return None,
                };
                let mut w = crate::support::verdict::write(e, value);
                w.told = told;
                Some(w)
            })
            .collect();
        let listed = fin.keys.contains(name);
        let wrong = if listed { Wrong::Order } else { Wrong::Lost };
        v.judge(explain(Some(&false), &writes, &listed), wrong, || {
            format!(
                "key {name}: listed {listed}, written by {:?}",
                whats(&writes)
            )
        });
    }
}

/// Each use of a minted key or token (an upload sent with it, a key or a
/// token minted with it) against that credential's mint and its key's
/// revocations. An upload may pass for the auth cache's lifetime after the
/// revocation was acknowledged; a mint may not pass at all: its
/// transaction finds the key gone, whatever an instance remembers.
fn check_credentials(history: &[&Event], cache: Duration, v: &mut Verdict) {
    // A credential's key: itself, or the key a token was minted with.
    let key_of = |cred: &str| -> Option<String> {
        history.iter().find_map(|e| match &e.op {
            Op::MintKey { name, .. } if name == cred => Some(name.clone()),
            Op::MintToken { name, parent, .. } if name == cred => parent.clone(),
            _ => None,
        })
    };
    for e in history {
        let (cred, allowed) = match &e.op {
            // A link too: an instance that still trusts a revoked key
            // within the window signs one (refused at download).
            Op::Upload { via: Some(c), .. } | Op::MakeLink { via: c, .. } => (c, cache + SLACK),
            Op::MintKey {
                parent: Some(c), ..
            }
            | Op::MintToken {
                parent: Some(c), ..
            } => (c, Duration::ZERO),
            _ => continue,
        };
        let revokes = key_of(cred)
            .map(|k| revocations(history, &k))
            .unwrap_or_default();
        let acked = (revokes.iter())
            .filter(|r| revoked(r) == Told::Ok)
            .map(|r| r.completed)
            .min();
        let refused = matches!(&e.answer, Answer::Failed(c) if c == "unauthenticated");
        if e.answer == Answer::Ok
            && let Some(at) = acked
            && e.invoked > at + allowed
        {
            let late = e.invoked - at;
            v.note(
                |v| &mut v.lost,
                format!(
                    "{cred}: accepted {late:?} after its revocation was acknowledged: {:?}",
                    e.op
                ),
            );
        }
        let may_be_revoked =
            (revokes.iter()).any(|r| revoked(r) != Told::Failed && r.invoked < e.completed);
        if refused && !may_be_revoked {
            v.note(
                |v| &mut v.lost,
                format!("{cred}: refused, though never revoked: {:?}", e.op),
            );
        }
    }
}

/// The revocations of the key named `key`.
pub(super) fn revocations<'a>(history: &[&'a Event], key: &str) -> Vec<&'a Event> {
    (history.iter().copied())
        .filter(|e| matches!(&e.op, Op::RevokeKey { name, .. } if name == key))
        .collect()
}

/// No acknowledged upload larger than a quota in effect from before it
/// was sent until it was answered (an acknowledged change, and no other
/// that may have applied meanwhile).
fn check_quota_held(history: &[&Event], quotas: &[Write<Option<u64>>], v: &mut Verdict) {
    for e in history {
        let Op::Upload { size, .. } = &e.op else {
            continue;
        };
        if e.answer != Answer::Ok {
            continue;
        }
        let sent = first_sent(history, e);
        let in_effect = quotas.iter().find(|w| {
            w.told == Told::Ok
                && w.completed < sent
                && quotas.iter().all(|x| {
                    std::ptr::eq(x, *w)
                        || x.told == Told::Failed
                        || x.invoked >= e.completed
                        || (x.told == Told::Ok && x.completed < w.invoked)
                })
        });
        if let Some(Write {
            value: Some(q),
            what,
            ..
        }) = in_effect
            && size > q
        {
            v.note(
                |v| &mut v.lost,
                format!(
                    "an upload of {size} bytes past the quota of {q} ({what}) acknowledged: {:?}",
                    e.op
                ),
            );
        }
    }
}

/// Checks deleted user `u`: `left` is what still names them.
pub fn check_deleted(
    history: &[&Event],
    u: usize,
    left: &[String],
    cache: Duration,
    v: &mut Verdict,
) {
    // Surely deleting from the first 202 on (or a 404: already gone).
    let sure = (history.iter())
        .filter(|e| matches!(e.op, Op::DeleteUser { .. }))
        .filter(|e| revoked(e) == Told::Ok)
        .map(|e| e.completed)
        .min();
    let Some(sure) = sure else {
        v.note(
            |v| &mut v.half_done,
            format!("user {u}: the deletion was never answered"),
        );
        return;
    };
    for l in left {
        v.note(|v| &mut v.half_done, format!("user {u}, deleted, left {l}"));
    }
    for e in history {
        if e.answer != Answer::Ok || matches!(e.op, Op::DeleteUser { .. }) {
            continue;
        }
        let upload = matches!(e.op, Op::Upload { .. });
        let sent = first_sent(history, e);
        if sent > sure && (upload || sent > sure + cache + SLACK) {
            let after = sent - sure;
            v.note(
                |v| &mut v.lost,
                format!(
                    "user {u}: acknowledged {after:?} after their deletion was: {:?}",
                    e.op
                ),
            );
        }
    }
}

/// The accounts' part of the run's line: each kind's (sent/acknowledged),
/// and what the deleted user left.
pub fn accounts_summary(
    kinds: &std::collections::BTreeMap<&str, (usize, usize)>,
    left: usize,
) -> String {
    let kind = |k: &str| {
        let (sent, acked) = kinds.get(k).copied().unwrap_or_default();
        format!("{k}={sent}/{acked}")
    };
    let kinds: Vec<String> = [
        "mint_key",
        "mint_token",
        "revoke_key",
        "set_quota",
        "delete_user",
    ]
    .into_iter()
    .map(kind)
    .collect();
    format!("{} deleted_user_left={left}", kinds.join(" "))
}
