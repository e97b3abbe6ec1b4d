//! What one connection to RabbitMQ holds while it is up.

use lapin::{Channel, Connection};
use tokio::task::JoinHandle;

/// A connection and the channel requests are published on (publisher
/// confirms on, and consuming its own direct replies).
pub(super) struct Live {
    pub(super) conn: Connection,
    pub(super) publish: Channel,
    /// Which of this instance's connections it is.
    pub(super) generation: u64,
    /// Hands each direct reply to its waiter.
    pub(super) replies: JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.replies.abort();
    }
}

impl Live {
    pub(super) fn is_up(&self) -> bool {
        self.conn.status().connected() && self.publish.status().connected()
    }
}

/// The queues' lengths as last read: messages waiting in each bucket (not
/// those delivered and not yet acknowledged), and in the dead letters.
#[derive(Clone, Debug, Default)]
pub(super) struct Lengths {
    pub(super) buckets: Vec<u64>,
    pub(super) dead: u64,
}
