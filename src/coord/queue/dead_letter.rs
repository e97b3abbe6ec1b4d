//! The dead-letter stream: where a queued operation that kept failing goes,
//! listed by `GET /v1/admin/queue` (its count) and kept for an operator.

use redis::streams::StreamId;

use super::RedisQueue;
use crate::redis_link::DedicatedConn;

impl RedisQueue {
    /// Moves a queued operation that kept failing to the dead-letter stream
    /// (`…:dlq`), with why and how often it failed.
    pub(super) async fn dead_letter(
        &self,
        conn: &mut DedicatedConn,
        entry: &StreamId,
        error: &str,
        attempts: u32,
    ) {
        let op: String = entry.get("op").unwrap_or_default();
        let id: String = entry.get("id").unwrap_or_default();
        let r: redis::RedisResult<String> = redis::cmd("XADD")
            .arg(self.dlq())
            .arg("*")
            .arg("op")
            .arg(op)
            .arg("id")
            .arg(&id)
            .arg("error")
            .arg(error)
            .arg("attempts")
            .arg(attempts)
            .arg("entry")
            .arg(&entry.id)
            .query_async(conn)
            .await;
        tracing::error!(
            op_id = id,
            error,
            attempts,
            dead_lettered = r.is_ok(),
            "queued operation moved to the dead-letter queue"
        );
    }
}
