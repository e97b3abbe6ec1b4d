//! One leased partition's events waiting for delivery, queued by owner: an
//! owner's head is the one event of theirs in flight or next, so that
//! their events go one at a time, in order.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};

use crate::{
    meta::{EventRecord, WebhookMark},
    vocab::UserId,
};

/// The first pause after a failed attempt (then doubling, up to the
/// setting's most, each drawn at random below it: full jitter).
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The events of one owner held at most: past it, their next ones are
/// read from the owner's own events as the queue drains (one owner's
/// burst never fills the dispatcher and holds up the others).
pub(super) const PER_OWNER: usize = 256;
/// The owners a mark names at most (any of them left out costs only a
/// duplicate after the lease moves).
const MARK_OWNERS: usize = 10_000;

#[derive(Default)]
pub(super) struct Owner {
    /// The number of the owner's last event delivered or dead-lettered (0:
    /// none past the mark this holder started from).
    pub delivered: i64,
    /// The feed position of that event: the owner's number is kept with
    /// the partition's mark while this is past it.
    pub last_feed: i64,
    pub queue: VecDeque<EventRecord>,
    /// Its head is being delivered (or its number read).
    pub busy: bool,
    /// Attempts at its head so far.
    pub attempts: u32,
    /// No attempt before this (a pause after a failure).
    pub not_before: Option<Instant>,
    /// The queue was full when an event of theirs was read from the feed:
    /// a feed position at or below that of the first one not queued (their
    /// later ones are read from their own events: [`Refill`]).
    pub overflow: Option<i64>,
    /// A read of their own events is under way.
    pub refilling: bool,
}

/// Events read from one owner's own events for a queue that overflowed,
/// after their last queued, when the partition had read the feed up to
/// `read`, at most `limit`.
pub(super) struct Refill {
    pub events: Vec<EventRecord>,
    pub read: i64,
    pub limit: usize,
}

impl Owner {
    /// The head got its answer: the next one is up.
    pub fn done(&mut self) {
        if let Some(head) = self.queue.pop_front() {
            self.delivered = self.delivered.max(head.seq);
            self.last_feed = self.last_feed.max(head.feed.unwrap_or(0));
        }
        self.attempts = 0;
        self.not_before = None;
    }

    /// The head's attempt failed: the next after a pause.
    pub fn failed(&mut self, most: Duration) {
        self.attempts += 1;
        self.not_before = Some(Instant::now() + pause(self.attempts, most));
    }

    fn ready(&self, now: Instant) -> bool {
        !self.busy && !self.queue.is_empty() && self.not_before.is_none_or(|t| t <= now)
    }

    /// Whether to read on from their own events (and after which number).
    pub fn refill_after(&self) -> Option<i64> {
        let short = self.queue.len() < PER_OWNER / 2;
        (self.overflow.is_some() && !self.refilling && short)
            .then(|| self.queue.back().map_or(self.delivered, |e| e.seq))
    }

    /// Takes a refill in, `read` the partition's position now.
    pub fn refilled(&mut self, refill: Refill, read: i64) {
        self.refilling = false;
        let mut last = None;
        let mut complete = refill.events.len() < refill.limit;
        for e in refill.events {
            match e.feed {
                // Past what the partition had read: the feed brings it.
                Some(f) if f <= refill.read => {}
                _ => {
                    complete = true;
                    break;
                }
            }
            if e.seq > self.queue.back().map_or(self.delivered, |b| b.seq) {
                last = e.feed;
                self.queue.push_back(e);
            }
        }
        // Caught up if nothing of theirs was read from the feed (and left
        // out) meanwhile; else what is past `bound` is read next time.
        let bound = match complete {
            true => refill.read,
            false => last.unwrap_or(refill.read),
        };
        self.overflow = match complete && read == refill.read {
            true => None,
            false => Some(bound + 1),
        };
    }
}

/// The pause after `attempts` failed attempts: random, below the
/// exponential step (1 s, 2 s, 4 s… up to `most`).
pub(super) fn pause(attempts: u32, most: Duration) -> Duration {
    let step = FIRST_PAUSE
        .saturating_mul(1 << attempts.saturating_sub(1).min(20))
        .min(most);
    step.mul_f64(rand::random::<f64>())
}

/// A partition this instance holds the lease of (the lease is the
/// dispatcher's).
pub(super) struct Partition {
    /// The feed position it has read up to.
    pub read: i64,
    /// The mark last written to the store (or read from it).
    pub saved: WebhookMark,
    pub owners: HashMap<UserId, Owner>,
}

impl Partition {
    /// A partition just leased, to read from `mark` on.
    pub fn new(mark: WebhookMark) -> Self {
        // Their delivered events are past the mark: kept with it until the
        // mark passes the position of the next one read.
        let owners = mark
            .owners
            .iter()
            .filter_map(|(id, &n)| {
                let owner = Owner {
                    delivered: n,
                    last_feed: mark.position + 1,
                    ..Owner::default()
                };
                id.parse().ok().map(|id| (id, owner))
            })
            .collect();
        Self {
            read: mark.position,
            saved: mark,
            owners,
        }
    }

    /// Queues `event` (read from the feed) unless it was read or
    /// delivered before.
    pub fn take(&mut self, event: EventRecord) {
        let feed = event.feed.unwrap_or(0);
        if feed <= self.read {
            return;
        }
        let owner = self.owners.entry(event.owner_id).or_default();
        if event.seq <= owner.delivered {
            owner.last_feed = owner.last_feed.max(feed);
        } else if owner.overflow.is_some() {
            // Read later from their own events.
        } else if owner.queue.len() >= PER_OWNER {
            owner.overflow = Some(feed);
        } else if owner.queue.back().is_none_or(|last| last.seq < event.seq) {
            owner.queue.push_back(event);
        }
    }

    /// The mark to write: the position up to which every event of it is
    /// done, and the numbers of the owners delivered past it.
    pub fn to_mark(&self) -> WebhookMark {
        let position = self.position();
        let owners = self
            .owners
            .iter()
            .filter(|(_, o)| o.last_feed > position)
            .map(|(id, o)| (id.to_string(), o.delivered))
            .take(MARK_OWNERS)
            .collect();
        WebhookMark { position, owners }
    }

    /// Below its first event still queued (or left out of a full queue),
    /// or all it read.
    fn position(&self) -> i64 {
        self.owners
            .values()
            .filter_map(|o| match o.queue.front().and_then(|e| e.feed) {
                Some(f) => Some(f),
                None => o.overflow,
            })
            .map(|p| p - 1)
            .min()
            .unwrap_or(self.read)
            .min(self.read)
    }

    /// Owners to read on for from their own events: (owner, after, how
    /// many at most: what their queue has room for).
    pub fn to_refill(&self) -> Vec<(UserId, i64, usize)> {
        self.owners
            .iter()
            .filter_map(|(id, o)| {
                let room = PER_OWNER - o.queue.len();
                o.refill_after().map(|after| (*id, after, room))
            })
            .collect()
    }

    /// Owners whose head may be sent now.
    pub fn ready(&self, now: Instant) -> Vec<UserId> {
        self.owners
            .iter()
            .filter(|(_, o)| o.ready(now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// When the next paused owner may go (none already due: those wait
    /// for a free place, which a task's end brings).
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        self.owners
            .values()
            .filter(|o| !o.busy && !o.queue.is_empty())
            .filter_map(|o| o.not_before)
            .filter(|&t| t > now)
            .min()
    }

    pub fn pending(&self) -> usize {
        self.owners.values().map(|o| o.queue.len()).sum()
    }

    pub fn oldest(&self) -> Option<DateTime<Utc>> {
        self.owners
            .values()
            .filter_map(|o| o.queue.front().map(|e| e.time))
            .min()
    }

    /// Forgets owners with nothing queued, in flight or left to read, once
    /// more than `keep` are kept: first those behind the mark written, then
    /// any (a number forgotten costs only duplicates after the lease moves).
    pub fn forget_idle(&mut self, keep: usize) {
        if self.owners.len() <= keep {
            return;
        }
        let position = self.saved.position;
        let mut idle = 0;
        self.owners.retain(|_, o| {
            let active = o.busy || o.refilling || o.overflow.is_some() || !o.queue.is_empty();
            let kept = active || (o.last_feed > position && idle < keep);
            idle += usize::from(kept && !active);
            kept
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_stop_at_the_most() {
        let most = Duration::from_secs(8);
        for _ in 0..200 {
            assert!(pause(1, most) <= Duration::from_secs(1));
            assert!(pause(3, most) <= Duration::from_secs(4));
            assert!(pause(30, most) <= most);
        }
    }

    fn event(user: UserId, seq: i64, feed: i64) -> EventRecord {
        let mut e = crate::meta::EventDraft::user_deleted(&user).numbered(user, seq, Utc::now());
        e.feed = Some(feed);
        e
    }

    /// An owner goes one event at a time, in order; the mark stops below
    /// the first event not done and keeps the numbers of the owners
    /// delivered past it; a new holder starting from that mark skips what
    /// they say was delivered.
    #[test]
    fn the_mark_stops_at_the_first_event_not_done_and_names_who_is_past_it() {
        let (ann, bob) = (UserId::new(), UserId::new());
        let mut part = Partition::new(WebhookMark::default());
        for (owner, seq, feed) in [(ann, 1, 11), (ann, 2, 12), (bob, 1, 13), (ann, 3, 15)] {
            part.take(event(owner, seq, feed));
        }
        part.read = 15;
        assert_eq!(
            part.to_mark(),
            WebhookMark {
                position: 10,
                owners: Default::default()
            }
        );
        let a = part.owners.get_mut(&ann).unwrap();
        a.failed(Duration::from_secs(1));
        assert_eq!(a.attempts, 1);
        assert!(a.ready(Instant::now() + Duration::from_secs(2)));
        a.done();
        a.done();
        assert_eq!((a.delivered, a.last_feed, a.attempts), (2, 12, 0));
        assert_eq!(a.queue.front().map(|e| e.seq), Some(3));
        let mark = part.to_mark();
        assert_eq!(mark.position, 12, "bob's event at 13 is not done");
        assert!(mark.owners.is_empty(), "ann's delivered ones are behind it");
        part.owners.get_mut(&ann).unwrap().done();
        let mark = part.to_mark();
        assert_eq!(mark.position, 12);
        assert_eq!(
            mark.owners.get(&ann.to_string()),
            Some(&3),
            "ann's 3 at 15 is past it"
        );

        // The next holder reads from 12 again: ann's 3 is not sent twice,
        // bob's 1 is sent.
        let mut next = Partition::new(mark);
        next.take(event(bob, 1, 13));
        next.take(event(ann, 3, 15));
        next.read = 15;
        assert!(next.owners[&ann].queue.is_empty());
        assert_eq!(next.owners[&bob].queue.len(), 1);
        next.owners.get_mut(&bob).unwrap().done();
        assert_eq!(
            next.to_mark(),
            WebhookMark {
                position: 15,
                owners: Default::default()
            },
            "all done: no owner kept"
        );
    }

    /// One owner's burst past [`PER_OWNER`]: the queue stops there, the
    /// mark stays below the first event left out, and the rest come from
    /// the owner's own events as the queue drains; an event read from the
    /// feed (and left out) while that read ran is not lost.
    #[test]
    fn an_owner_s_burst_past_the_cap_is_read_on_from_their_own_events() {
        let (ann, bob) = (UserId::new(), UserId::new());
        let n = PER_OWNER as i64 + 10;
        let all: Vec<EventRecord> = (1..=n).map(|seq| event(ann, seq, seq)).collect();
        let mut part = Partition::new(WebhookMark::default());
        for e in &all {
            part.take(e.clone());
        }
        part.take(event(bob, 1, n + 1));
        part.read = n + 1;
        let a = &part.owners[&ann];
        assert_eq!(a.queue.len(), PER_OWNER);
        assert_eq!(a.overflow, Some(PER_OWNER as i64 + 1));
        assert_eq!(a.refill_after(), None, "not while the queue is full");
        while part.owners[&ann].queue.len() >= PER_OWNER / 2 {
            part.owners.get_mut(&ann).unwrap().done();
        }
        part.owners.get_mut(&bob).unwrap().done();
        let head = part.owners[&ann]
            .queue
            .front()
            .and_then(|e| e.feed)
            .unwrap();
        assert_eq!(part.to_mark().position, head - 1, "below ann's head");
        let after = part.owners[&ann].refill_after().expect("drained: read on");
        assert_eq!(after, PER_OWNER as i64);

        // The feed moved on while the read ran: one more of ann's, left out.
        part.take(event(ann, n + 1, n + 2));
        part.read = n + 2;
        let fetched: Vec<EventRecord> = all[PER_OWNER..].to_vec();
        let refill = Refill {
            events: fetched,
            read: n + 1,
            limit: PER_OWNER,
        };
        let a = part.owners.get_mut(&ann).unwrap();
        a.refilling = true;
        a.refilled(refill, n + 2);
        assert_eq!(a.queue.back().map(|e| e.seq), Some(n));
        assert_eq!(a.overflow, Some(n + 2), "the one left out is read next");
        assert_eq!(a.refill_after(), None, "not while the queue is half full");
        while a.queue.len() >= PER_OWNER / 2 {
            a.done();
        }
        let after = a.refill_after().expect("read on again");
        a.refilling = true;
        a.refilled(
            Refill {
                events: vec![event(ann, n + 1, n + 2)],
                read: n + 2,
                limit: PER_OWNER,
            },
            n + 2,
        );
        assert_eq!(after, n);
        assert_eq!(
            (a.queue.back().map(|e| e.seq), a.overflow),
            (Some(n + 1), None)
        );
        while !part.owners[&ann].queue.is_empty() {
            part.owners.get_mut(&ann).unwrap().done();
        }
        assert_eq!(part.to_mark().position, n + 2, "all done");
    }
}
