//! The live instances, for the work they share out by leases (the queue's
//! buckets, the webhooks' partitions): each instance beats into a sorted
//! set on Redis, scored by the time of its beat, and counts the members
//! heard from lately. Without Redis an instance is alone.

use redis::AsyncCommands;

use crate::redis_link::RedisConn;

/// How long an instance counts as alive after its last beat, in ms.
const MEMBER_TTL_MS: u64 = 5_000;

pub struct Members {
    /// `None`: no Redis, one instance.
    conn: Option<RedisConn>,
    key: String,
    instance: String,
}

impl Members {
    /// The members of `key` (a Redis key, prefixed), this process as
    /// `instance`.
    pub fn new(conn: Option<RedisConn>, key: String, instance: String) -> Self {
        Self {
            conn,
            key,
            instance,
        }
    }

    /// Announces this instance and counts the live ones (at least 1).
    pub async fn beat(&self) -> redis::RedisResult<u32> {
        let Some(conn) = &self.conn else {
            return Ok(1);
        };
        let now = crate::lock::now_micros() / 1000;
        let (_, _, alive): (i64, i64, u32) = redis::pipe()
            .zadd(&self.key, &self.instance, now)
            .zrembyscore(&self.key, 0, now.saturating_sub(MEMBER_TTL_MS))
            .zcard(&self.key)
            .query_async(&mut conn.clone())
            .await?;
        Ok(alive.max(1))
    }

    /// Leaves at once (the others take up the share at their next beat).
    pub async fn leave(&self) {
        if let Some(conn) = &self.conn {
            let _: Result<i64, _> = conn.clone().zrem(&self.key, &self.instance).await;
        }
    }
}
