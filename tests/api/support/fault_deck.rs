//! The fault suite's fault kinds and its modes (the coordination, the
//! Redis topology, the queue's broker): which kinds apply to a mode, the
//! deck the nemesis (`nemesis.rs`) deals.

use std::{fmt, time::Duration};

use filedock::config::QueueBroker;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Every MongoDB connection cut, new ones refused, for up to 3 s.
    MongoCut,
    /// The same for longer than the settle window: an upload whose commit
    /// answer was lost answers 504 `outcome_unknown`.
    MongoCutLong,
    /// Cut right after any transaction's `commitTransaction` was answered.
    MongoCutAfterCommit,
    /// Cut right after an upload's commit was answered, for longer than the
    /// settle window: the upload 504 path.
    MongoCutAfterUploadCommitLong,
    RedisCut,
    /// Cut right after an enqueue (`XADD`) was answered (queue mode only).
    RedisCutAfterEnqueue,
    S3Cut,
    /// Cut right after a part of a multipart upload was stored: a PATCH
    /// (or a plain upload) loses its link mid-body.
    S3CutDuringPart,
    /// Cut right after a small resumable upload's `PutObject` was answered:
    /// the object is there, the answer lost (the SDK's retry is refused by
    /// `If-None-Match`, and the PATCH finds its own bytes there).
    S3CutAfterWholePut,
    /// Cut right after a resumable upload's state update was answered,
    /// for longer than the settle window: the PATCH cannot read back
    /// whether its offset moved.
    MongoCutAfterTusUpdate,
    /// Cut right after a resumable upload's commit was answered (the
    /// transaction that marks its state, and records a small upload's
    /// bytes), for longer than the settle window: the final PATCH cannot
    /// tell whether it applied, nor record its bytes after it.
    MongoCutAfterTusCommit,
    /// SIGSTOP for longer than the lock lease and the sweeper's grace (and
    /// the webhooks' partition leases: the other instance takes them over,
    /// and the paused one must send nothing more when it wakes).
    Pause,
    /// The webhook receiver down (connections refused) for up to 3 s.
    ReceiverDown,
    /// The webhook receiver answering 500 for up to 3 s (and on until a
    /// delivery met it, 8 s at most).
    ReceiverFailing,
    /// The webhook receiver answering 500 for longer than the webhooks'
    /// maximum age ([`DEAD_LETTER_AGE`], set in lock mode on one Redis
    /// node only): what was refused early in it is given up on, a dead
    /// letter, and its owner's later events are delivered after it.
    ReceiverFailingLong,
    /// The webhook receiver answering after 1.5 s, for 3 s (and on until a
    /// delivery met it, 8 s at most): deliveries in flight when another
    /// fault kills, pauses or drains an instance.
    ReceiverSlow,
    /// SIGKILL, then the instance starts again on its port.
    Kill,
    /// SIGTERM: the instance drains (unready, then its tus PATCHes and long
    /// polls let go, the rest finish) and must exit 0; then it starts again
    /// on its port, as in a rolling deploy.
    Drain,
    RedisRestart,
    RedisFlush,
    /// On a Redis Cluster: a master SIGKILLed (its replica promoted, its
    /// last writes possibly lost), started again as a replica.
    ClusterMasterKill,
    /// On a Redis Cluster: `CLUSTER FAILOVER` on a replica.
    ClusterFailover,
    /// With Sentinel: `SENTINEL FAILOVER` (the replica promoted, the old
    /// primary demoted; instances that have not heard may still write there).
    SentinelFailover,
    /// With Sentinel: the primary SIGKILLed (its replica promoted, what it
    /// had not replicated lost) and started again, a primary until the
    /// sentinels demote it.
    SentinelPrimaryKill,
    /// On RabbitMQ: every AMQP connection cut, new ones refused, for up to 3 s.
    RabbitCut,
    /// On RabbitMQ: cut right after a `basic.publish` went to the broker
    /// (its confirm, if any, lost with the link).
    RabbitCutAfterPublish,
    /// On RabbitMQ: the broker SIGKILLed (what it had not written lost,
    /// deliveries in flight never acknowledged), started again 1-2 s later.
    RabbitKill,
    /// On RabbitMQ: the broker closes every client connection
    /// (`rabbitmqctl close_all_connections`), consumers' mid-delivery too.
    RabbitConnectionsClosed,
    /// On RabbitMQ: a memory alarm for 1 to 3 s (the high watermark at 0;
    /// on until a connection was blocked, 8 s at most): the broker blocks
    /// every connection that publishes, requests and answers alike.
    RabbitAlarm,
}

/// `FILEDOCK_WEBHOOK_MAX_AGE_SECS` where the suite makes dead letters.
pub const DEAD_LETTER_AGE: Duration = Duration::from_secs(4);

/// Whether this mode makes dead letters: one mode is enough (every
/// event dead-lettered is one the suite cannot see delivered), and lock
/// mode on one node has the fewest other faults on the deliveries' path.
pub fn dead_letters_in(coordination: &str, topology: Topology) -> bool {
    coordination == "lock" && topology == Topology::Node
}

/// The Redis the fault suite's instances take their locks on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One node behind a fault proxy.
    Node,
    Cluster,
    Sentinel,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::MongoCut => "mongo-cut",
            Self::MongoCutLong => "mongo-cut-long",
            Self::MongoCutAfterCommit => "mongo-cut-after-commit",
            Self::MongoCutAfterUploadCommitLong => "mongo-cut-after-upload-commit-long",
            Self::RedisCut => "redis-cut",
            Self::RedisCutAfterEnqueue => "redis-cut-after-enqueue",
            Self::S3Cut => "s3-cut",
            Self::S3CutDuringPart => "s3-cut-during-part",
            Self::S3CutAfterWholePut => "s3-cut-after-whole-put",
            Self::MongoCutAfterTusUpdate => "mongo-cut-after-tus-update",
            Self::MongoCutAfterTusCommit => "mongo-cut-after-tus-commit",
            Self::Pause => "pause",
            Self::ReceiverDown => "receiver-down",
            Self::ReceiverFailing => "receiver-failing",
            Self::ReceiverFailingLong => "receiver-failing-long",
            Self::ReceiverSlow => "receiver-slow",
            Self::Kill => "kill",
            Self::Drain => "drain",
            Self::RedisRestart => "redis-restart",
            Self::RedisFlush => "redis-flush",
            Self::ClusterMasterKill => "cluster-master-kill",
            Self::ClusterFailover => "cluster-failover",
            Self::SentinelFailover => "sentinel-failover",
            Self::SentinelPrimaryKill => "sentinel-primary-kill",
            Self::RabbitCut => "rabbit-cut",
            Self::RabbitCutAfterPublish => "rabbit-cut-after-publish",
            Self::RabbitKill => "rabbit-kill",
            Self::RabbitConnectionsClosed => "rabbit-connections-closed",
            Self::RabbitAlarm => "rabbit-alarm",
        };
        f.write_str(name)
    }
}

impl Fault {
    const ALL: [Fault; 29] = [
        Self::MongoCut,
        Self::MongoCutLong,
        Self::MongoCutAfterCommit,
        Self::MongoCutAfterUploadCommitLong,
        Self::RedisCut,
        Self::RedisCutAfterEnqueue,
        Self::S3Cut,
        Self::S3CutDuringPart,
        Self::S3CutAfterWholePut,
        Self::MongoCutAfterTusUpdate,
        Self::MongoCutAfterTusCommit,
        Self::Pause,
        Self::ReceiverDown,
        Self::ReceiverFailing,
        Self::ReceiverFailingLong,
        Self::ReceiverSlow,
        Self::Kill,
        Self::Drain,
        Self::RedisRestart,
        Self::RedisFlush,
        Self::ClusterMasterKill,
        Self::ClusterFailover,
        Self::SentinelFailover,
        Self::SentinelPrimaryKill,
        Self::RabbitCut,
        Self::RabbitCutAfterPublish,
        Self::RabbitKill,
        Self::RabbitConnectionsClosed,
        Self::RabbitAlarm,
    ];

    /// Whether the fault can happen in this coordination mode (nothing
    /// sends `XADD` in lock mode, nor with the queue on RabbitMQ), Redis
    /// topology (the Redis faults of a single node go through its proxy, a
    /// cluster's are failovers) and broker (RabbitMQ's faults on it only).
    fn applies(self, coordination: &str, topology: Topology, broker: QueueBroker) -> bool {
        let redis = match self {
            Self::RedisCut | Self::RedisRestart | Self::RedisFlush => Some(Topology::Node),
            Self::RedisCutAfterEnqueue => {
                return topology == Topology::Node
                    && coordination == "queue"
                    && broker == QueueBroker::Redis;
            }
            Self::RabbitCut
            | Self::RabbitCutAfterPublish
            | Self::RabbitKill
            | Self::RabbitConnectionsClosed
            | Self::RabbitAlarm => return broker == QueueBroker::Rabbitmq,
            Self::ClusterMasterKill | Self::ClusterFailover => Some(Topology::Cluster),
            Self::SentinelFailover | Self::SentinelPrimaryKill => Some(Topology::Sentinel),
            Self::ReceiverFailingLong => return dead_letters_in(coordination, topology),
            _ => None,
        };
        redis.is_none_or(|t| t == topology)
    }

    /// The kinds of the deck for `coordination` on that Redis topology
    /// and broker.
    pub fn deck(coordination: &str, topology: Topology, broker: QueueBroker) -> Vec<Fault> {
        Self::ALL
            .into_iter()
            .filter(|f| f.applies(coordination, topology, broker))
            .collect()
    }
}
