//! The feed under faults (`GET /v1/events` with the admin key): read back
//! after healing and a sweep on each instance (which places what no commit
//! placed: the final sweeps' `upload.expired`), it holds each surviving
//! user's events as they read them, each once, each owner's in sequence
//! order, the cursor moving on with every page; of the user deleted mid-run
//! only a `user.deleted` (one, once the deletion was acknowledged). And a
//! reader that followed the feed through the faults (small pages, long
//! polls, any instance) saw exactly it, but for the deleted user's events
//! it read before their deletion removed them: none skipped, none twice.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    helpers::ADMIN_KEY,
    support::{
        event_checks::parsed,
        history::{Answer, Event, FinalEvent, FinalUser, Op},
        verdict::Verdict,
    },
};

const PAGE: usize = 1000;
/// How long the feed may take to hold every event the users read: an
/// instance killed in the middle of a placing leaves its transaction open
/// on the feed's counter until the store reaps it (60 s, MongoDB's and
/// SecantusDB's `transactionLifetimeLimitSeconds`), and no sequencer
/// places anything until then (seen: a kill at the end of a run).
const SETTLE: Duration = Duration::from_secs(90);

/// The feed as read: its events in order, and what was wrong with the
/// reading itself.
#[derive(Default)]
pub struct FeedRead {
    pub events: Vec<FinalEvent>,
    pub off: Vec<String>,
}

/// The whole feed, `PAGE` at a time from the first.
async fn read_feed(client: &reqwest::Client, base: &str) -> FeedRead {
    let mut read = FeedRead::default();
    let mut after: i64 = 0;
    loop {
        let url = format!("{base}/v1/events?after={after}&limit={PAGE}");
        let res = client.get(url).bearer_auth(ADMIN_KEY).send().await;
        let Ok(res) = res else {
            read.off
                .push(format!("the feed after {after} was not answered"));
            return read;
        };
        let status = res.status();
        let page: Value = res.json().await.unwrap_or(Value::Null);
        if status != StatusCode::OK {
            read.off
                .push(format!("the feed after {after} answered {status}: {page}"));
            return read;
        }
        match next_page(&page, after, PAGE) {
            Ok((got, _)) if got.is_empty() => return read,
            Ok((got, cursor)) => {
                after = cursor;
                read.events.extend(got);
            }
            Err(wrong) => {
                read.off.push(wrong);
                return read;
            }
        }
    }
}

/// A page of the feed read after `after` with `limit`: its events and the
/// cursor to read on from; or what is wrong with it (a cursor that does
/// not move on past its events, or goes back).
fn next_page(page: &Value, after: i64, limit: usize) -> Result<(Vec<FinalEvent>, i64), String> {
    let got: Vec<FinalEvent> = (page["events"].as_array().into_iter().flatten())
        .map(parsed)
        .collect();
    let cursor = page["cursor"].as_str().and_then(|c| c.parse::<i64>().ok());
    match (got.is_empty(), cursor) {
        // None, the cursor at the feed's end (past places that deleted
        // users' events left empty).
        (true, Some(c)) if c >= after => Ok((got, c)),
        (false, Some(c)) if c >= after + got.len() as i64 && got.len() <= limit => Ok((got, c)),
        _ => Err(format!(
            "the feed's page after {after} of {} events has cursor {:?}",
            got.len(),
            page["cursor"]
        )),
    }
}

/// The feed once it holds every event `users` read (or [`SETTLE`] passed),
/// after a sweep on each of `bases`.
pub async fn read_feed_settled(bases: &[String], users: &[FinalUser]) -> FeedRead {
    let client = reqwest::Client::new();
    for base in bases {
        let sweep = client
            .post(format!("{base}/v1/admin/sweep"))
            .bearer_auth(ADMIN_KEY)
            .timeout(Duration::from_secs(60));
        let _ = sweep.send().await;
    }
    let read: HashSet<(String, i64)> = users
        .iter()
        .flat_map(|u| u.events.iter().map(|e| (e.owner.clone(), e.seq)))
        .collect();
    let deadline = Instant::now() + SETTLE;
    loop {
        let feed = read_feed(&client, &bases[0]).await;
        let placed: HashSet<(String, i64)> = (feed.events.iter())
            .map(|e| (e.owner.clone(), e.seq))
            .collect();
        if read.is_subset(&placed) || !feed.off.is_empty() || Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The page size of the reader that follows the feed: small, so that its
/// cursor moves through the middle of the feed.
const FOLLOW_PAGE: usize = 7;

/// A reader following the feed while the suite runs.
pub struct Follower {
    task: JoinHandle<FeedRead>,
    stop: CancellationToken,
}

/// Follows the feed from its start, a page at a time from the instances
/// in turn, long polling when it has caught up; a read that fails (the
/// faults) is tried again.
pub fn follow_feed(bases: Vec<String>) -> Follower {
    let stop = CancellationToken::new();
    let task = tokio::spawn(follow(bases, stop.clone()));
    Follower { task, stop }
}

impl Follower {
    /// What it read, once it has read to the end of the feed as it is now.
    pub async fn finish(self) -> FeedRead {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

async fn follow(bases: Vec<String>, stop: CancellationToken) -> FeedRead {
    let client = reqwest::Client::new();
    let mut read = FeedRead::default();
    let (mut after, mut turn, mut failures_after_stop) = (0_i64, 0, 0);
    loop {
        let catching_up = stop.is_cancelled();
        let wait = if catching_up { 0 } else { 2 };
        let base = &bases[turn % bases.len()];
        turn += 1;
        let url = format!("{base}/v1/events?after={after}&limit={FOLLOW_PAGE}&wait={wait}");
        let res = (client.get(url).bearer_auth(ADMIN_KEY))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        let (status, page) = match res {
            Ok(res) => (
                res.status(),
                res.json::<Value>().await.unwrap_or(Value::Null),
            ),
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, Value::Null),
        };
        if status != StatusCode::OK {
            if status == StatusCode::GONE || status == StatusCode::BAD_REQUEST {
                read.off.push(format!(
                    "following: after {after} answered {status}: {page}"
                ));
                return read;
            }
            failures_after_stop += usize::from(catching_up);
            if failures_after_stop > 50 {
                read.off.push(format!(
                    "following: the feed after {after} not read at the end"
                ));
                return read;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        match next_page(&page, after, FOLLOW_PAGE) {
            Ok((got, cursor)) if got.is_empty() => {
                after = cursor;
                if catching_up {
                    return read;
                }
            }
            Ok((got, cursor)) => {
                after = cursor;
                read.events.extend(got);
            }
            Err(wrong) => {
                read.off.push(format!("following: {wrong}"));
                return read;
            }
        }
    }
}

/// What the follower read that the final feed does not hold, in the same
/// order: only the deleted user's events it read before they were removed
/// (and their `user.deleted` stays).
fn wrong_follow(followed: &FeedRead, feed: &FeedRead, doomed: &str) -> Vec<String> {
    let mut out = followed.off.clone();
    let kept: Vec<&FinalEvent> = (followed.events.iter())
        .filter(|e| e.owner != doomed || e.kind == "user.deleted")
        .collect();
    let fin: Vec<&FinalEvent> = feed.events.iter().collect();
    if kept != fin {
        let at = kept.iter().zip(&fin).position(|(a, b)| a != b);
        let at = at.unwrap_or(kept.len().min(fin.len()));
        out.push(format!(
            "the follower read {} events (of the survivors), the feed holds {}; first differing at {at}: {:?} against {:?}",
            kept.len(),
            fin.len(),
            kept.get(at),
            fin.get(at)
        ));
    }
    out
}

/// Holds what the follower read against the final feed.
pub fn check_followed(followed: &FeedRead, feed: &FeedRead, doomed: &str, v: &mut Verdict) {
    let wrong = wrong_follow(followed, feed, doomed);
    v.bad_events += wrong.len();
    v.notes
        .extend(wrong.into_iter().map(|w| format!("feed: {w}")));
}

/// What is wrong with `feed` against the users' own reads (`users`) and
/// the deleted user (`doomed`, whose deletion `doomed_history` holds).
fn wrong(
    feed: &FeedRead,
    users: &[FinalUser],
    doomed: &str,
    doomed_history: &[&Event],
) -> Vec<String> {
    let mut out = feed.off.clone();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut seen: HashMap<(&str, i64), &FinalEvent> = HashMap::new();
    for e in &feed.events {
        if seen.insert((&e.owner, e.seq), e).is_some() {
            out.push(format!("{}'s event {} twice in the feed", e.owner, e.seq));
        }
        let before = last.insert(&e.owner, e.seq).unwrap_or(0);
        if e.seq <= before {
            out.push(format!(
                "{}'s event {} after their {before} in the feed",
                e.owner, e.seq
            ));
        }
    }
    for u in users {
        for e in &u.events {
            match seen.get(&(e.owner.as_str(), e.seq)) {
                Some(placed) if *placed == e => {}
                Some(placed) => out.push(format!(
                    "{}'s event {} reads {placed:?} in the feed, {e:?} to its owner",
                    e.owner, e.seq
                )),
                None => out.push(format!(
                    "{}'s event {} ({}) never in the feed",
                    e.owner, e.seq, e.kind
                )),
            }
        }
    }
    let of_doomed: Vec<&FinalEvent> = feed.events.iter().filter(|e| e.owner == doomed).collect();
    if of_doomed.iter().any(|e| e.kind != "user.deleted") || of_doomed.len() > 1 {
        out.push(format!(
            "the deleted user's events in the feed: {of_doomed:?}"
        ));
    }
    let deleted = doomed_history
        .iter()
        .any(|e| matches!(e.op, Op::DeleteUser { .. }) && e.answer == Answer::Ok);
    if deleted && of_doomed.is_empty() {
        out.push("the deleted user's user.deleted is not in the feed".into());
    }
    out
}

/// Holds the feed against the users' reads; counts what is wrong as bad
/// events.
pub fn check_feed(
    feed: &FeedRead,
    users: &[FinalUser],
    doomed: &str,
    doomed_history: &[&Event],
    v: &mut Verdict,
) {
    let wrong = wrong(feed, users, doomed, doomed_history);
    v.bad_events += wrong.len();
    v.notes
        .extend(wrong.into_iter().map(|w| format!("feed: {w}")));
}

/// A line for the summary: how many events the feed held, and the
/// follower read.
pub fn feed_summary(feed: &FeedRead, followed: &FeedRead) -> String {
    format!(
        "feed={} followed={}",
        feed.events.len(),
        followed.events.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(owner: &str, seq: i64, kind: &str) -> FinalEvent {
        FinalEvent::of(seq, kind, "s", owner)
    }

    fn user(events: Vec<FinalEvent>) -> FinalUser {
        FinalUser {
            events,
            ..FinalUser::default()
        }
    }

    #[test]
    fn a_feed_that_holds_each_event_once_in_owner_order_passes() {
        let ann = vec![event("a", 1, "file.created"), event("a", 2, "file.deleted")];
        let bob = vec![event("b", 1, "file.created")];
        let feed = FeedRead {
            events: vec![
                ann[0].clone(),
                bob[0].clone(),
                ann[1].clone(),
                event("d", 3, "user.deleted"),
            ],
            off: vec![],
        };
        let deletion = Event::at_once(Op::DeleteUser { user: 3 }, Answer::Ok);
        let users = [user(ann), user(bob)];
        assert!(wrong(&feed, &users, "d", &[&deletion]).is_empty());
    }

    #[test]
    fn a_feed_that_misses_repeats_reorders_or_keeps_a_deleted_user_s_event_fails() {
        let ann = vec![event("a", 1, "file.created"), event("a", 2, "file.deleted")];
        let users = [user(ann.clone())];
        let missing = FeedRead {
            events: vec![ann[0].clone()],
            off: vec![],
        };
        assert_eq!(wrong(&missing, &users, "d", &[]).len(), 1);
        let twice = FeedRead {
            events: vec![ann[0].clone(), ann[1].clone(), ann[1].clone()],
            off: vec![],
        };
        assert!(!wrong(&twice, &users, "d", &[]).is_empty());
        let reordered = FeedRead {
            events: vec![ann[1].clone(), ann[0].clone()],
            off: vec![],
        };
        assert!(!wrong(&reordered, &users, "d", &[]).is_empty());
        let kept = FeedRead {
            events: vec![
                ann[0].clone(),
                ann[1].clone(),
                event("d", 1, "file.created"),
            ],
            off: vec![],
        };
        assert!(!wrong(&kept, &users, "d", &[]).is_empty());
        let changed = FeedRead {
            events: vec![ann[0].clone(), event("a", 2, "file.renamed")],
            off: vec![],
        };
        assert!(!wrong(&changed, &users, "d", &[]).is_empty());
        // An acknowledged deletion without its user.deleted.
        let deletion = Event::at_once(Op::DeleteUser { user: 3 }, Answer::Ok);
        let complete = FeedRead {
            events: ann.clone(),
            off: vec![],
        };
        assert_eq!(wrong(&complete, &users, "d", &[&deletion]).len(), 1);
    }

    #[test]
    fn a_follower_that_skipped_or_repeated_an_event_is_caught() {
        let feed = FeedRead {
            events: vec![
                event("a", 1, "file.created"),
                event("b", 1, "file.created"),
                event("d", 2, "user.deleted"),
            ],
            off: vec![],
        };
        // The deleted user's first event read, then removed: fine.
        let followed = FeedRead {
            events: vec![
                event("d", 1, "file.created"),
                event("a", 1, "file.created"),
                event("b", 1, "file.created"),
                event("d", 2, "user.deleted"),
            ],
            off: vec![],
        };
        assert!(wrong_follow(&followed, &feed, "d").is_empty());
        let skipped = FeedRead {
            events: vec![event("a", 1, "file.created"), event("d", 2, "user.deleted")],
            off: vec![],
        };
        assert_eq!(wrong_follow(&skipped, &feed, "d").len(), 1);
        let mut twice = feed.events.clone();
        twice.insert(1, event("a", 1, "file.created"));
        let twice = FeedRead {
            events: twice,
            off: vec![],
        };
        assert_eq!(wrong_follow(&twice, &feed, "d").len(), 1);
    }
}
