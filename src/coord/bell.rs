//! The events' bell across instances, on Redis: a ring is heard here at
//! once and published (by a task of the bell's, so that no request waits
//! on Redis) on the owner's channel (`{prefix}events:{owner}`),
//! which every instance hears (one node: its pattern subscription; a
//! cluster: a sharded subscription while one of its readers waits on that
//! owner). A ring that may have been missed (a dropped subscription, a
//! failover) wakes every local reader, who reads once more.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::{
    meta::{Bells, EventBell, Listener},
    redis_link::{NoticeHandler, Notices, RedisConn, RedisLink},
    vocab::UserId,
};

pub struct RedisBell {
    here: Bells,
    /// To the task that publishes rings (a request never waits on Redis).
    rings: mpsc::Sender<UserId>,
    prefix: String,
    notices: Notices,
}

/// Rings waiting to be published at most; past it a ring is heard here
/// only (the other instances' readers find its event at their wait's end).
const WAITING_RINGS: usize = 4096;
/// Rings taken from the queue at once at most.
const RINGS_AT_ONCE: usize = 64;

impl RedisBell {
    /// A bell on `link` (lazy: the server starts with Redis down; a ring it
    /// cannot publish still wakes this instance's readers).
    pub fn on(link: &RedisLink, prefix: &str) -> Self {
        let here = Bells::default();
        let heard = Heard {
            prefix: format!("{prefix}events:"),
            here: here.clone(),
        };
        let notices = link.notices(vec![format!("{prefix}events:*")], Arc::new(heard));
        let (rings, waiting) = mpsc::channel(WAITING_RINGS);
        tokio::spawn(publish(
            waiting,
            link.conn(),
            link.publish_command(),
            prefix.to_owned(),
        ));
        Self {
            here,
            rings,
            prefix: prefix.to_owned(),
            notices,
        }
    }
}

fn channel(prefix: &str, owner: &UserId) -> String {
    format!("{prefix}events:{owner}")
}

/// Publishes the rings as they come, once per owner of those that came
/// together (one command each: a cluster refuses a pipeline whose channels
/// lie in several slots); ends with the bell.
async fn publish(
    mut waiting: mpsc::Receiver<UserId>,
    conn: RedisConn,
    command: &'static str,
    prefix: String,
) {
    let mut owners = Vec::with_capacity(RINGS_AT_ONCE);
    while waiting.recv_many(&mut owners, RINGS_AT_ONCE).await > 0 {
        owners.sort_unstable();
        owners.dedup();
        for owner in owners.drain(..) {
            let sent: Result<i64, _> = redis::cmd(command)
                .arg(channel(&prefix, &owner))
                .arg(1)
                .query_async(&mut conn.clone())
                .await;
            if let Err(e) = sent {
                // The other instances' readers find the event at their
                // wait's end.
                tracing::warn!(error = %e, "could not ring the events' bell on Redis");
            }
        }
    }
}

#[async_trait]
impl EventBell for RedisBell {
    async fn ring(&self, owner: &UserId) {
        self.here.ring_here(owner);
        // Full: Redis is slow or away; this instance's readers heard it.
        let _ = self.rings.try_send(*owner);
    }

    async fn listen(&self, owner: &UserId) -> Listener {
        // Listening here first: a ring heard while subscribing is kept.
        let listener = self.here.listener(owner);
        let watch = self.notices.watch(&channel(&self.prefix, owner)).await;
        listener.holding(watch)
    }
}

/// What this instance does with the rings it hears.
struct Heard {
    /// `{prefix}events:`, before the owner's id.
    prefix: String,
    here: Bells,
}

impl NoticeHandler for Heard {
    fn notice(&self, channel: &str, _payload: &[u8]) {
        if let Some(owner) = channel
            .strip_prefix(self.prefix.as_str())
            .and_then(|o| o.parse::<UserId>().ok())
        {
            self.here.ring_here(&owner);
        }
    }

    fn missed(&self) {
        self.here.ring_all();
    }
}
