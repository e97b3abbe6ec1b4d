//! The records an upload's commit takes and gives (the idempotency record,
//! the fence, the commit itself and what it came to) and a resumable
//! upload's state: split from `records.rs`, re-exported with it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::records::{FileRecord, bson_time};
use crate::vocab::{BlobKey, FileId, IdempotencyKey, UserId, WriteHandle};

/// `idempotency`: the first result of a request sent with an `Idempotency-Key`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IdempotencyRecord {
    /// `{user}:{key}`.
    #[serde(rename = "_id")]
    pub id: String,
    pub file: FileRecord,
    /// The SHA-256 of the request that stored it (its body's hash, filename
    /// and content type): a replay must match it. Empty in records stored
    /// before fingerprints were kept (such a key replays whatever is sent).
    #[serde(default)]
    pub fingerprint: String,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
}

/// An `Idempotency-Key` and the fingerprint of the request that sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct IdempotencyClaim {
    pub key: IdempotencyKey,
    pub fingerprint: String,
}

impl IdempotencyRecord {
    /// `{user}:{key}`: a key is the user's own.
    pub fn id_for(user_id: &UserId, key: &IdempotencyKey) -> String {
        format!("{user_id}:{}", key.as_str())
    }
}

/// A fencing token to check and store in one transaction. A commit is
/// refused if a newer token was stored before it (the holder's lease
/// expired and someone else's commit landed); the same holder may commit
/// under its token more than once.
#[derive(Clone, Debug, PartialEq)]
pub struct Fence {
    /// Which counter the token is checked against, on the document written:
    /// an upload-lock category on a user (`small`, `medium`, `large`), a
    /// lock on a session or an agent (`files`, `config`), or a queue
    /// bucket's lease (`queue{b}`).
    pub slot: String,
    pub token: i64,
    /// The slot has one holder at a time, whatever document it writes (a
    /// queue bucket's lease). The store may then pin the holder's
    /// transactions to one session and, when a newer token takes the slot,
    /// abort a transaction an earlier holder left open (it died mid-commit),
    /// instead of letting it block its documents until the server reaps it.
    pub pinned: bool,
}

impl Fence {
    /// The fence of queue bucket `b`'s lease, held with fencing token
    /// `token` (whichever broker delivers the bucket): pinned.
    pub fn of_queue_bucket(b: u32, token: u64) -> Self {
        Self {
            slot: format!("queue{b}"),
            token: token as i64,
            pinned: true,
        }
    }

    /// The fence of a lock held with fencing token `token` (`None`: no lock
    /// held, the lock backend being down in development mode: no fence).
    pub fn of_lock(token: Option<u64>, slot: impl Into<String>) -> Option<Self> {
        token.map(|token| Self {
            slot: slot.into(),
            token: token as i64,
            pinned: false,
        })
    }
}

/// Everything one upload commits, atomically.
#[derive(Clone, Debug)]
pub struct CommitUpload {
    pub file: FileRecord,
    pub fence: Option<Fence>,
    pub quota_bytes: Option<u64>,
    pub idempotency: Option<IdempotencyClaim>,
    /// A resumable upload's file (its id is the upload's): the upload's
    /// reservation is released in the same transaction, the file's bytes
    /// taking its place.
    pub resumable: bool,
    /// A resumable upload's state as this commit records it, when the
    /// committing request stored its last bytes and has not recorded them
    /// yet. `None`: they were recorded before.
    pub state: Option<Box<StateAdvance>>,
}

/// A resumable upload's state written as its file commits: `record` (its
/// offset, parts, hash, expiry; the counted fields, length, reservation
/// and open, are left as stored), if the stored one is still at `from`.
/// Else the upload moved on ([`MetaError::Moved`]): of two requests from
/// the same progress, one records its bytes, as with
/// [`ResumableRepo::advance_resumable`].
///
/// [`MetaError::Moved`]: super::MetaError::Moved
/// [`ResumableRepo::advance_resumable`]: super::ResumableRepo::advance_resumable
#[derive(Clone, Debug)]
pub struct StateAdvance {
    pub record: ResumableRecord,
    pub from: Progress,
}

/// `resumable_uploads`: one tus upload between its creation and its last PATCH.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResumableRecord {
    /// The upload id, which is also the id the file commits under (and its intent's).
    #[serde(rename = "_id")]
    pub id: FileId,
    pub user_id: UserId,
    /// The blob key the file will have.
    pub key: BlobKey,
    /// The blob store's handle on the write (the S3 multipart upload id).
    pub handle: WriteHandle,
    /// `Upload-Length`; `None` while it is deferred (`Upload-Defer-Length:
    /// 1`), until a PATCH declares it.
    pub length: Option<i64>,
    /// `Upload-Offset`: the bytes stored so far.
    pub offset: i64,
    /// The part size the upload was started with.
    pub part_size: i64,
    /// The tags of the whole parts stored, part 1 first; the tail (the
    /// bytes after them, up to `offset`) is in the blob store.
    pub parts: Vec<String>,
    /// The SHA-256 of the bytes up to `offset`, as a serialized hash state (hex).
    pub sha256_state: String,
    /// Whether the blob store's write was completed (the object is whole
    /// at `key`): every byte arrived, and only the file's commit is left.
    #[serde(default)]
    pub completed: bool,
    /// Whether the file is committed (under the upload's id): the record
    /// stays until it expires, so that `HEAD` and a retried final PATCH
    /// are answered "complete" instead of 404.
    #[serde(default)]
    pub committed: bool,
    pub filename: String,
    pub content_type: String,
    /// The raw `Upload-Metadata`, returned by `HEAD`.
    pub metadata: String,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    /// `Upload-Expires`: after this the sweeper aborts the upload.
    #[serde(with = "bson_time")]
    pub expires_at: DateTime<Utc>,
    /// The bytes this upload holds of its user's `reserved_bytes`: its
    /// length once known, 0 once its file committed. Like `open`, changed
    /// only together with the user's counters, in one transaction
    /// (`advance_resumable` keeps them as stored).
    #[serde(default)]
    pub reserved: i64,
    /// Whether it counts in its user's `open_uploads` (until its file
    /// commits or it goes).
    #[serde(default)]
    pub open: bool,
}

/// How far an upload has got: what a PATCH read before it stored anything,
/// and what its state update expects to find still
/// ([`ResumableRepo::advance_resumable`]). The offset alone does not tell:
/// storing the staged tail as the last part, or committing the file,
/// leaves the offset where it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub offset: i64,
    /// How many whole parts are stored.
    pub parts: usize,
    pub committed: bool,
}

/// What a commit did.
#[derive(Clone, Debug, PartialEq)]
pub enum CommitOutcome {
    Committed,
    /// Another request with the same idempotency key committed first; this
    /// is its record, and nothing of this attempt was kept.
    Replayed(Box<IdempotencyRecord>),
}
