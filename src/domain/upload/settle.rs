//! What becomes of a blob whose commit did not answer `Committed`: undo it
//! (the commit was refused: delete the blob, or record it as an orphan, and
//! forget the intent) or settle it (the answer was lost: find out whether
//! it applied). These are the caller's to choose (a plain upload undoes a
//! refusal and settles an unknown outcome; a resumable upload keeps both
//! for its next try); an unknown outcome is settled, never undone.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    blob::BlobStore,
    domain::DomainError,
    meta::{
        CleanupRepo, FileRecord, FileRepo, IntentRecord, MetaError, OrphanRecord, OrphanStatus,
    },
    metrics::Metrics,
};

/// The first and the longest pause between tries to settle.
const SETTLE_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// The ports undoing and settling take.
pub(super) struct Undo {
    pub(super) files: Arc<dyn FileRepo>,
    pub(super) cleanup: Arc<dyn CleanupRepo>,
    pub(super) blobs: Arc<dyn BlobStore>,
    pub(super) metrics: Arc<Metrics>,
    /// How long an unknown outcome is read back before `outcome_unknown`.
    pub(super) settle_window: Duration,
}

impl Undo {
    /// Undoes an upload that did not commit: delete the blob, then the
    /// intent. If the delete fails, the blob is recorded as an orphan for
    /// the sweeper.
    pub(super) async fn undo(&self, intent: &IntentRecord) {
        if let Err(e) = self.blobs.delete(&intent.key).await {
            tracing::warn!(key = %intent.key, error = %e, "compensating blob delete failed; recording an orphan");
            let orphan = OrphanRecord::pending(&intent.bucket, &intent.key, Some(e.to_string()));
            if let Err(e) = self.cleanup.record_orphan(&orphan).await {
                // The intent stays behind, so the sweeper still finds the blob.
                tracing::error!(key = %intent.key, error = %e, "could not record orphan; leaving the intent for the sweeper");
                return;
            }
            self.metrics.orphans_recorded.inc();
        }
        self.forget(intent).await;
    }

    /// Ends an upload that must not commit (refused after its bytes were
    /// stored) for good, whoever else works on it: its intent abandoned
    /// first (an orphan, whose blob goes now or at the sweeper's next
    /// pass), so that no commit can apply after. `false` if the intent was
    /// gone: a commit took it (another request on the upload committed it
    /// meanwhile) or the sweeper did; nothing is deleted then.
    pub(super) async fn refuse(&self, intent: &IntentRecord) -> Result<bool, MetaError> {
        let abandoned = self
            .cleanup
            .abandon_intent(&intent.user_id, &intent.id, None)
            .await?;
        let Some(orphan) = abandoned else {
            return Ok(false);
        };
        self.delete_abandoned(&orphan).await;
        Ok(true)
    }

    /// Forgets the intent of an upload that stored nothing.
    pub(super) async fn forget(&self, intent: &IntentRecord) {
        if let Err(e) = self
            .cleanup
            .delete_intent(&intent.user_id, &intent.id)
            .await
        {
            tracing::warn!(file_id = %intent.id, error = %e, "could not delete upload intent; the sweeper will");
        }
    }

    /// The commit of `file` was sent but its answer was lost: it may have
    /// applied. The blob must not be deleted on a guess (that loses an
    /// acknowledged file). Abandoning the intent settles it: the commit
    /// deletes the intent in its transaction, so either the abandon finds
    /// the intent (the commit did not and now never can apply: the blob
    /// goes) or it finds none (the commit applied, or an earlier abandon
    /// did: the file record tells which). Until the store answers, the
    /// intent stays for the sweeper, whose grace rule decides the same way.
    /// `Ok(file)`: it applied; else why not, or `OutcomeUnknown`.
    pub(super) async fn settle(
        &self,
        intent: &IntentRecord,
        file: FileRecord,
    ) -> Result<FileRecord, DomainError> {
        // `FILEDOCK_SETTLE_WINDOW_SECS`: then `outcome_unknown`, and the sweeper settles it.
        let deadline = Instant::now() + self.settle_window;
        let mut pause = SETTLE_PAUSE.0;
        loop {
            match self
                .cleanup
                .abandon_intent(&intent.user_id, &intent.id, None)
                .await
            {
                Ok(Some(orphan)) => {
                    tracing::warn!(file_id = %intent.id, "commit outcome was unknown; it did not apply");
                    self.delete_abandoned(&orphan).await;
                    return Err(DomainError::DependencyUnavailable("metadata store"));
                }
                Ok(None) => match self.files.file(&file.owner_id, &file.id).await {
                    Ok(Some(_)) => {
                        tracing::info!(file_id = %intent.id, "commit outcome was unknown; it applied");
                        return Ok(file);
                    }
                    Ok(None) => return Err(DomainError::DependencyUnavailable("metadata store")),
                    Err(e) => tracing::debug!(error = %e, "reading back an unknown commit"),
                },
                Err(e) => tracing::debug!(error = %e, "settling an unknown commit"),
            }
            if Instant::now() + pause > deadline {
                tracing::warn!(file_id = %intent.id, "commit outcome still unknown; the sweeper will settle it");
                return Err(DomainError::OutcomeUnknown(Some(format!(
                    "/v1/files/{}",
                    intent.id
                ))));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(SETTLE_PAUSE.1);
        }
    }

    /// Deletes the blob of an upload just abandoned; if that fails, the
    /// orphan stays pending and the sweeper retries it.
    async fn delete_abandoned(&self, orphan: &OrphanRecord) {
        let deleted = match self.blobs.delete(&orphan.key).await {
            Ok(()) => {
                self.cleanup
                    .mark_orphan(&orphan.id, OrphanStatus::Deleted, None)
                    .await
            }
            Err(e) => Err(MetaError::Other(e.to_string())),
        };
        if let Err(e) = deleted {
            tracing::warn!(key = %orphan.key, error = %e, "abandoned upload's blob left for the sweeper");
        }
    }
}
