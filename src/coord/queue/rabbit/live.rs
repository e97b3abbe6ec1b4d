//! What one link to RabbitMQ holds while it is up.

use lapin::{Channel, Connection};
use tokio::task::JoinHandle;

/// The two connections (see `open.rs`) and their channels.
pub(super) struct Live {
    /// The consuming connection: a channel per bucket's consumer.
    pub(super) conn: Connection,
    /// The publishing connection.
    pub(super) publisher: Connection,
    /// Where requests are published (publisher confirms on), consuming
    /// this link's answers.
    pub(super) publish: Channel,
    /// Where the consumers publish the answers.
    pub(super) answer: Channel,
    /// Where this link's requests ask their answers to go.
    pub(super) reply_to: String,
    /// Which of this instance's links it is.
    pub(super) generation: u64,
    /// Hands each answer to its waiter.
    pub(super) replies: JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.replies.abort();
    }
}

impl Live {
    /// Both connections up (a link to keep, blocked or not).
    pub(super) fn linked(&self) -> bool {
        self.conn.status().connected()
            && self.publisher.status().connected()
            && self.publish.status().connected()
    }

    /// Whether an alarm of the broker's (memory, disk) blocks the
    /// publishing connection: nothing is written on it until it clears.
    pub(super) fn blocked(&self) -> bool {
        self.publisher.status().blocked()
    }

    /// Linked, and the publishing connection not blocked: what a request
    /// needs to be enqueued.
    pub(super) fn is_up(&self) -> bool {
        self.linked() && !self.blocked()
    }
}

/// The queues' lengths as last read: messages waiting in each bucket (not
/// those delivered and not yet acknowledged), and in the dead letters.
#[derive(Clone, Debug, Default)]
pub(super) struct Lengths {
    pub(super) buckets: Vec<u64>,
    pub(super) dead: u64,
}
