//! `LockManager` on Redis.
//!
//! - Acquire is one Lua script: `SET NX PX` with a random owner token plus
//!   the key's fencing counter (`INCR`, never below Redis `TIME` in µs, so
//!   tokens keep increasing even if Redis loses its data).
//! - Release and renew are compare-and-delete / compare-and-expire scripts.
//! - Fair waiting: each waiter has a ticket in a per-key sorted set, scored
//!   by arrival; only the head may take the lock, so waiters are served in
//!   arrival order across processes. A waiter's ticket stays alive only while
//!   it keeps re-polling, so a crashed waiter cannot block the queue.
//! - Hand-off: release gives the lock straight to the head ticket (the
//!   ticket is the waiter's owner token) and publishes `ticket:fence` on the
//!   key's channel (`PUBLISH`; on a cluster `SPUBLISH`, heard on the node of
//!   the key's slot). The process hears it ([`Notices`]: on one node one
//!   pattern subscription made before any wait; on a cluster a sharded
//!   subscription per key waited on) and wakes only the waiter named, which
//!   then holds the lock without another round trip: one try per hold. The handed-over lease is
//!   short (the ticket TTL) until its holder's first renewal, so a waiter
//!   that died while queued holds it for seconds, not a full TTL.
//!
//! Every key of one lock shares the lock key's `{id}` hash tag.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use tokio::sync::Notify;

use crate::redis_link::{Fault, NoticeHandler, Notices, RedisConn, RedisLink, fault_of};

use super::{Lease, LockError, LockManager, ReleaseBoard, ReleaseListener, owner_token};

/// How long a waiter's ticket lives without a re-poll.
const TICKET_TTL: Duration = Duration::from_secs(3);
/// The safety-net re-poll: covers a lost notice or a holder that expired.
const REPOLL: Duration = Duration::from_millis(500);

/// Drops dead tickets at the head of the queue (shared by both acquire scripts).
const PRUNE: &str = r#"
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local now_us = t[1] * 1000000 + t[2]
while true do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then break end
  local alive = redis.call('ZSCORE', KEYS[4], head)
  if alive and tonumber(alive) > now_ms then break end
  redis.call('ZREM', KEYS[3], head)
  redis.call('ZREM', KEYS[4], head)
end
"#;

/// Gives the lock to `owner` for `ttl` ms and returns the next fencing token;
/// `hand_off` gives a freed lock to the head of the queue (or frees it).
/// `PUBLISH` stands for the link's publish command. `count` is what the
/// fencing counter and the waiters' arrival counter share: each lives a day
/// past its last use, not for ever (one per lock ever taken or waited for,
/// a resumable upload's among them, would grow with history); a counter
/// that expired starts again at Redis's clock in microseconds, above every
/// number it gave before, as every number it gives is.
const TAKE: &str = r#"
local function count(key)
  local n = redis.call('INCR', key)
  if n < now_us then
    redis.call('SET', key, string.format('%d', now_us))
    n = now_us
  end
  redis.call('PEXPIRE', key, 86400000)
  return n
end
local function take(owner, ttl)
  redis.call('SET', KEYS[1], owner, 'PX', ttl)
  return count(KEYS[2])
end
local function hand_off(ttl)
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then
    redis.call('DEL', KEYS[1])
    return
  end
  redis.call('ZREM', KEYS[3], head)
  redis.call('ZREM', KEYS[4], head)
  local f = take(head, ttl)
  redis.call('{PUBLISH}', KEYS[6], head .. ':' .. string.format('%d', f))
end
"#;

// Every script below takes the keys lock, fence, queue, alive, seq, channel.

/// ARGV: ticket (the owner token), ttl ms, ticket ttl ms. Returns the fencing
/// token, or 0 if not taken (the ticket stays queued). A ticket that was
/// handed the lock (its notice lost) gets the current token.
const ACQUIRE_FAIR: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local f = redis.call('GET', KEYS[2])
  if f then return tonumber(f) end
  return take(ARGV[1], ARGV[2])
end
if redis.call('ZSCORE', KEYS[3], ARGV[1]) == false then
  redis.call('ZADD', KEYS[3], count(KEYS[5]), ARGV[1])
end
redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[3]), ARGV[1])
if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return take(ARGV[1], ARGV[2])
end
return 0
"#;

/// ARGV: owner, ttl ms. Takes the lock only if it is free and nobody is
/// queued for it. Run again (a client's retry after a lost answer), it
/// answers the token it took.
const TRY_ACQUIRE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local f = redis.call('GET', KEYS[2])
  if f then return tonumber(f) end
  return take(ARGV[1], ARGV[2])
end
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[3]) == 0 then
  return take(ARGV[1], ARGV[2])
end
return 0
"#;

/// ARGV: owner, hand-off ttl ms. Only the owner releases; the lock goes
/// straight to the next live waiter.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
hand_off(ARGV[2])
return 1
"#;

/// KEYS: lock. ARGV: owner, ttl ms.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"#;

/// ARGV: ticket, hand-off ttl ms. A waiter giving up leaves the queue; if
/// the lock is free, or was just handed to it, the next in line gets it.
const LEAVE: &str = r#"
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then hand_off(ARGV[2]) end
return 1
"#;

struct Scripts {
    acquire_fair: Script,
    try_acquire: Script,
    release: Script,
    renew: Script,
    leave: Script,
}

/// A local waiter: woken by the subscription task, with the fencing token
/// when the lock was handed to it.
#[derive(Default)]
struct Waiter {
    wake: Notify,
    granted: AtomicU64,
}

/// Local waiters by ticket.
type Waiters = super::waiters::Waiters<Arc<Waiter>>;

pub struct RedisLocks {
    conn: RedisConn,
    /// `PUBLISH`, or what the link's topology publishes with.
    publish: &'static str,
    prefix: String,
    scripts: Scripts,
    waiters: Waiters,
    /// This process's holders listening for release requests.
    release: ReleaseBoard,
    /// Hand-off notices and release requests, heard for `Heard`.
    notices: Notices,
    link: RedisLink,
}

/// A Redis error as the lock port's: a topology answer is not an outage.
fn lock_error(e: redis::RedisError) -> LockError {
    match fault_of(&e) {
        Fault::Topology => LockError::Misrouted(e.to_string()),
        Fault::Outage => LockError::Unavailable(e.to_string()),
    }
}

/// The names of one lock's keys.
struct Keys {
    lock: String,
}

impl Keys {
    fn new(prefix: &str, key: &str) -> Self {
        Self {
            lock: format!("{prefix}{key}"),
        }
    }
    fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }
    fn queue(&self) -> String {
        format!("{}:queue", self.lock)
    }
    fn alive(&self) -> String {
        format!("{}:alive", self.lock)
    }
    fn seq(&self) -> String {
        format!("{}:seq", self.lock)
    }
    fn channel(&self) -> String {
        format!("{}:notify", self.lock)
    }
    /// Where release requests for the lock are published.
    fn release_channel(&self) -> String {
        format!("{}{RELEASE_SUFFIX}", self.lock)
    }
    /// `script` with every key of the lock, in the scripts' order.
    fn invoke<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(&self.lock)
            .key(self.fence())
            .key(self.queue())
            .key(self.alive())
            .key(self.seq())
            .key(self.channel());
        call
    }
}

impl RedisLocks {
    /// Connects lazily to the one Redis node at `url` (tests and the bench;
    /// the server goes through [`Self::on`]).
    pub fn connect(url: &str, prefix: &str) -> anyhow::Result<Self> {
        Ok(Self::on(
            &RedisLink::connect(url, crate::config::RedisMode::Single)?,
            prefix,
        ))
    }

    /// Locks on `link` (lazy: a development server starts with Redis down);
    /// starts hearing the notices that wake this process's waiters.
    pub fn on(link: &RedisLink, prefix: &str) -> Self {
        let waiters = Waiters::default();
        let release = ReleaseBoard::default();
        let patterns = vec![
            format!("{prefix}*:notify"),
            format!("{prefix}*{RELEASE_SUFFIX}"),
        ];
        let heard = Heard {
            prefix: prefix.to_owned(),
            waiters: waiters.clone(),
            release: release.clone(),
        };
        let notices = link.notices(patterns, Arc::new(heard));
        let take = TAKE.replace("{PUBLISH}", link.publish_command());
        let script = |body: &str| Script::new(&format!("{PRUNE}{take}{body}"));
        Self {
            conn: link.conn(),
            publish: link.publish_command(),
            prefix: prefix.to_owned(),
            scripts: Scripts {
                acquire_fair: script(ACQUIRE_FAIR),
                try_acquire: script(TRY_ACQUIRE),
                release: script(RELEASE),
                renew: Script::new(RENEW),
                leave: script(LEAVE),
            },
            waiters,
            release,
            notices,
            link: link.clone(),
        }
    }

    async fn fair_attempt(
        &self,
        keys: &Keys,
        ticket: &str,
        ttl: Duration,
    ) -> Result<u64, LockError> {
        keys.invoke(&self.scripts.acquire_fair)
            .arg(ticket)
            .arg(ttl.as_millis() as u64)
            .arg(TICKET_TTL.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)
    }

    async fn leave_queue(&self, keys: &Keys, ticket: &str) {
        let r: Result<i64, _> = keys
            .invoke(&self.scripts.leave)
            .arg(ticket)
            .arg(TICKET_TTL.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "leaving the lock queue failed; the ticket expires on its own");
        }
    }
}

/// The suffix of a lock's release-request channel.
const RELEASE_SUFFIX: &str = ":release";

/// What this process does with the notices it hears: wakes the local
/// waiter a hand-off names, and tells local holders of a lock that another
/// request asked for it.
struct Heard {
    prefix: String,
    waiters: Waiters,
    release: ReleaseBoard,
}

impl NoticeHandler for Heard {
    fn notice(&self, channel: &str, payload: &[u8]) {
        if let Some(key) = channel
            .strip_prefix(self.prefix.as_str())
            .and_then(|c| c.strip_suffix(RELEASE_SUFFIX))
        {
            self.release.signal(key);
            return;
        }
        let Ok(notice) = std::str::from_utf8(payload) else {
            return;
        };
        let (ticket, fence) = notice.split_once(':').unwrap_or((notice, ""));
        self.waiters.with(ticket, |w| {
            w.granted
                .store(fence.parse().unwrap_or(0), Ordering::Release);
            w.wake.notify_one();
        });
    }

    /// Every waiter re-polls.
    fn missed(&self) {
        self.waiters.for_each(|w| w.wake.notify_one());
    }
}

#[async_trait]
impl LockManager for RedisLocks {
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let keys = Keys::new(&self.prefix, key);
        let owner = owner_token();
        let fence: u64 = keys
            .invoke(&self.scripts.try_acquire)
            .arg(&owner)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)?;
        Ok((fence > 0).then(|| Lease {
            key: key.to_owned(),
            owner,
            fence,
            ttl,
        }))
    }

    async fn acquire_fair(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let keys = Keys::new(&self.prefix, key);
        // The ticket is also the owner token: a release hands the lock to it.
        let ticket = owner_token();
        // Registered before the first try, so no notice can slip between them.
        let waiter = Arc::new(Waiter::default());
        let _registered = self.waiters.register(&ticket, waiter.clone());
        let lease = |fence, ttl| Lease {
            key: key.to_owned(),
            owner: ticket.clone(),
            fence,
            ttl,
        };
        // Made once a wait begins; on a cluster, a subscription of this key's.
        let mut watch = None;
        loop {
            let fence = match self.fair_attempt(&keys, &ticket, ttl).await {
                Ok(f) => f,
                Err(e) => {
                    self.leave_queue(&keys, &ticket).await;
                    return Err(e);
                }
            };
            if fence > 0 {
                // Taken by this attempt, or handed over earlier (its notice
                // lost): in doubt, the short hand-off lease.
                return Ok(lease(fence, TICKET_TTL.min(ttl)));
            }
            if watch.is_none() {
                // Within the wait: a subscription that takes longer leaves
                // this waiter to its re-polls.
                let left = deadline.saturating_duration_since(Instant::now());
                let made = tokio::time::timeout(left, self.notices.watch(&keys.channel())).await;
                if let Ok(made) = made {
                    let fresh = made.fresh;
                    watch = Some(made);
                    if fresh {
                        // A hand-off before the subscription was not heard.
                        continue;
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                // Leaving also passes on a lock handed to us meanwhile.
                self.leave_queue(&keys, &ticket).await;
                return Err(LockError::Timeout(started.elapsed()));
            }
            let _ = tokio::time::timeout(REPOLL.min(deadline - now), waiter.wake.notified()).await;
            let granted = waiter.granted.swap(0, Ordering::Acquire);
            if granted > 0 {
                return Ok(lease(granted, TICKET_TTL));
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let keys = Keys::new(&self.prefix, &lease.key);
        let released: i64 = keys
            .invoke(&self.scripts.release)
            .arg(&lease.owner)
            .arg(TICKET_TTL.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)?;
        Ok(released == 1)
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let keys = Keys::new(&self.prefix, &lease.key);
        let renewed: i64 = self
            .scripts
            .renew
            .key(&keys.lock)
            .arg(&lease.owner)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)?;
        Ok(renewed == 1)
    }

    async fn request_release(&self, key: &str) -> Result<(), LockError> {
        let channel = Keys::new(&self.prefix, key).release_channel();
        let _: i64 = redis::cmd(self.publish)
            .arg(channel)
            .arg(1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)?;
        Ok(())
    }

    fn release_board(&self) -> &ReleaseBoard {
        &self.release
    }

    fn outage_scope(&self, key: &str) -> u16 {
        self.link.outage_scope(&Keys::new(&self.prefix, key).lock)
    }

    async fn listen_for_release(&self, key: &str) -> ReleaseListener {
        let channel = Keys::new(&self.prefix, key).release_channel();
        let watch = self.notices.watch(&channel).await;
        self.release.listen_keeping(key, watch)
    }

    async fn ping(&self) -> Result<(), LockError> {
        let _: String = self.conn.clone().ping().await.map_err(lock_error)?;
        Ok(())
    }
}
