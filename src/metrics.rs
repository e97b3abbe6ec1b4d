//! Prometheus metrics, one registry per application instance.

use std::time::Duration;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabel {
    pub level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
}

/// A matched route (`/v1/files/{id}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

/// What an audited change did (`key_created`, `token_minted`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

/// Uploads last from milliseconds to hours: 10 ms … ~87 min.
fn upload_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.01, 2.0, 20,
    ))
}

fn latency_histogram() -> Histogram {
    // 0.1 ms … ~3.3 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 16,
    ))
}

/// Every metric filedock exports.
pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Family<RouteLabel, Histogram>,
    /// Requests whose handler panicked (each answered 500 `internal`).
    pub http_panics: Counter,
    /// Group committers that panicked (their waiting uploads answered 504 `outcome_unknown`).
    pub committer_panics: Counter,
    pub lock_wait: Family<LevelLabel, Histogram>,
    pub lock_timeouts: Family<LevelLabel, Counter>,
    pub lock_degraded: Family<LevelLabel, Counter>,
    /// Lock calls Redis answered with a topology redirect (MOVED, ASK…): 503, never degraded.
    pub lock_misrouted: Family<LevelLabel, Counter>,
    pub lock_lost: Family<LevelLabel, Counter>,
    pub txn_attempts: Family<OpLabel, Counter>,
    pub txn_write_conflicts: Family<OpLabel, Counter>,
    pub uploads: Family<OutcomeLabel, Counter>,
    pub upload_bytes: Counter,
    pub upload_duration: Histogram,
    pub orphans_recorded: Counter,
    pub uploads_in_flight: Gauge,
    pub s3_multipart: Family<OutcomeLabel, Counter>,
    pub orphans: Family<StatusLabel, Gauge>,
    pub upload_intents: Gauge,
    pub orphans_dead_lettered: Counter,
    pub sweeps: Family<OutcomeLabel, Counter>,
    pub queue_length: Gauge,
    pub queue_dead_letters: Gauge,
    pub queue_processed: Family<OutcomeLabel, Counter>,
    pub queue_grouped: Counter,
    pub queue_returned: Counter,
    pub upload_commit_txns: Counter,
    pub uploads_grouped: Counter,
    pub upload_commits_waiting: Gauge,
    pub mongo_commands: Counter,
    /// Requests sent to S3 (each attempt), by operation (`PutObject`, `UploadPart`…).
    pub s3_requests: Family<OpLabel, Counter>,
    /// Commands sent to Redis on the shared and dedicated connections (a pipeline counts each).
    pub redis_commands: Counter,
    /// The upload memory budget in bytes (0: no limit).
    pub upload_memory_limit: Gauge,
    /// Upload buffer bytes reserved now, and the most ever reserved at once.
    pub upload_memory_used: Gauge,
    pub upload_memory_peak: Gauge,
    /// Uploads waiting for buffer memory now, and reservations that waited.
    pub upload_memory_waiters: Gauge,
    pub upload_memory_waits: Counter,
    /// Reservations refused after waiting `FILEDOCK_UPLOAD_MEMORY_WAIT_SECS`.
    pub upload_memory_busy: Counter,
    /// Audited account changes, by action.
    pub audit_events: Family<ActionLabel, Counter>,
    /// Events removed past `FILEDOCK_EVENT_RETENTION_SECS`.
    pub events_expired: Counter,
    /// The age in seconds of the oldest event kept (0: none).
    pub events_oldest_age: Gauge,
    /// Events this instance's changes wrote (each with its change).
    pub events_written: Counter,
    /// Readers waiting for an event now (`GET /v1/events?wait=`).
    pub event_waiters: Gauge,
    /// Events this instance holds to deliver by webhook (read from the
    /// feed, not yet delivered nor dead-lettered).
    pub webhook_pending: Gauge,
    /// The age in seconds of the oldest of them (0: none).
    pub webhook_oldest_pending_age: Gauge,
    /// Webhook delivery attempts, by outcome (`delivered`, `failed`,
    /// `dead_lettered`, `dropped`, `replayed`).
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
    /// Dead letters kept (as this instance last counted them).
    pub webhook_dead_letters: Gauge,
    /// Calls of the pre-commit hook, by outcome (`accepted`, `rejected`,
    /// `failed_rejected`, `failed_allowed`).
    pub precommit_calls: Family<OutcomeLabel, Counter>,
    /// How long the pre-commit hook took to answer (or fail).
    pub precommit_latency: Histogram,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(latency_histogram),
            http_panics: Counter::default(),
            committer_panics: Counter::default(),
            lock_wait: Family::new_with_constructor(latency_histogram),
            lock_timeouts: Family::default(),
            lock_degraded: Family::default(),
            lock_misrouted: Family::default(),
            lock_lost: Family::default(),
            txn_attempts: Family::default(),
            txn_write_conflicts: Family::default(),
            uploads: Family::default(),
            upload_bytes: Counter::default(),
            upload_duration: upload_histogram(),
            orphans_recorded: Counter::default(),
            uploads_in_flight: Gauge::default(),
            s3_multipart: Family::default(),
            orphans: Family::default(),
            upload_intents: Gauge::default(),
            orphans_dead_lettered: Counter::default(),
            sweeps: Family::default(),
            queue_length: Gauge::default(),
            queue_dead_letters: Gauge::default(),
            queue_processed: Family::default(),
            queue_grouped: Counter::default(),
            queue_returned: Counter::default(),
            upload_commit_txns: Counter::default(),
            uploads_grouped: Counter::default(),
            upload_commits_waiting: Gauge::default(),
            mongo_commands: Counter::default(),
            s3_requests: Family::default(),
            redis_commands: Counter::default(),
            upload_memory_limit: Gauge::default(),
            upload_memory_used: Gauge::default(),
            upload_memory_peak: Gauge::default(),
            upload_memory_waiters: Gauge::default(),
            upload_memory_waits: Counter::default(),
            upload_memory_busy: Counter::default(),
            audit_events: Family::default(),
            events_expired: Counter::default(),
            events_oldest_age: Gauge::default(),
            events_written: Counter::default(),
            event_waiters: Gauge::default(),
            webhook_pending: Gauge::default(),
            webhook_oldest_pending_age: Gauge::default(),
            webhook_deliveries: Family::default(),
            webhook_dead_letters: Gauge::default(),
            precommit_calls: Family::default(),
            precommit_latency: upload_histogram(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "filedock_http_requests",
            "HTTP requests by route and status",
            m.http_requests.clone(),
        );
        r.register(
            "filedock_http_request_duration_seconds",
            "HTTP request duration by route",
            m.http_duration.clone(),
        );
        r.register(
            "filedock_audit_events",
            "Audited account changes (keys, tokens, quotas, deletions), by action",
            m.audit_events.clone(),
        );
        r.register(
            "filedock_events_expired",
            "Events removed past FILEDOCK_EVENT_RETENTION_SECS",
            m.events_expired.clone(),
        );
        r.register(
            "filedock_events_written",
            "Events written by this instance's changes, each in its change's transaction",
            m.events_written.clone(),
        );
        r.register(
            "filedock_event_waiters",
            "Readers waiting for an event now (GET /v1/events?wait=)",
            m.event_waiters.clone(),
        );
        r.register(
            "filedock_webhook_pending",
            "Events this instance holds to deliver by webhook",
            m.webhook_pending.clone(),
        );
        r.register(
            "filedock_webhook_oldest_pending_age_seconds",
            "The age of the oldest event this instance holds to deliver, in seconds (0: none)",
            m.webhook_oldest_pending_age.clone(),
        );
        r.register(
            "filedock_webhook_deliveries",
            "Webhook delivery attempts, by outcome (delivered, failed, dead_lettered, dropped, replayed)",
            m.webhook_deliveries.clone(),
        );
        r.register(
            "filedock_webhook_dead_letters",
            "Webhook dead letters kept (GET /v1/admin/events/dead)",
            m.webhook_dead_letters.clone(),
        );
        r.register(
            "filedock_precommit_calls",
            "Pre-commit hook calls, by outcome (accepted, rejected, failed_rejected, failed_allowed)",
            m.precommit_calls.clone(),
        );
        r.register(
            "filedock_precommit_duration_seconds",
            "How long the pre-commit hook took to answer",
            m.precommit_latency.clone(),
        );
        r.register(
            "filedock_events_oldest_age_seconds",
            "The age of the oldest event kept, in seconds (0: none)",
            m.events_oldest_age.clone(),
        );
        r.register(
            "filedock_http_panics",
            "Requests whose handler panicked (answered 500 internal)",
            m.http_panics.clone(),
        );
        r.register(
            "filedock_committer_panics",
            "Group committers that panicked (their uploads answered 504 outcome_unknown)",
            m.committer_panics.clone(),
        );
        r.register(
            "filedock_lock_wait_seconds",
            "Time spent waiting for a lock, by lock level",
            m.lock_wait.clone(),
        );
        r.register(
            "filedock_lock_timeouts",
            "Lock waits that hit their deadline, by lock level",
            m.lock_timeouts.clone(),
        );
        r.register("filedock_lock_degraded", "Operations that ran without a lock because the lock backend was down (development only)", m.lock_degraded.clone());
        r.register(
            "filedock_lock_misrouted",
            "Lock calls refused with 503 because Redis answered with a topology redirect (MOVED, ASK, TRYAGAIN, CROSSSLOT, READONLY), by lock level",
            m.lock_misrouted.clone(),
        );
        r.register(
            "filedock_lock_lost",
            "Leases lost while held (renewal failed), by lock level",
            m.lock_lost.clone(),
        );
        r.register(
            "filedock_txn_attempts",
            "Metadata transaction attempts, by operation",
            m.txn_attempts.clone(),
        );
        r.register(
            "filedock_txn_write_conflicts",
            "Transactions retried after a WriteConflict, by operation",
            m.txn_write_conflicts.clone(),
        );
        r.register("filedock_uploads", "Uploads by outcome", m.uploads.clone());
        r.register(
            "filedock_upload_bytes",
            "Bytes accepted in committed uploads",
            m.upload_bytes.clone(),
        );
        r.register(
            "filedock_upload_duration_seconds",
            "Upload duration, request start to commit",
            m.upload_duration.clone(),
        );
        r.register(
            "filedock_orphans_recorded",
            "Blobs recorded as orphans for the sweeper",
            m.orphans_recorded.clone(),
        );
        r.register(
            "filedock_uploads_in_flight",
            "Uploads currently streaming",
            m.uploads_in_flight.clone(),
        );
        r.register(
            "filedock_s3_multipart",
            "S3 multipart uploads: started, completed, aborted, abort_failed",
            m.s3_multipart.clone(),
        );
        r.register(
            "filedock_orphans",
            "Orphaned blobs by status, as of the last sweep",
            m.orphans.clone(),
        );
        r.register(
            "filedock_upload_intents",
            "Upload intents (uploads in flight or abandoned), as of the last sweep",
            m.upload_intents.clone(),
        );
        r.register(
            "filedock_orphans_dead_lettered",
            "Orphans marked failed after their last delete attempt",
            m.orphans_dead_lettered.clone(),
        );
        r.register(
            "filedock_sweeps",
            "Sweeper passes by outcome",
            m.sweeps.clone(),
        );
        r.register(
            "filedock_queue_length",
            "Queued operations not yet acknowledged, all buckets (queue mode)",
            m.queue_length.clone(),
        );
        r.register(
            "filedock_queue_dead_letters",
            "Operations in the queue's dead-letter stream",
            m.queue_dead_letters.clone(),
        );
        r.register(
            "filedock_queue_processed",
            "Queued operations this instance processed, by outcome",
            m.queue_processed.clone(),
        );
        r.register(
            "filedock_queue_grouped",
            "Queued operations this instance applied in one transaction with others",
            m.queue_grouped.clone(),
        );
        r.register(
            "filedock_queue_returned",
            "Operations RabbitMQ returned unrouted (their bucket's queue missing): declared again and published again once",
            m.queue_returned.clone(),
        );
        r.register(
            "filedock_upload_commit_txns",
            "Metadata transactions run to commit uploads (attempts; a group commit is one)",
            m.upload_commit_txns.clone(),
        );
        r.register(
            "filedock_uploads_grouped",
            "Uploads committed in one transaction with others of their user (group commit)",
            m.uploads_grouped.clone(),
        );
        r.register(
            "filedock_upload_commits_waiting",
            "Uploads whose bytes are stored, waiting for their user's next group commit",
            m.upload_commits_waiting.clone(),
        );
        r.register(
            "filedock_mongo_commands",
            "Commands sent to MongoDB (round trips)",
            m.mongo_commands.clone(),
        );
        r.register(
            "filedock_s3_requests",
            "Requests sent to S3 (round trips, retries included), by operation",
            m.s3_requests.clone(),
        );
        r.register(
            "filedock_redis_commands",
            "Commands sent to Redis (each command of a pipeline counts; a script call is one)",
            m.redis_commands.clone(),
        );
        r.register(
            "filedock_upload_memory_limit_bytes",
            "The budget for upload buffer memory (FILEDOCK_UPLOAD_MEMORY_BYTES; 0: no limit)",
            m.upload_memory_limit.clone(),
        );
        r.register(
            "filedock_upload_memory_used_bytes",
            "Upload buffer memory reserved now (parts being filled or sent, tus tails)",
            m.upload_memory_used.clone(),
        );
        r.register(
            "filedock_upload_memory_peak_bytes",
            "The most upload buffer memory reserved at once since start",
            m.upload_memory_peak.clone(),
        );
        r.register(
            "filedock_upload_memory_waiters",
            "Uploads waiting for buffer memory now (reading nothing from their clients)",
            m.upload_memory_waiters.clone(),
        );
        r.register(
            "filedock_upload_memory_waits",
            "Buffer reservations that had to wait for memory",
            m.upload_memory_waits.clone(),
        );
        r.register(
            "filedock_upload_memory_busy",
            "Buffer reservations refused after waiting FILEDOCK_UPLOAD_MEMORY_WAIT_SECS (answered 503 memory_busy)",
            m.upload_memory_busy.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    pub fn level(level: &str) -> LevelLabel {
        LevelLabel {
            level: level.to_owned(),
        }
    }

    pub fn op(op: &str) -> OpLabel {
        OpLabel { op: op.to_owned() }
    }

    pub fn observe_lock_wait(&self, level: &str, waited: Duration) {
        self.lock_wait
            .get_or_create(&Self::level(level))
            .observe(waited.as_secs_f64());
    }

    /// Counts one transaction's attempts and its conflict retries.
    pub fn observe_txn(&self, op: &str, retries: u32) {
        self.txn_attempts
            .get_or_create(&Self::op(op))
            .inc_by(u64::from(retries) + 1);
        if retries > 0 {
            self.txn_write_conflicts
                .get_or_create(&Self::op(op))
                .inc_by(u64::from(retries));
        }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
