//! The fault suite's nemesis: it deals a shuffled deck that holds every
//! fault kind that applies to the mode (`fault_deck.rs`), one fault at a
//! time, and counts a fault only once it fired (a cut armed to follow a
//! command fires only when that command is sent; one that did not goes
//! back under the deck).

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use rand::{Rng, rngs::StdRng, seq::SliceRandom};

use crate::support::{
    cluster::{Cluster, GRACE, LOCK_TTL, SETTLE_WINDOW},
    fault_deck::{DEAD_LETTER_AGE, Fault},
    fault_proxy::FaultProxy,
    servers::OwnRedis,
    webhook_receiver::Delivery,
};

/// BSON of `"insert": "files"`: a group commit's insert of its files.
const INSERT_FILES: &[u8] = b"\x02insert\x00\x06\x00\x00\x00files\x00";
/// The end of the namespace `<db>.files` in a `bulkWrite`'s `nsInfo`: a
/// lone commit's writes, its file's among them (on SecantusDB, as on
/// MongoDB 8.0 or later; nothing else names a namespace with a dot).
const BULK_FILES: &[u8] = b".files\x00";
const COMMIT: &[u8] = b"commitTransaction";
/// BSON of `"update": "resumable_uploads"`: a PATCH's state update.
const UPDATE_RESUMABLE: &[u8] = b"\x02update\x00\x12\x00\x00\x00resumable_uploads\x00";
/// BSON of `"findAndModify": "resumable_uploads"`: a resumable upload's
/// commit marking its state (and, for a small upload, recording it).
const MARK_RESUMABLE: &[u8] = b"\x02findAndModify\x00\x12\x00\x00\x00resumable_uploads\x00";
/// An S3 UploadPart request (a tus PATCH's, or a plain multipart upload's).
const UPLOAD_PART: &[u8] = b"partNumber=";
/// A small resumable upload's one `PutObject` (the only conditional one).
const WHOLE_PUT: &[u8] = b"if-none-match: *";
const XADD: &[u8] = b"XADD";
/// AMQP 0-9-1 `basic.publish`: class 60, method 40, the start of its
/// method frame's payload (a content body holding these bytes is unlikely
/// with JSON bodies, and would only fire the cut at another moment).
pub const BASIC_PUBLISH: &[u8] = b"\x00\x3c\x00\x28";
/// How long an armed cut may wait for its command before it goes back
/// under the deck.
const ARMED_FOR: Duration = Duration::from_secs(10);
/// How often a dealt fault that did not fire is dealt again (3 deals of
/// 6 s once left an upload's commit and an S3 part uncut, in a slow run).
const REDEALS: usize = 5;
/// The pause between two faults.
const BETWEEN: std::ops::Range<u64> = 300..1200;

/// How long [`Fault::ReceiverFailingLong`] refuses every delivery.
const DEAD_LETTER_WINDOW: Duration = Duration::from_secs(10);

/// Per fault kind: how often it was dealt, and how often it fired.
#[derive(Debug, Default)]
pub struct Tally(pub BTreeMap<Fault, (usize, usize)>);

impl Tally {
    pub fn fired(&self) -> usize {
        self.0.values().map(|(_, fired)| fired).sum()
    }

    /// How often `kind` fired.
    pub fn fired_of(&self, kind: Fault) -> usize {
        self.0.get(&kind).map_or(0, |(_, fired)| *fired)
    }

    /// The kinds of `deck` that never fired.
    pub fn silent(&self, deck: &[Fault]) -> Vec<Fault> {
        deck.iter()
            .filter(|f| self.0.get(f).is_none_or(|(_, fired)| *fired == 0))
            .copied()
            .collect()
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(kind, (dealt, fired))| format!("{kind} {fired}/{dealt}"))
            .collect();
        write!(f, "{} (fired/dealt)", parts.join(", "))
    }
}

/// Deals decks until every kind has fired once per deck and `until` has
/// passed (one deck by default; a soak deals more). Faults come one at a
/// time, a short pause apart.
pub async fn nemesis(c: &mut Cluster, rng: &mut StdRng, until: Instant) -> Tally {
    let mut tally = Tally::default();
    loop {
        let mut deck: Vec<(Fault, usize)> = c.deck().into_iter().map(|f| (f, 0)).collect();
        deck.shuffle(rng);
        while let Some((fault, dealt)) = deck.pop() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(BETWEEN))).await;
            let fired = inject(c, fault, rng).await;
            let entry = tally.0.entry(fault).or_default();
            entry.0 += 1;
            entry.1 += usize::from(fired);
            if !fired && dealt + 1 < REDEALS {
                // Under the deck: dealt again once the others are.
                deck.insert(0, (fault, dealt + 1));
            }
        }
        if Instant::now() >= until {
            return tally;
        }
    }
}

/// A cut for 50 ms to `max`.
fn short(rng: &mut StdRng, max: Duration) -> Duration {
    Duration::from_millis(rng.random_range(50..max.as_millis() as u64))
}

/// Longer than the settle window, with room for the commit's own retries
/// (about 2 s with a 1 s server selection) before the window begins.
fn past_settle(rng: &mut StdRng) -> Duration {
    SETTLE_WINDOW + Duration::from_millis(rng.random_range(3000..5000))
}

/// Injects one fault and waits until it is over; whether it fired.
async fn inject(c: &mut Cluster, fault: Fault, rng: &mut StdRng) -> bool {
    let instance = rng.random_range(0..c.instances.len());
    match fault {
        Fault::MongoCut => cut_for(&c.mongo, short(rng, Duration::from_secs(3))).await,
        Fault::MongoCutLong => cut_for(&c.mongo, past_settle(rng)).await,
        Fault::MongoCutAfterCommit => {
            let down = short(rng, Duration::from_secs(2));
            cut_after(&c.mongo, &[COMMIT], down).await
        }
        Fault::MongoCutAfterUploadCommitLong => {
            cut_after_stages(
                &c.mongo,
                &[&[INSERT_FILES, BULK_FILES], &[COMMIT]],
                past_settle(rng),
            )
            .await
        }
        Fault::RedisCut => cut_for(&c.redis, short(rng, Duration::from_secs(3))).await,
        Fault::RedisCutAfterEnqueue => {
            let down = short(rng, Duration::from_secs(2));
            cut_after(&c.redis, &[XADD], down).await
        }
        Fault::S3Cut => cut_for(&c.s3, short(rng, Duration::from_secs(2))).await,
        Fault::S3CutDuringPart => {
            let down = short(rng, Duration::from_secs(2));
            cut_after(&c.s3, &[UPLOAD_PART], down).await
        }
        Fault::S3CutAfterWholePut => {
            let down = short(rng, Duration::from_secs(2));
            cut_after(&c.s3, &[WHOLE_PUT], down).await
        }
        Fault::MongoCutAfterTusUpdate => {
            cut_after(&c.mongo, &[UPDATE_RESUMABLE], past_settle(rng)).await
        }
        Fault::MongoCutAfterTusCommit => {
            cut_after(&c.mongo, &[MARK_RESUMABLE, COMMIT], past_settle(rng)).await
        }
        Fault::Pause => {
            let pause = LOCK_TTL + GRACE + Duration::from_millis(rng.random_range(1000..3000));
            let pid = c.pid(instance);
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            tokio::time::sleep(pause).await;
            unsafe { libc::kill(pid, libc::SIGCONT) };
            true
        }
        Fault::ReceiverDown => {
            let before = c.receiver.requests().len();
            c.receiver.down().await;
            tokio::time::sleep(short(rng, Duration::from_secs(3))).await;
            c.receiver.up().await;
            // Fired if deliveries were waiting: some come once it is up.
            tokio::time::sleep(Duration::from_secs(2)).await;
            c.receiver.requests().len() > before
        }
        Fault::ReceiverFailing => {
            let before = c.receiver.refused().len();
            c.receiver.fail_all();
            tokio::time::sleep(short(rng, Duration::from_secs(3))).await;
            // Failing on until a delivery met it (at most 5 s more): a
            // short window can fall between deliveries, and five of them
            // once did, in a slow run on a Redis Cluster.
            let met = |log: &[Delivery]| log.iter().filter(|d| d.refused()).count() > before;
            let fired = c
                .receiver
                .wait_for(met, Duration::from_secs(5))
                .await
                .is_ok();
            c.receiver.answer_ok();
            fired
        }
        Fault::ReceiverFailingLong => {
            // Fired if a delivery was refused early enough that it stayed
            // refused past the maximum age (then its next failure, a
            // second at most later, dead-letters it).
            let early = DEAD_LETTER_WINDOW - DEAD_LETTER_AGE - Duration::from_secs(2);
            let before = c.receiver.refused().len();
            c.receiver.fail_all();
            tokio::time::sleep(early).await;
            let fired = c.receiver.refused().len() > before;
            tokio::time::sleep(DEAD_LETTER_WINDOW - early).await;
            c.receiver.answer_ok();
            fired
        }
        Fault::ReceiverSlow => {
            let before = c.receiver.requests().len();
            c.receiver.slow(Duration::from_millis(1500));
            tokio::time::sleep(Duration::from_secs(3)).await;
            // Slow on until a delivery met it (at most 5 s more): under the
            // other faults deliveries can pause for longer than 3 s.
            let met = |log: &[Delivery]| log.len() > before;
            let _ = c.receiver.wait_for(met, Duration::from_secs(5)).await;
            c.receiver.answer_ok();
            c.receiver.requests().len() > before
        }
        Fault::Drain => {
            c.drain(instance).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
            c.start_instance(instance).await;
            true
        }
        Fault::Kill => {
            c.kill(instance).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
            c.start_instance(instance).await;
            true
        }
        Fault::RedisRestart => {
            c.own_redis.stop();
            tokio::time::sleep(short(rng, Duration::from_secs(3))).await;
            c.own_redis = OwnRedis::start(c.redis_port).await;
            true
        }
        Fault::RedisFlush => {
            let url = format!("redis://127.0.0.1:{}/", c.redis_port);
            let Ok(mut conn) = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
            else {
                return false;
            };
            let flushed: Result<(), _> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
            flushed.is_ok()
        }
        Fault::ClusterMasterKill => match &mut c.own_cluster {
            Some(own) => own.kill_master(rng).await,
            None => false,
        },
        Fault::ClusterFailover => match &mut c.own_cluster {
            Some(own) => own.fail_over(rng).await,
            None => false,
        },
        Fault::SentinelFailover => match &mut c.own_sentinel {
            Some(own) => own.fail_over().await,
            None => false,
        },
        Fault::SentinelPrimaryKill => match &mut c.own_sentinel {
            Some(own) => own.kill_primary().await,
            None => false,
        },
        Fault::RabbitCut
        | Fault::RabbitCutAfterPublish
        | Fault::RabbitKill
        | Fault::RabbitConnectionsClosed
        | Fault::RabbitAlarm => inject_rabbit(c, fault, rng).await,
    }
}

/// The faults of RabbitMQ (the queue's broker in one mode); none fires
/// without it.
async fn inject_rabbit(c: &mut Cluster, fault: Fault, rng: &mut StdRng) -> bool {
    let (Some(proxy), Some(own)) = (&c.amqp, &mut c.own_rabbit) else {
        return false;
    };
    match fault {
        Fault::RabbitCut => cut_for(proxy, short(rng, Duration::from_secs(3))).await,
        Fault::RabbitCutAfterPublish => {
            let down = short(rng, Duration::from_secs(2));
            cut_after(proxy, &[BASIC_PUBLISH], down).await
        }
        Fault::RabbitKill => {
            own.kill();
            tokio::time::sleep(Duration::from_millis(rng.random_range(1000..2000))).await;
            // Booted again (about 6 s) before the next fault is dealt.
            own.restart().await;
            true
        }
        Fault::RabbitConnectionsClosed => own.close_connections().await > 0,
        Fault::RabbitAlarm => {
            own.memory_alarm(true).await;
            let started = Instant::now();
            let at_least = Duration::from_millis(rng.random_range(1000..3000));
            // Fired once a connection was blocked (one published in it):
            // on until one was, 8 s at most (each look takes rabbitmqctl
            // a second or two on a loaded machine).
            let mut fired = false;
            while started.elapsed() < Duration::from_secs(8) {
                fired = fired || own.blocked_connections().await > 0;
                if fired && started.elapsed() >= at_least {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            own.memory_alarm(false).await;
            fired
        }
        _ => false,
    }
}

async fn cut_for(proxy: &FaultProxy, down: Duration) -> bool {
    proxy.cut(down);
    tokio::time::sleep(down).await;
    true
}

/// Arms a cut after `patterns`; waits for it to fire (then for its down
/// time) or for [`ARMED_FOR`], and disarms it.
async fn cut_after(proxy: &FaultProxy, patterns: &[&[u8]], down: Duration) -> bool {
    let stages: Vec<&[&[u8]]> = patterns.iter().map(std::slice::from_ref).collect();
    cut_after_stages(proxy, &stages, down).await
}

/// As [`cut_after`], each stage met by any one of its patterns.
async fn cut_after_stages(proxy: &FaultProxy, stages: &[&[&[u8]]], down: Duration) -> bool {
    let before = proxy.fired();
    proxy.cut_after_stages(stages, 0, down);
    let deadline = Instant::now() + ARMED_FOR;
    while proxy.fired() == before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if proxy.fired() == before {
        proxy.heal();
        // It may have fired between the last look and the disarm.
        return proxy.fired() > before;
    }
    // The cut comes once the server answered (up to 2 s), then lasts `down`.
    tokio::time::sleep(Duration::from_secs(2) + down).await;
    true
}
