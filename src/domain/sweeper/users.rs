//! Users' deletions, carried on by every sweep pass: a deletion begun by
//! `DELETE /v1/admin/users/{id}` marks the user (`deleting_since`) and
//! deletes their keys and tokens in one transaction; each pass then
//! deletes, in batches, their sessions and agents, their resumable uploads
//! (a PATCH in progress is asked to let go, which a PATCH of a user being
//! deleted does at once; then each is aborted as an expired one is), their
//! uploads in flight (intents turned into orphans, so that their commits
//! are refused), and their files (each batch one transaction that records
//! the blobs as pending orphans before any blob is deleted). Once the auth
//! caches have forgotten the user and a request authenticated just before
//! the mark had time to end, a pass deletes what is left under their blob
//! prefix and, if nothing of theirs is left, the user document. Every step
//! is idempotent and the mark is the job record: a crash anywhere only
//! delays the deletion to the next pass (of any instance).

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use chrono::Duration as ChronoDuration;

use super::{BATCH, SweepReport, Sweeper};
use crate::{
    blob::BlobError,
    lock::{LockKey, TryLock},
    meta::{UserRecord, now},
    vocab::BlobKey,
};

/// How long a pass waits for the request holding one of the user's
/// resumable uploads to let go: a PATCH asked stops at once, once its
/// parts in flight are stored; a holder that does not let go by then is
/// asked again by the next pass (a few seconds later while one is pending).
const UPLOAD_TAKE_OVER_WAIT: Duration = Duration::from_secs(5);

/// The most one pass waits for holders to let go, all users' uploads
/// together: past it an upload is only tried (and asked, for the next
/// pass), so holders that do not listen cannot keep the sweeper lock (and
/// every other sweep) for minutes.
const TAKE_OVER_BUDGET: Duration = Duration::from_secs(10);

/// Files one transaction deletes: a step short enough to leave the
/// user document (which each step writes) to others between steps.
const FILES_PER_STEP: usize = 100;

/// Files of one user a pass deletes at most: a user with millions of files
/// does not hold the sweeper lock (and every other sweep) for hours; the
/// worker passes again soon (`DELETION_PASS_DELAY`) while one is pending.
pub const FILES_PER_PASS: u64 = 5_000;

impl Sweeper {
    /// Carries every marked user's deletion on; one user that fails stops
    /// no other (it is counted in `failures` and left for the next pass).
    pub(super) async fn delete_users(&self, report: &mut SweepReport) -> anyhow::Result<()> {
        let waits_until = Instant::now() + TAKE_OVER_BUDGET;
        for user in self.deletions.users_being_deleted(BATCH).await? {
            match self.delete_user(&user, waits_until, report).await {
                Ok(true) => {}
                Ok(false) => report.deletions_pending += 1,
                Err(e) => {
                    // Not counted pending: a failing store is not retried
                    // every few seconds, but at the next regular pass.
                    report.failures += 1;
                    tracing::warn!(user_id = %user.id, error = %e, "user deletion interrupted; the next pass goes on");
                }
            }
        }
        Ok(())
    }

    /// One pass's share of `user`'s deletion: whether it ended. It waits
    /// for holders of the user's uploads to let go until `waits_until`.
    async fn delete_user(
        &self,
        user: &UserRecord,
        waits_until: Instant,
        report: &mut SweepReport,
    ) -> anyhow::Result<bool> {
        let id = &user.id;
        let Some(since) = user.deleting_since else {
            return Ok(true);
        };
        let mut deleted = 0_u64;
        while self.deletions.purge_containers(id, BATCH).await? > 0 {}
        let mut tried = HashSet::new();
        for listed in self.deletions.user_resumables(id, BATCH).await? {
            // A PATCH in progress holds the upload's lock: asked to let go,
            // it stops at once (its user is being deleted). One that does
            // not listen (a HEAD finishing the upload, a stalled process)
            // is left to the next pass.
            let key = LockKey::resumable(&listed.id);
            // Past the pass's budget, only tried: the next pass asks.
            let wait = waits_until.saturating_duration_since(Instant::now());
            let taken = match wait.min(UPLOAD_TAKE_OVER_WAIT) {
                Duration::ZERO => self.locks.try_acquire(&key).await?,
                wait => self.locks.take_over(&key, wait).await?,
            };
            let guard = match taken {
                TryLock::Held(g) => Some(g),
                TryLock::Degraded => None,
                TryLock::Busy => continue,
            };
            // Read again under the lock: the PATCH that let go may have
            // renewed it (the claim below expects the expiry it reads).
            let result = async {
                let Some(upload) = self
                    .resumables
                    .resumable(&listed.user_id, &listed.id)
                    .await?
                else {
                    return anyhow::Ok(());
                };
                let claimed = self
                    .resumables
                    .delete_resumable_if_expires(
                        &upload.user_id,
                        &upload.id,
                        upload.expires_at,
                        false,
                    )
                    .await?;
                match claimed.claimed() {
                    true => self.abort_claimed(&upload, report, &mut tried).await,
                    false => Ok(()),
                }
            }
            .await;
            if let Some(g) = guard {
                g.release().await;
            }
            result?;
        }
        // Uploads in flight: their intents go (as orphans), so that their
        // commits are refused.
        for intent in self.deletions.user_intents(id, BATCH).await? {
            if let Some(orphan) = self
                .meta
                .abandon_intent(&intent.user_id, &intent.id, None)
                .await?
            {
                report.intents_abandoned += 1;
                self.delete(orphan, report).await?;
            }
        }
        loop {
            let orphans = self.deletions.purge_files(id, FILES_PER_STEP).await?;
            if orphans.is_empty() {
                break;
            }
            report.user_files_deleted += orphans.len() as u64;
            deleted += orphans.len() as u64;
            for orphan in orphans {
                self.delete(orphan, report).await?;
            }
            if deleted >= FILES_PER_PASS {
                return Ok(false);
            }
        }
        if now() < since + ChronoDuration::from_std(self.deletion_settle)? {
            return Ok(false);
        }
        // Whatever an upload cut off mid-way left under the user's
        // prefixes (their files', their resumable uploads' staging).
        let mut left = self.blobs.list_keys(&format!("files/{id}/")).await?;
        left.extend(self.blobs.list_keys(&format!("tus/files/{id}/")).await?);
        for key in left {
            if let Some(key) = BlobKey::parse(&key) {
                match self.blobs.delete(&key).await {
                    Ok(()) | Err(BlobError::NotFound) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if self.deletions.finish_user_deletion(id).await? {
            report.users_deleted += 1;
            tracing::info!(user_id = %id, "user deleted");
            return Ok(true);
        }
        Ok(false)
    }
}
