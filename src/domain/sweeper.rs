//! The orphan sweeper. One pass turns stale upload intents (their upload
//! died before committing) into orphans, then deletes the blobs of pending
//! orphans that are due; a blob that cannot be deleted is retried later and,
//! after the last retry, marked `failed` (the dead letter). One instance
//! sweeps at a time (a lock with lease renewal). The server runs passes on an
//! interval; `filedock sweep` runs one from cron.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::DomainError;
use crate::{
    blob::{BlobError, BlobStore, resumable::ResumableBlobs},
    config::SweepSettings,
    lock::{LockError, LockKey, Locks, TryLock},
    meta::{
        self, Claim, CleanupRepo, DeletionRepo, EventBell, EventRepo, KeyRepo, MetaError,
        OrphanRecord, OrphanStatus, ResumableRecord, ResumableRepo,
    },
    metrics::{Metrics, OutcomeLabel, StatusLabel},
    vocab::OrphanId,
    worker::{Worker, WorkerState},
};

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Stale intents turned into orphans.
    pub intents_abandoned: u64,
    pub orphans_deleted: u64,
    /// Deletes that failed and will be retried.
    pub orphans_retrying: u64,
    /// Orphans marked `failed` in this pass (dead letter).
    pub orphans_failed: u64,
    /// Expired resumable (tus) uploads aborted.
    pub resumables_expired: u64,
    /// Expired tokens deleted.
    pub tokens_expired: u64,
    /// Staging left by dead uploads removed: tail objects, staging files
    /// and plain writes' temporary files no live upload owns.
    pub staging_removed: u64,
    /// Steps that failed in this pass (an expiry, a staging removal), each
    /// logged and left for the next pass; the others went on.
    pub failures: u64,
    /// Files of users being deleted, deleted in this pass.
    pub user_files_deleted: u64,
    /// Users whose deletion ended in this pass.
    pub users_deleted: u64,
    /// Users whose deletion is still under way after this pass (more files
    /// than a pass deletes, or the auth caches not yet past the mark).
    pub deletions_pending: u64,
    /// Events older than `FILEDOCK_EVENT_RETENTION_SECS` removed.
    pub events_expired: u64,
}

/// How soon the worker passes again while a user's deletion is under way,
/// rather than after its whole interval (ten minutes by default).
pub const DELETION_PASS_DELAY: Duration = Duration::from_secs(2);

/// The result of [`Sweeper::try_run_once`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Swept(SweepReport),
    /// Another instance holds the sweeper lock.
    Busy,
}

mod staging;
#[cfg(test)]
mod tests;
mod users;

const BATCH: usize = 500;
/// Events removed by one delete, and by one pass at most (the next pass
/// goes on): a pass stays short however many expire at once.
const EVENT_BATCH: usize = 1000;
const EVENT_BATCHES: usize = 20;

pub struct Sweeper {
    pub(crate) meta: Arc<dyn CleanupRepo>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    /// Resumable uploads: an expired one's write is aborted, its state dropped.
    pub(crate) resumables: Arc<dyn ResumableRepo>,
    pub(crate) resumable_blobs: Arc<dyn ResumableBlobs>,
    /// Expired tokens go.
    pub(crate) keys: Arc<dyn KeyRepo>,
    pub(crate) locks: Arc<Locks>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: SweepSettings,
    /// Users being deleted: each pass carries their deletion on.
    pub(crate) deletions: Arc<dyn DeletionRepo>,
    /// Events past their retention go; an expired upload's claim, which
    /// writes its `upload.expired`, rings for it.
    pub(crate) events: Arc<dyn EventRepo>,
    pub(crate) bell: Arc<dyn EventBell>,
    /// Wakes this instance's event sequencer each pass: an event whose
    /// instance died before placing it in the feed is placed then (and a
    /// deleted user's events, which go once placed).
    pub(crate) sequencer: Arc<tokio::sync::Notify>,
    /// How long after a deletion began a request that authenticated just
    /// before may still write (the auth cache's lifetime and a grace): the
    /// deletion ends only past it.
    pub(crate) deletion_settle: Duration,
}

impl Sweeper {
    /// One pass, unless another instance is sweeping.
    pub async fn try_run_once(&self) -> anyhow::Result<Outcome> {
        // Whoever sweeps: this instance places what no commit placed.
        self.sequencer.notify_one();
        let outcome = self.under_lock(self.pass()).await;
        self.update_gauges().await;
        outcome
    }

    /// Only the users' deletions (no orphans, intents, expiries or
    /// staging): what the worker runs every [`DELETION_PASS_DELAY`] while
    /// one is under way, between its full passes.
    pub async fn try_run_deletions(&self) -> anyhow::Result<Outcome> {
        // A deletion removes a user's events once placed in the feed.
        self.sequencer.notify_one();
        self.under_lock(async {
            let mut report = SweepReport::default();
            self.delete_users(&mut report).await?;
            Ok(report)
        })
        .await
    }

    /// Whether a user's deletion is under way (begun on any instance); an
    /// index lookup. A store that does not answer says no.
    pub async fn deletions_pending(&self) -> bool {
        match self.deletions.users_being_deleted(1).await {
            Ok(users) => !users.is_empty(),
            Err(e) => {
                tracing::debug!(error = %e, "could not tell whether a deletion is under way");
                false
            }
        }
    }

    /// Runs `work` under the sweeper lock, unless another instance holds it.
    async fn under_lock(
        &self,
        work: impl Future<Output = anyhow::Result<SweepReport>>,
    ) -> anyhow::Result<Outcome> {
        let guard = match self.locks.try_acquire(&LockKey::sweeper()).await? {
            TryLock::Held(g) => Some(g),
            TryLock::Degraded => None,
            TryLock::Busy => {
                self.count("busy");
                return Ok(Outcome::Busy);
            }
        };
        let result = work.await;
        if let Some(g) = guard {
            g.release().await;
        }
        self.count(if result.is_ok() { "swept" } else { "error" });
        result.map(Outcome::Swept)
    }

    /// [`Self::try_run_once`] for a caller that answers a client: a store,
    /// blob store or lock backend that cannot be reached is an outage
    /// (`DependencyUnavailable`), not a bug.
    pub async fn run_once_now(&self) -> Result<Outcome, DomainError> {
        self.try_run_once().await.map_err(|e| {
            let e = match e.downcast::<MetaError>() {
                Ok(e) => return e.into(),
                Err(e) => e,
            };
            let e = match e.downcast::<BlobError>() {
                Ok(e) => return e.into(),
                Err(e) => e,
            };
            match e.downcast::<LockError>() {
                Ok(e) => e.into(),
                Err(e) => DomainError::Internal(e),
            }
        })
    }

    async fn pass(&self) -> anyhow::Result<SweepReport> {
        let s = &self.settings;
        let now = meta::now();
        let mut report = SweepReport::default();
        // Each orphan at most once a pass, however fine the retry interval.
        let mut tried = std::collections::HashSet::new();
        for upload in self.resumables.expired_resumables(now, BATCH).await? {
            let id = upload.id;
            // One upload that cannot be expired now stops no other.
            if let Err(e) = self.expire(upload, now, &mut report, &mut tried).await {
                report.failures += 1;
                tracing::warn!(upload = %id, error = %e, "could not expire a resumable upload; the next pass tries again");
            }
        }
        // One step that cannot run now (a write conflict) stops no other.
        match self.keys.delete_expired_tokens(now).await {
            Ok(n) => report.tokens_expired = n,
            Err(e) => {
                report.failures += 1;
                tracing::warn!(error = %e, "could not delete expired tokens; the next pass tries again");
            }
        }
        let stale_before = now - chrono::Duration::from_std(s.intent_grace)?;
        for intent in self.meta.intents(stale_before, BATCH).await? {
            // A resumable upload waits for its client between PATCHes until it
            // expires (above), however long that is.
            if self
                .resumables
                .resumable(&intent.user_id, &intent.id)
                .await?
                .is_some()
            {
                continue;
            }
            // Abandoning is a transaction that deletes the intent: if the
            // upload commits first, there is nothing to abandon.
            // It is re-checked there too: its upload may have refreshed it since.
            let abandoned =
                (self.meta).abandon_intent(&intent.user_id, &intent.id, Some(stale_before));
            let abandoned = match abandoned.await {
                // Another transaction holds it (a live commit, or one a cut
                // link stranded until it is ended): the next pass sees.
                Err(e) if e.is_write_conflict() => {
                    tracing::info!(file_id = %intent.id, "intent busy; left for the next pass");
                    continue;
                }
                abandoned => abandoned?,
            };
            if let Some(orphan) = abandoned {
                report.intents_abandoned += 1;
                tried.insert(orphan.id);
                self.delete(orphan, &mut report).await?;
            }
        }
        let retry_before = now - chrono::Duration::from_std(s.retry_interval)?;
        for orphan in self
            .meta
            .orphans_due(s.max_retries, retry_before, BATCH)
            .await?
        {
            if !tried.contains(&orphan.id) {
                self.delete(orphan, &mut report).await?;
            }
        }
        self.sweep_staging(stale_before, &mut report).await?;
        self.delete_users(&mut report).await?;
        let kept_after = now - chrono::Duration::from_std(s.event_retention)?;
        match self.expire_events(kept_after).await {
            Ok(n) => report.events_expired = n,
            Err(e) => {
                report.failures += 1;
                tracing::warn!(error = %e, "could not remove expired events; the next pass tries again");
            }
        }
        if report != SweepReport::default() {
            tracing::info!(?report, "sweep pass");
        }
        Ok(report)
    }

    /// Aborts an expired resumable upload. Under its lock (a PATCH in
    /// progress holds it: the upload is left to it) the record is read
    /// again, and claimed by deleting it only if no PATCH renewed it since
    /// (which also keeps a renewed upload safe when locks are degraded, and
    /// a PATCH that comes after the claim finds no upload to advance). Then
    /// its blob store write goes, and its intent as an orphan, deleted
    /// here. A pass that stops after the claim leaves an intent past its
    /// time, which the stale-intent scan takes, and staging no record
    /// names, which [`Self::sweep_staging`] removes. A committed upload's
    /// record only goes (its blob is the file's).
    async fn expire(
        &self,
        listed: ResumableRecord,
        now: chrono::DateTime<chrono::Utc>,
        report: &mut SweepReport,
        tried: &mut std::collections::HashSet<OrphanId>,
    ) -> anyhow::Result<()> {
        let guard = match self
            .locks
            .try_acquire(&LockKey::resumable(&listed.id))
            .await?
        {
            TryLock::Held(g) => Some(g),
            TryLock::Degraded => None,
            TryLock::Busy => return Ok(()),
        };
        let result = async {
            // The listing may be stale: a PATCH may have renewed it since.
            let Some(upload) = self
                .resumables
                .resumable(&listed.user_id, &listed.id)
                .await?
            else {
                return Ok(());
            };
            if upload.expires_at >= now {
                return Ok(());
            }
            let claim = self.resumables.delete_resumable_if_expires(
                &upload.user_id,
                &upload.id,
                upload.expires_at,
                true,
            );
            match claim.await? {
                Claim::Missed => return Ok(()),
                Claim::Claimed { told: false } => {}
                Claim::Claimed { told: true } => {
                    self.metrics.events_written.inc();
                    self.bell.ring(&upload.user_id).await;
                }
            }
            self.abort_claimed(&upload, report, tried).await
        }
        .await;
        if let Some(g) = guard {
            g.release().await;
        }
        result
    }

    /// Aborts a resumable upload whose record was claimed (deleted): its
    /// blob store write goes, and its intent as an orphan, deleted here.
    async fn abort_claimed(
        &self,
        upload: &ResumableRecord,
        report: &mut SweepReport,
        tried: &mut std::collections::HashSet<OrphanId>,
    ) -> anyhow::Result<()> {
        {
            let (key, handle) = (&upload.key, &upload.handle);
            if upload.committed {
                // Its blob is a file's (the record is claimed above): only
                // what staging may have kept goes (else the staging sweep's).
                self.resumable_blobs.clear_staging(key, handle).await?;
                report.resumables_expired += 1;
                return anyhow::Ok(());
            }
            let cleared = match upload.completed {
                // Every byte stored, the commit refused: the object goes
                // with the intent's orphan, below.
                true => self.resumable_blobs.clear_staging(key, handle).await,
                false => self.resumable_blobs.abort(key, handle).await,
            };
            if let Err(e) = cleared {
                // The store away: the claimed record goes back, still
                // expired (no PATCH or HEAD finds it), so that the next pass
                // aborts again, the blob store's write being named nowhere
                // else. A write the store refuses otherwise is left to its
                // backstops (the staging sweep; S3's lifecycle rule), not
                // tried for ever.
                if matches!(e, BlobError::Unavailable(_)) {
                    self.resumables.restore_resumable(upload).await?;
                }
                return Err(e.into());
            }
            report.resumables_expired += 1;
            if let Some(orphan) = self
                .meta
                .abandon_intent(&upload.user_id, &upload.id, None)
                .await?
            {
                report.intents_abandoned += 1;
                tried.insert(orphan.id);
                self.delete(orphan, report).await?;
            }
            anyhow::Ok(())
        }
    }

    async fn delete(&self, orphan: OrphanRecord, report: &mut SweepReport) -> anyhow::Result<()> {
        let meta = &self.meta;
        match self.blobs.delete(&orphan.key).await {
            Ok(()) => {
                meta.mark_orphan(&orphan.id, OrphanStatus::Deleted, None)
                    .await?;
                report.orphans_deleted += 1;
            }
            Err(e) => {
                let last = orphan.retries + 1 >= self.settings.max_retries;
                let status = if last {
                    OrphanStatus::Failed
                } else {
                    OrphanStatus::Pending
                };
                meta.mark_orphan(&orphan.id, status, Some(e.to_string()))
                    .await?;
                if last {
                    report.orphans_failed += 1;
                    self.metrics.orphans_dead_lettered.inc();
                    tracing::error!(bucket = %orphan.bucket, key = %orphan.key, error = %e, "orphan could not be deleted after its last retry; marked failed");
                } else {
                    report.orphans_retrying += 1;
                    tracing::warn!(key = %orphan.key, error = %e, "orphan delete failed; will retry");
                }
            }
        }
        Ok(())
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .sweeps
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Removes events written before `kept_after`, oldest first, in
    /// batches, at most [`EVENT_BATCHES`] of them a pass; how many.
    async fn expire_events(
        &self,
        kept_after: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<u64> {
        let mut gone = 0;
        for _ in 0..EVENT_BATCHES {
            let n = self.events.expire_events(kept_after, EVENT_BATCH).await? as u64;
            self.metrics.events_expired.inc_by(n);
            gone += n;
            if n < EVENT_BATCH as u64 {
                break;
            }
        }
        Ok(gone)
    }

    async fn update_gauges(&self) {
        if let Ok(oldest) = self.events.oldest_event().await {
            let age = oldest.map_or(0, |t| (meta::now() - t).num_seconds().max(0));
            self.metrics.events_oldest_age.set(age);
        }
        if let Ok(c) = self.meta.counts().await {
            let m = &self.metrics;
            m.upload_intents.set(c.intents as i64);
            for (status, n) in [
                ("pending", c.orphans_pending),
                ("deleted", c.orphans_deleted),
                ("failed", c.orphans_failed),
            ] {
                m.orphans
                    .get_or_create(&StatusLabel {
                        status: status.into(),
                    })
                    .set(n as i64);
            }
        }
    }
}

/// The sweeper as a background worker: a full pass every `interval` (the
/// first one `interval` after the start); a pass that fails backs off
/// (doubling, up to 8 intervals). Between full passes it looks every
/// [`DELETION_PASS_DELAY`] (one index lookup) whether a user's deletion is
/// under way (begun by any instance, seen in the store), and if so runs a
/// pass of only the deletions: a deletion goes on within seconds of its
/// `DELETE` and of a restart, without the full pass's cost.
pub struct SweepWorker {
    sweeper: Arc<Sweeper>,
    interval: Duration,
    backoff: Duration,
    next_full: tokio::time::Instant,
    last: &'static str,
}

impl SweepWorker {
    pub fn new(sweeper: Arc<Sweeper>, interval: Duration) -> Self {
        Self {
            sweeper,
            interval,
            backoff: interval,
            next_full: tokio::time::Instant::now() + interval,
            last: "not run yet",
        }
    }
}

#[async_trait]
impl Worker for SweepWorker {
    fn name(&self) -> String {
        "sweeper".into()
    }

    fn status(&self) -> String {
        format!("last pass: {}", self.last)
    }

    fn first_delay(&self) -> Duration {
        DELETION_PASS_DELAY.min(self.interval)
    }

    async fn work(&mut self, _stop: &CancellationToken) -> WorkerState {
        let full = tokio::time::Instant::now() >= self.next_full;
        let ran = if full {
            Some(self.sweeper.try_run_once().await)
        } else if self.sweeper.deletions_pending().await {
            Some(self.sweeper.try_run_deletions().await)
        } else {
            None
        };
        let failed = match ran {
            Some(Err(e)) => {
                self.last = "failed";
                tracing::warn!(error = %e, "sweep pass failed; backing off");
                true
            }
            Some(Ok(_)) => {
                self.last = "ok";
                false
            }
            None => false,
        };
        if full {
            self.backoff = match failed {
                true => (self.backoff * 2).min(self.interval * 8),
                false => self.interval,
            };
            self.next_full = tokio::time::Instant::now() + self.backoff;
        }
        let until_full = self
            .next_full
            .saturating_duration_since(tokio::time::Instant::now());
        // A failing store is not tried every few seconds: the next full
        // pass (backed off) tries again.
        if failed {
            return WorkerState::Idle(until_full);
        }
        // Every few seconds, one index lookup: is a deletion under way?
        WorkerState::Idle(DELETION_PASS_DELAY.min(until_full))
    }
}
