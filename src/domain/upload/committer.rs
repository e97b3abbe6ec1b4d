//! [`Committer`]: the one commit of an upload whose bytes are stored, a
//! plain upload's and a resumable one's alike. It owns the locks (the
//! category lock where the scope puts it, then the user's commit lock), the
//! fence, group commit, and what undoing and settling take; it builds the
//! commit (the one place: a change every commit must carry joins it here)
//! and answers [`Commit`]: committed, refused, or unknown. What becomes of
//! the blob then is the caller's to decide ([`Staged`]): a plain upload
//! undoes a refusal and settles an unknown outcome; a resumable upload
//! keeps both, for the PATCH or HEAD that retries it.

use std::sync::Arc;

use super::{
    group::CommitGroups,
    idempotency::fingerprint,
    intents::IntentBatches,
    path::{CommitPath, Grouped, OneByOne},
    precommit::{Asking, PrecommitHook},
    scope::{Hold, LockScope, scope},
    settle::Undo,
    staged::{OnDrop, Staged},
};
use crate::{
    blob::BlobStore,
    config::Settings,
    domain::{DomainError, commit::UserCommitError},
    lock::Locks,
    meta::retry::Transactions,
    meta::{
        CleanupRepo, CommitOutcome, CommitUpload, FileRecord, FileRepo, IdempotencyClaim,
        IdempotencyRecord, IntentRecord, MetaError, MetaResult, ResumableRecord, StateAdvance,
        UserTurns,
    },
    metrics::Metrics,
    vocab::{FileId, Filename, IdempotencyKey, SizeCategory, UserId},
};

/// A blob stored at its intent's key, ready to commit.
pub struct StoredBlob {
    pub filename: Filename,
    pub content_type: String,
    pub size: u64,
    pub sha256: String,
    pub category: SizeCategory,
    pub idempotency_key: Option<IdempotencyKey>,
    /// A resumable upload's: the commit releases its reservation.
    pub resumable: bool,
    /// Its state, when the commit records its last bytes ([`CommitUpload::state`]).
    pub state: Option<Box<StateAdvance>>,
}

/// What a commit came to.
pub enum Commit {
    /// The file is committed.
    Committed(FileRecord),
    /// It did not apply, and never will.
    Refused(Refusal),
    /// It may have applied (its answer was lost): this is the file it would
    /// be. Never undone on a guess: settled, or kept for a retry.
    Unknown(FileRecord),
}

/// Why a commit did not apply.
pub enum Refusal {
    /// Another request with the upload's `Idempotency-Key` committed first:
    /// its record, and whether it was the same request (body, filename and
    /// content type: its fingerprint).
    KeyUsed {
        first: Box<IdempotencyRecord>,
        same: bool,
    },
    Error(DomainError),
}

/// The commit of uploads, and the ports and strategies it takes.
pub struct Committer {
    /// Chosen at start-up: one transaction per upload, or group commit.
    path: Box<dyn CommitPath>,
    /// Chosen at start-up: where the category lock is taken.
    scope: Box<dyn LockScope>,
    locks: Arc<Locks>,
    undo: Arc<Undo>,
    bucket: String,
    quota_bytes: Option<u64>,
    /// How its transactions run (and are counted), for what commits with it.
    txns: Transactions,
    /// Whose turn it is to write a user's record (its commits take it).
    turns: Arc<UserTurns>,
    /// Asked before each commit, when one is configured.
    hook: Option<Arc<PrecommitHook>>,
}

impl Committer {
    pub fn new(
        files: Arc<dyn FileRepo>,
        cleanup: Arc<dyn CleanupRepo>,
        blobs: Arc<dyn BlobStore>,
        locks: Arc<Locks>,
        txns: Transactions,
        metrics: Arc<Metrics>,
        settings: &Settings,
    ) -> Self {
        let turns = Arc::new(UserTurns::default());
        let path: Box<dyn CommitPath> = match settings.upload_group_commit {
            true => Box::new(Grouped {
                groups: CommitGroups::new(
                    files.clone(),
                    locks.clone(),
                    txns.clone(),
                    metrics.clone(),
                    settings.upload_group_max,
                    turns.clone(),
                ),
                intents: IntentBatches::new(cleanup.clone(), settings.upload_group_max),
            }),
            false => Box::new(OneByOne {
                files: files.clone(),
                cleanup: cleanup.clone(),
                locks: locks.clone(),
                txns: txns.clone(),
                metrics: metrics.clone(),
                turns: turns.clone(),
            }),
        };
        Self {
            path,
            scope: scope(settings.lock.scope),
            locks,
            bucket: blobs.bucket().to_owned(),
            undo: Arc::new(Undo {
                files,
                cleanup,
                blobs,
                metrics,
                settle_window: settings.settle_window,
            }),
            quota_bytes: settings.user_quota_bytes,
            txns,
            turns,
            hook: None,
        }
    }

    /// Asks `hook` before each commit.
    pub fn with_hook(mut self, hook: Option<Arc<PrecommitHook>>) -> Self {
        self.hook = hook;
        self
    }

    /// Ends the upload of `intent` for good after a refusal that came once
    /// its bytes were stored (see `Undo::refuse`): `false` if another
    /// request committed it, or the sweeper took it, meanwhile.
    pub async fn refuse(&self, intent: &IntentRecord) -> Result<bool, DomainError> {
        Ok(self.undo.refuse(intent).await?)
    }

    /// What the pre-commit hook says of `stored` (file `file_id` of
    /// `owner`): `Ok` without a hook. Before the commit's lock (with
    /// `FILEDOCK_LOCK_SCOPE=upload` the size category's lock, taken before
    /// the bytes, is held through it).
    pub async fn ask_hook(
        &self,
        owner: &UserId,
        file_id: FileId,
        stored: &StoredBlob,
    ) -> Result<(), DomainError> {
        let Some(hook) = &self.hook else {
            return Ok(());
        };
        let asking = Asking {
            owner: *owner,
            file_id,
            filename: stored.filename.as_str(),
            size: stored.size,
            sha256: &stored.sha256,
            content_type: &stored.content_type,
        };
        hook.ask(&asking).await
    }

    /// How its transactions run and are counted.
    pub fn txns(&self) -> &Transactions {
        &self.txns
    }

    /// The turns of each user's writes to their record, which its commits
    /// take: the other writes of a user's record take them too.
    pub fn turns(&self) -> Arc<UserTurns> {
        self.turns.clone()
    }

    /// The intent of a new upload by `user`: a new file id, its blob at
    /// the file's key in this store's bucket.
    pub fn new_intent(&self, user: UserId) -> IntentRecord {
        IntentRecord::new(user, FileId::new(), &self.bucket)
    }

    /// The intent of resumable upload `upload`, as its creation stored it
    /// ([`Self::new_intent`]) but for its times: what its commit needs
    /// (the file's id, owner, bucket and key), without reading it. The
    /// commit's delete of the stored one is what tells it is still there.
    pub fn intent_of(&self, upload: &ResumableRecord) -> IntentRecord {
        let mut intent = IntentRecord::new(upload.user_id, upload.id, &self.bucket);
        intent.key = upload.key;
        intent.alive_until = Some(upload.expires_at);
        intent
    }

    /// Stores the intent of an upload about to store its first byte; its
    /// blob is then `staged`'s.
    pub async fn stage(&self, intent: IntentRecord, on_drop: OnDrop) -> MetaResult<Staged> {
        self.path.put_intent(&intent).await?;
        Ok(self.staged(intent, on_drop))
    }

    /// The blob of an upload whose intent is stored already.
    pub fn staged(&self, intent: IntentRecord, on_drop: OnDrop) -> Staged {
        Staged::new(intent, on_drop, self.undo.clone())
    }

    /// What the bytes of `user`'s upload of `category` stream under: the
    /// category lock with lock scope `upload`, else nothing.
    pub async fn before_bytes(
        &self,
        user: &UserId,
        category: SizeCategory,
    ) -> Result<Hold, DomainError> {
        let held = self.scope.before_bytes(&self.locks, user, category).await?;
        Ok(Hold::held(held, category))
    }

    /// Commits `stored`, the blob `staged` holds, under the locks and the
    /// fence its scope takes (`hold`, released here): file, owner
    /// permission, usage and quota, fence, idempotency key and the intent's
    /// delete, in one retried transaction (or one shared with the user's
    /// other uploads ready at the same time). Nothing is undone or settled
    /// here, whatever the answer.
    pub async fn commit(&self, staged: &mut Staged, hold: Hold, stored: StoredBlob) -> Commit {
        let intent = staged.intent();
        let idempotency = stored.idempotency_key.map(|key| IdempotencyClaim {
            fingerprint: fingerprint(
                &stored.sha256,
                stored.filename.as_str(),
                &stored.content_type,
            ),
            key,
        });
        let file = FileRecord {
            id: intent.id,
            owner_id: intent.user_id,
            filename: stored.filename.as_str().to_owned(),
            content_type: stored.content_type,
            size: stored.size as i64,
            sha256: stored.sha256,
            category: stored.category,
            bucket: intent.bucket.clone(),
            key: intent.key,
            created_at: crate::meta::now(),
            sessions: Vec::new(),
            agents: Vec::new(),
        };
        // Every upload's commit is built here, whichever path takes it.
        let commit = CommitUpload {
            file,
            fence: hold.fence(),
            quota_bytes: self.quota_bytes,
            idempotency,
            resumable: stored.resumable,
            state: stored.state,
        };
        let (user, category) = (intent.user_id, hold.to_take());
        staged.sending();
        crate::crash_point("before_commit");
        let answer = self.path.commit(&user, category, commit.clone()).await;
        hold.release().await;
        match answer {
            Ok(CommitOutcome::Committed) => {
                crate::crash_point("after_commit");
                staged.committed();
                Commit::Committed(commit.file)
            }
            Ok(CommitOutcome::Replayed(first)) => {
                staged.refused();
                let ours = commit.idempotency.as_ref().map(|k| k.fingerprint.as_str());
                let same = first.fingerprint.is_empty() || Some(first.fingerprint.as_str()) == ours;
                Commit::Refused(Refusal::KeyUsed { first, same })
            }
            Err(UserCommitError::Meta(MetaError::OutcomeUnknown(_))) => {
                Commit::Unknown(commit.file)
            }
            Err(e) => {
                staged.refused();
                Commit::Refused(Refusal::Error(e.into()))
            }
        }
    }

    /// Settles a commit whose answer was lost (see [`Undo::settle`]):
    /// `Ok(file)` if it applied; if it did not, the blob is gone and the
    /// answer is why; `OutcomeUnknown` if the store cannot say in time (the
    /// sweeper settles it then).
    pub async fn settle(
        &self,
        staged: Staged,
        file: FileRecord,
    ) -> Result<FileRecord, DomainError> {
        let intent = staged.disarm();
        self.undo.settle(&intent, file).await
    }
}
