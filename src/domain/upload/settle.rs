//! What an upload does when it cannot finish: settle a commit whose answer
//! was lost, or undo the upload (delete the blob, or record it as an orphan);
//! and the type check of a blob stored before its type could be checked.

use std::time::{Duration, Instant};

use super::{UploadService, Uploaded};
use crate::{
    blob::{ByteRange, ByteStream},
    domain::{DomainError, media},
    meta::{FileRecord, IntentRecord, MetaError, OrphanRecord, OrphanStatus},
};

/// Why a commit did not answer `Ok`.
pub(crate) enum CommitError {
    /// It did not happen: undo the upload.
    Failed(DomainError),
    /// It may have happened: the blob must stay until that is settled.
    OutcomeUnknown,
}

/// How long an upload whose commit answer was lost keeps trying to settle
/// it before answering `outcome_unknown` (the sweeper settles it later).
const SETTLE_FOR: Duration = Duration::from_secs(20);
/// The first and the longest pause between tries to settle.
const SETTLE_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

impl UploadService {
    /// The commit was sent but its answer was lost: it may have applied. The
    /// blob must not be deleted on a guess (that loses an acknowledged file).
    /// Abandoning the intent settles it: the commit deletes the intent in its
    /// transaction, so either the abandon finds the intent (the commit did not
    /// and now never can apply: the blob goes) or it finds none (the commit
    /// applied, or an earlier abandon did: the file record tells which). Until
    /// the store answers, the intent stays for the sweeper, whose grace rule
    /// decides the same way.
    pub(super) async fn settle_unknown_commit(
        &self,
        intent: &IntentRecord,
        file: FileRecord,
    ) -> Result<Uploaded, DomainError> {
        let deadline = Instant::now() + SETTLE_FOR;
        let mut pause = SETTLE_PAUSE.0;
        loop {
            match self.cleanup.abandon_intent(&intent.id, None).await {
                Ok(Some(orphan)) => {
                    tracing::warn!(file_id = %intent.id, "commit outcome was unknown; it did not apply");
                    self.delete_abandoned(&orphan).await;
                    return Err(DomainError::DependencyUnavailable("metadata store"));
                }
                Ok(None) => match self.files.file(&file.owner_id, &file.id).await {
                    Ok(Some(_)) => {
                        tracing::info!(file_id = %intent.id, "commit outcome was unknown; it applied");
                        return Ok(Uploaded {
                            file,
                            replayed: false,
                        });
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

    /// Undoes a failed upload: delete the blob, then the intent. If the delete
    /// fails, the blob is recorded as an orphan for the sweeper.
    pub(crate) async fn compensate(&self, intent: &IntentRecord) {
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
        self.forget_intent(intent).await;
    }

    /// Deletes the blob of an upload just abandoned; if that fails, the orphan
    /// stays pending and the sweeper retries it.
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

    pub(super) async fn forget_intent(&self, intent: &IntentRecord) {
        if let Err(e) = self.cleanup.delete_intent(&intent.id).await {
            tracing::warn!(file_id = %intent.id, error = %e, "could not delete upload intent; the sweeper will");
        }
    }
}

impl UploadService {
    /// The type to store for a blob already stored at `intent`'s key whose
    /// client declared `declared` (a resumable upload): detected from its
    /// first bytes and checked against the allow-list as a plain upload's
    /// is ([`media::resolve`]). Nothing is undone here, whatever the answer.
    pub(crate) async fn stored_type(
        &self,
        intent: &IntentRecord,
        declared: &str,
        len: u64,
    ) -> Result<String, DomainError> {
        let settings = &self.settings;
        let head: ByteStream<'_> = match len {
            0 => Box::pin(futures::stream::empty()),
            _ => {
                let end = len.min(media::SNIFF_BYTES as u64) - 1;
                let range = ByteRange { start: 0, end };
                self.blobs.get(&intent.key, Some(range)).await?
            }
        };
        let idle = settings.body_idle_timeout;
        let (stored, _) = media::resolve(declared, head, &settings.allowed_types, idle).await?;
        Ok(stored)
    }
}
