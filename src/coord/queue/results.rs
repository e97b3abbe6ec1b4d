//! How a request waiting for its queued operation hears the result: the
//! worker stores it under a key of the operation's bucket and publishes the
//! operation's id on the waiting instance's channel of that bucket (key,
//! channel and stream share the bucket's hash tag, so on a Redis Cluster
//! the worker's one round trip stays on one master and the notice goes out
//! with `SPUBLISH` there). The instance hears its channels through the
//! link's notices: a pattern subscription on one node (or the Sentinel
//! primary), a sharded subscription per bucket it waits on on a cluster.

use std::{sync::Arc, time::Duration};

use redis::AsyncCommands;
use tokio::{sync::mpsc, task::JoinHandle};

use crate::{
    coord::OpOutcome,
    redis_link::{NoticeHandler, Notices, RedisConn, RedisLink, Watch},
};

use super::front::Waiters;

/// How long a request waits for its bucket's channel to be subscribed
/// before it enqueues anyway (and re-reads its result every second).
const WATCH_WITHIN: Duration = Duration::from_secs(1);

/// Where the result of `op_id` (bucket `b`) is kept for its waiter.
pub fn result_key(prefix: &str, b: u32, op_id: &impl std::fmt::Display) -> String {
    format!("{prefix}filedock_queue_result:{{{b}}}:{op_id}")
}

/// The channel on which `instance` hears the results of bucket `b`.
pub fn done_channel(prefix: &str, b: u32, instance: &str) -> String {
    format!("{prefix}filedock_queue_done:{{{b}}}:{instance}")
}

/// The bucket a [`done_channel`] names (its last `{…}`).
fn bucket_of_channel(channel: &str) -> Option<u32> {
    let open = channel.rfind('{')?;
    let close = open + channel[open..].find('}')?;
    channel[open + 1..close].parse().ok()
}

/// The stored result of `op_id`, if any. A result that cannot be read is
/// not a success: the waiter reads it again, or answers unknown.
pub async fn read_result(
    conn: &mut RedisConn,
    prefix: &str,
    b: u32,
    op_id: &impl std::fmt::Display,
) -> Option<OpOutcome> {
    let raw: Option<String> = conn.get(result_key(prefix, b, op_id)).await.ok()?;
    serde_json::from_str(&raw?).ok()
}

/// This instance's result notices (see the module).
pub struct Results {
    notices: Notices,
    reader: JoinHandle<()>,
}

impl Drop for Results {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Results {
    /// Hears `instance`'s channels on `link` and hands each result read to
    /// its waiter.
    pub fn start(link: &RedisLink, prefix: &str, instance: &str, waiters: Waiters) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let heard = Arc::new(Heard {
            waiters: waiters.clone(),
            tx,
        });
        let pattern = format!("{prefix}filedock_queue_done:*:{instance}");
        let notices = link.notices(vec![pattern], heard);
        let (conn, prefix) = (link.conn(), Arc::<str>::from(prefix));
        // Off the subscription's task (on a cluster, the connection's own),
        // each read on its own: one slow master holds up no other's.
        let reader = tokio::spawn(async move {
            while let Some((b, op_id)) = rx.recv().await {
                if !waiters.contains(&op_id) {
                    continue;
                }
                let (mut conn, prefix, waiters) = (conn.clone(), prefix.clone(), waiters.clone());
                tokio::spawn(async move {
                    if let Some(outcome) = read_result(&mut conn, &prefix, b, &op_id).await
                        && let Some(tx) = waiters.take(&op_id)
                    {
                        let _ = tx.send(outcome);
                    }
                });
            }
        });
        Self { notices, reader }
    }

    /// Makes sure `channel` is heard while the answer lives (on one node
    /// it always is); `None` if subscribing takes too long.
    pub async fn watch(&self, channel: &str) -> Option<Watch> {
        tokio::time::timeout(WATCH_WITHIN, self.notices.watch(channel))
            .await
            .ok()
    }
}

struct Heard {
    waiters: Waiters,
    tx: mpsc::UnboundedSender<(u32, String)>,
}

impl NoticeHandler for Heard {
    fn notice(&self, channel: &str, payload: &[u8]) {
        let Ok(op_id) = std::str::from_utf8(payload) else {
            return;
        };
        if !self.waiters.contains(op_id) {
            return;
        }
        if let Some(b) = bucket_of_channel(channel) {
            let _ = self.tx.send((b, op_id.to_owned()));
        }
    }

    /// Each waiter re-reads its result every second anyway.
    fn missed(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_names_its_bucket() {
        let channel = done_channel("t{x}:", 17, "filedock-abc");
        assert_eq!(bucket_of_channel(&channel), Some(17));
        assert_eq!(bucket_of_channel("no bucket"), None);
    }
}
