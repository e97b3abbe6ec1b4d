//! Resumable uploads (tus 1.0): create, report the offset, append
//! (`patch.rs`), finish (`finish.rs`), terminate. The bytes go to the blob
//! store's resumable write through the one part writer
//! ([`crate::blob::resumable::append`]); the state (offset, part tags, hash
//! state, expiry) is in the metadata store, so any instance continues any
//! upload. The last bytes commit through the [`Committer`], exactly as a
//! plain upload does (category lock, fence, quota, intent), and what a
//! refused or unknown commit leaves is kept for the next PATCH or HEAD.

mod creations;
mod finish;
mod hash;
mod length;
mod patch;
mod stop;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_answers;
#[cfg(test)]
mod tests_leaving;

use std::sync::Arc;

pub use self::hash::{CHECKSUM_ALGORITHMS, Checksum};
use super::{
    DomainError, Filename,
    upload::{Admission, Committer},
};
use crate::{
    blob::{BlobError, BlobStore, BodyError, resumable::ResumableBlobs},
    config::{AllowedTypes, Settings},
    lock::{LockError, LockGuard, Locks, TryLock},
    meta::{
        CleanupRepo, FileRecord, FileRepo, MetaError, OpenLimits, ResumableRecord, ResumableRepo,
        UserRecord, UserTurns,
    },
    vocab::{FileId, LockKey, UserId},
};

/// The resumable-upload flow and the ports it uses. It shares the commit
/// ([`Committer`]) and the admission gate ([`Admission`]: slot, quota,
/// keep-alive) with plain uploads, and nothing else.
pub struct ResumableService {
    committer: Arc<Committer>,
    admission: Arc<Admission>,
    resumables: Arc<dyn ResumableRepo>,
    cleanup: Arc<dyn CleanupRepo>,
    /// Whether a finished upload's file is committed.
    files: Arc<dyn FileRepo>,
    /// A completed upload's first bytes, to decide its type.
    blobs: Arc<dyn BlobStore>,
    /// The resumable writes.
    parts: Arc<dyn ResumableBlobs>,
    locks: Arc<Locks>,
    limits: Limits,
    /// Whose turn it is to write a user's record, in this instance.
    turns: Arc<UserTurns>,
    /// A user's creations, inserted together.
    creations: Arc<creations::Creations>,
}

/// How long a PATCH waits for a PATCH in flight to store what it has and
/// let go of the upload (the holder lets go once its body has been silent
/// for [`RELEASE_IDLE`]; its parts in flight and its tail are stored first).
const TAKE_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a HEAD waits for the same: long enough for a silent holder to
/// let go, short enough for a progress poll of a live PATCH, which is
/// answered the stored offset.
const HEAD_TAKE_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a PATCH's body must have been silent for a release request to
/// stop it: a client still sending keeps its upload (a HEAD polling its
/// progress, a second tab, a request that came late cannot cut it); one
/// whose link died silently sends nothing.
pub(super) const RELEASE_IDLE: std::time::Duration = std::time::Duration::from_secs(2);

/// What a resumable upload is held to.
struct Limits {
    max_upload_bytes: u64,
    /// What the user's open uploads are held to (quota, how many).
    open: OpenLimits,
    expiry: chrono::Duration,
    body_idle_timeout: std::time::Duration,
    allowed_types: AllowedTypes,
}

/// A resumable upload as the HTTP layer hands it over (`POST`).
pub struct NewResumable {
    /// `Upload-Length`; `None`: deferred (`Upload-Defer-Length: 1`).
    pub length: Option<u64>,
    pub filename: Filename,
    pub content_type: String,
    /// The raw `Upload-Metadata`, echoed by `HEAD`.
    pub metadata: String,
}

/// What a PATCH (or a HEAD that finished the upload) did.
#[derive(Debug)]
pub enum Patched {
    /// Stored up to this offset; more is to come.
    Partial(ResumableRecord),
    /// The last bytes: the file is committed.
    Done {
        upload: ResumableRecord,
        file: Box<FileRecord>,
    },
}

impl Patched {
    /// The upload's state as the answer shows it.
    pub fn into_upload(self) -> ResumableRecord {
        match self {
            Patched::Partial(upload) | Patched::Done { upload, .. } => upload,
        }
    }
}

/// Why a resumable-upload call failed: what only tus knows (the HTTP tus
/// module maps these), or any other domain error.
#[derive(Debug, thiserror::Error)]
pub enum ResumableError {
    /// A PATCH from another offset than the stored one.
    #[error("the upload is at offset {0}; send from there")]
    OffsetMismatch(u64),
    /// Another request is writing to this upload right now.
    #[error("another request is writing to this upload; try again")]
    Locked,
    /// This PATCH was asked to stop by another request on the upload (a
    /// client resuming after its link died): what arrived is stored.
    #[error(
        "another request on this upload stopped this PATCH; what arrived is stored (HEAD gives the offset)"
    )]
    Released,
    /// The body does not match the checksum the client sent; nothing of it was kept.
    #[error("the body does not match its Upload-Checksum; nothing of it was kept")]
    ChecksumMismatch,
    #[error(transparent)]
    Domain(#[from] DomainError),
}

macro_rules! via_domain {
    ($($from:ty),*) => {$(
        impl From<$from> for ResumableError {
            fn from(e: $from) -> Self {
                Self::Domain(e.into())
            }
        }
    )*};
}

via_domain!(MetaError, BlobError, BodyError, LockError);

type Result<T, E = ResumableError> = std::result::Result<T, E>;

impl ResumableService {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        committer: Arc<Committer>,
        admission: Arc<Admission>,
        resumables: Arc<dyn ResumableRepo>,
        cleanup: Arc<dyn CleanupRepo>,
        files: Arc<dyn FileRepo>,
        blobs: Arc<dyn BlobStore>,
        parts: Arc<dyn ResumableBlobs>,
        locks: Arc<Locks>,
        settings: &Settings,
    ) -> Self {
        let turns = committer.turns();
        let open = OpenLimits {
            quota_bytes: settings.user_quota_bytes,
            max_open: settings.max_open_uploads,
        };
        let creations = creations::Creations::new(
            resumables.clone(),
            committer.txns().clone(),
            open,
            turns.clone(),
        );
        Self {
            committer,
            admission,
            resumables,
            cleanup,
            files,
            blobs,
            parts,
            locks,
            turns,
            creations,
            limits: Limits {
                max_upload_bytes: settings.max_upload_bytes,
                open,
                expiry: chrono::Duration::from_std(settings.tus_expiry)
                    .unwrap_or_else(|_| chrono::Duration::days(1)),
                body_idle_timeout: settings.body_idle_timeout,
                allowed_types: settings.allowed_types.clone(),
            },
        }
    }

    /// Creates the upload: the blob store's write, then its state and its
    /// intent (so that the sweeper can find it), which count it against
    /// the user (one more open upload, its length reserved), in one
    /// transaction with the user's other creations waiting ([`creations`]).
    pub async fn create(&self, user: &UserRecord, new: NewResumable) -> Result<ResumableRecord> {
        let max = self.limits.max_upload_bytes;
        if new.length.is_some_and(|l| l > max) {
            return Err(DomainError::PayloadTooLarge(max).into());
        }
        // Refused early (no write) when the cached usage says so; the
        // state's insert is the authority.
        self.admission
            .check_declared_quota(user, new.length)
            .await?;
        let mut intent = self.committer.new_intent(user.id);
        // It waits for the client between PATCHes until the upload expires.
        intent.alive_until = Some(intent.created_at + self.limits.expiry);
        // A crash from here until the state is stored leaves an empty
        // multipart upload that nothing names (S3's lifecycle rule for
        // incomplete uploads is the backstop), or a staging file the
        // sweeper removes (no state, no intent). An upload of one part at
        // most is one object on S3: nothing is started.
        let handle = self.parts.start(&intent.key, new.length).await?;
        let now = intent.created_at;
        let length = new.length.map(|l| l as i64);
        let record = ResumableRecord {
            id: intent.id,
            user_id: user.id,
            key: intent.key,
            handle,
            length,
            offset: 0,
            part_size: self.parts.part_size() as i64,
            parts: Vec::new(),
            sha256_state: hash::fresh_state(),
            completed: false,
            committed: false,
            filename: new.filename.as_str().to_owned(),
            content_type: new.content_type,
            metadata: new.metadata,
            created_at: now,
            expires_at: now + self.limits.expiry,
            reserved: length.unwrap_or(0),
            open: false,
        };
        let inserted = self.creations.insert((intent, record.clone())).await;
        if let Err(e) = inserted {
            if matches!(e, MetaError::OutcomeUnknown(_)) {
                // It may have applied: its delete gives back what it
                // counted, and the intent goes with it.
                let _ = self.drop_state(&user.id, &record.id).await;
                let _ = self.cleanup.delete_intent(&user.id, &record.id).await;
            }
            let _ = self.parts.abort(&record.key, &record.handle).await;
            return Err(e.into());
        }
        Ok(ResumableRecord {
            open: true,
            ..record
        })
    }

    /// The upload, if `user` owns it and it has not expired.
    pub async fn find(&self, user: &UserRecord, id: &FileId) -> Result<ResumableRecord> {
        match self.resumables.resumable(&user.id, id).await? {
            Some(r) if r.user_id == user.id && r.expires_at > crate::meta::now() => Ok(r),
            _ => Err(DomainError::NotFound.into()),
        }
    }

    /// Ends the upload: the blob store's write, its intent and its state go
    /// (and the completed object of one whose commit failed).
    pub async fn terminate(&self, user: &UserRecord, id: &FileId) -> Result<()> {
        self.find(user, id).await?;
        let guard = self.lock(id, TAKE_OVER_WAIT).await?;
        let result = async {
            // Read again under the lock: a last PATCH may have finished it.
            let record = self.find(user, id).await?;
            if !record.all_stored() {
                // Refused (not the store away): an outage to the client all
                // the same, 503, not a bug; the upload stays, to terminate
                // again or to expire (the sweeper leaves a write the store
                // refuses to its backstops).
                (self.parts.abort(&record.key, &record.handle).await).map_err(|e| match e {
                    BlobError::Other(why) => BlobError::Unavailable(format!(
                        "the store refused to abort the upload's write: {why}"
                    )),
                    e => e,
                })?;
                // An orphan of the intent: the object under its key, if a
                // PATCH stored one (a small upload's on S3), goes with it
                // (unless a commit took the intent first, by a holder whose
                // lease ran out: then the object is the file's).
                let abandoned = self.cleanup.abandon_intent(&user.id, id, None).await?;
                // Gone: a small upload's commit, which records its state
                // itself, took it meanwhile (its holder's lease ran out), or
                // the sweeper did. A committed file is the user's now.
                if abandoned.is_none() && self.files.file(&user.id, id).await?.is_some() {
                    self.drop_state(&user.id, id).await?;
                    return Err(DomainError::NotFound.into());
                }
                self.drop_state(&user.id, id).await?;
                return Ok(());
            }
            // Every byte stored, the commit failed (or is unknown): a file
            // committed since is the user's now; else the object goes too.
            // The intent is read first: a commit deletes it and inserts the
            // file at once, so neither after it means swept, never to commit.
            let intent = self.cleanup.intent(&user.id, id).await?;
            if self.files.file(&user.id, id).await?.is_some() {
                self.drop_state(&user.id, id).await?;
                return Err(DomainError::NotFound.into());
            }
            match intent {
                Some(intent) => self.discard(&record, intent).await?,
                // Swept: the sweeper has the object's key, not the blob
                // store's write (a multipart upload, staging).
                None => {
                    self.drop_write(&record).await?;
                    self.drop_state(&user.id, id).await?;
                }
            }
            Ok(())
        }
        .await;
        release(guard).await;
        result
    }

    /// The upload's lock. A PATCH in flight (here or on another instance)
    /// is asked to store what it has and let go, as tusd does: a client
    /// whose link died silently would otherwise hold it until its body's
    /// idle timeout, longer than tus clients retry. `Locked` if the holder
    /// did not let go within `wait` ([`TAKE_OVER_WAIT`], [`HEAD_TAKE_OVER_WAIT`]).
    async fn lock(&self, id: &FileId, wait: std::time::Duration) -> Result<Option<LockGuard>> {
        let key = LockKey::resumable(id);
        match self.locks.take_over(&key, wait).await? {
            TryLock::Held(g) => Ok(Some(g)),
            // Development without the lock backend: the conditional update
            // on the offset still lets only one of two PATCHes count.
            TryLock::Degraded => Ok(None),
            TryLock::Busy => Err(ResumableError::Locked),
        }
    }

    /// Drops upload `id`'s state, giving back what it holds of its user's
    /// counters in the same transaction (retried on write conflicts).
    async fn drop_state(&self, user: &UserId, id: &FileId) -> std::result::Result<(), MetaError> {
        let txns = self.committer.txns();
        let dropped = self.turns.run(txns, "drop_upload", user, || {
            self.resumables.delete_resumable(user, id)
        });
        dropped.await.map(|r| r.value)
    }

    /// When an upload renewed now expires.
    fn expires_at(&self) -> chrono::DateTime<chrono::Utc> {
        crate::meta::now() + self.limits.expiry
    }
}

async fn release(guard: Option<LockGuard>) {
    if let Some(g) = guard {
        g.release().await;
    }
}
