//! The sweeper's staging pass: what the blob stores hold in staging that no
//! live upload owns goes. That is a plain write's temporary file older than
//! the grace (its upload died: a live one writes it at least every body idle
//! timeout), a staging file or tail object whose resumable upload is gone,
//! and a tail the upload's state replaced (a tail delete that failed, a
//! process that died between recording the new tail and dropping the old).
//! Only what was last written before the intent grace is looked at,
//! and a resumable upload's staging is judged under its lock; a tail past
//! the recorded offset stays while the upload lives (a PATCH that stalled
//! past its lease between storing and recording it may still record it;
//! one a PATCH that failed after storing it left goes once the upload's
//! last part is stored, by this pass or the clearing of a finished upload),
//! and a staging file whose upload has no state yet stays while its intent
//! is alive (an upload that an older version creates, intent first), or while it
//! is younger than the grace (the upload is being created: its intent and
//! state are stored together once its write has started).

use chrono::{DateTime, Utc};

use super::{SweepReport, Sweeper};
use crate::{
    blob::resumable::Staged,
    lock::{LockKey, TryLock},
    meta::ResumableRecord,
    vocab::{BlobKey, FileId, UserId},
};

impl Sweeper {
    /// Removes the staging no live upload owns (see the module's comment).
    pub(super) async fn sweep_staging(
        &self,
        stale_before: DateTime<Utc>,
        report: &mut SweepReport,
    ) -> anyhow::Result<()> {
        for staged in self.resumable_blobs.staged(stale_before).await? {
            let removed = match &staged {
                Staged::Temp(_) => self.remove(&staged).await,
                Staged::Tail(key @ BlobKey::Tail { start, end, .. }) => {
                    let owns = |r: Option<&ResumableRecord>| {
                        r.is_some_and(|r| may_need_tail(r, *start, *end))
                    };
                    let upload = (Some(&key.user()), &key.file_id());
                    self.remove_unowned(upload, &staged, owns).await
                }
                Staged::Tail(BlobKey::File { .. }) => Ok(false),
                Staged::Write {
                    upload: Some(id),
                    handle,
                } => {
                    // No state yet, its intent alive: being created.
                    let creating = self.intent_alive(id, stale_before).await;
                    let owns = |r: Option<&ResumableRecord>| match r {
                        Some(r) => &r.handle == handle,
                        None => creating,
                    };
                    // A staging file's name carries no owner.
                    self.remove_unowned((None, id), &staged, owns).await
                }
                // Made before staging files were named after their upload:
                // no owner can be told, so it stays.
                Staged::Write { upload: None, .. } => Ok(false),
            };
            match removed {
                Ok(true) => report.staging_removed += 1,
                Ok(false) => {}
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(?staged, error = %e, "could not remove staging; the next pass tries again");
                }
            }
        }
        Ok(())
    }

    async fn remove(&self, staged: &Staged) -> anyhow::Result<bool> {
        self.resumable_blobs.remove_staged(staged).await?;
        Ok(true)
    }

    /// Whether upload `id`'s intent is there and alive (an unreadable one
    /// counts as alive). Found by its id alone: a staging file's name
    /// carries no owner.
    async fn intent_alive(&self, id: &FileId, stale_before: DateTime<Utc>) -> bool {
        match self.meta.intent_by_id_alone(id).await {
            Ok(intent) => intent.is_some_and(|i| i.alive_at() >= stale_before),
            Err(_) => true,
        }
    }

    /// Removes the staging of upload `id` unless its record (if any) says
    /// it may be the upload's (`owns`), all under the upload's lock, so
    /// that no PATCH stores it again between the two. An upload whose lock
    /// is held is at work: what it staged is taken as its own. The record
    /// is found by its owner when the staging's name tells them.
    async fn remove_unowned(
        &self,
        (owner, id): (Option<&UserId>, &FileId),
        staged: &Staged,
        owns: impl Fn(Option<&ResumableRecord>) -> bool,
    ) -> anyhow::Result<bool> {
        let guard = match self.locks.try_acquire(&LockKey::resumable(id)).await? {
            TryLock::Held(g) => Some(g),
            TryLock::Degraded => None,
            TryLock::Busy => return Ok(false),
        };
        let result = async {
            let upload = match owner {
                Some(owner) => self.resumables.resumable(owner, id).await?,
                None => self.resumables.resumable_by_id_alone(id).await?,
            };
            match owns(upload.as_ref()) {
                true => Ok(false),
                false => self.remove(staged).await,
            }
        }
        .await;
        if let Some(g) = guard {
            g.release().await;
        }
        result
    }
}

/// Whether the upload may still need the tail `start..end`: the one its
/// state names (the bytes after its whole parts, until the last part is
/// stored: a deferred length declared at the offset by a PATCH that then
/// failed to write that part leaves every byte stored and the last ones
/// only in the tail), or one past its offset, which a PATCH that stalled
/// past its lease may yet record (such a tail of a failed PATCH goes when
/// the upload ends). A tail that ends at or before the offset and is not
/// the named one was replaced (its delete failed) and is never read again.
fn may_need_tail(upload: &ResumableRecord, start: u64, end: u64) -> bool {
    let (tail_start, offset) = (upload.tail_start() as u64, upload.offset as u64);
    let named = offset > tail_start && (start, end) == (tail_start, offset);
    !upload.last_part_stored() && (named || end > offset)
}
