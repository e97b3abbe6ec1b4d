//! The records the metadata store keeps (one struct per MongoDB collection;
//! the embedded store mirrors them) and the values its methods take.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::vocab::{
    AgentId, BlobKey, FileId, IdempotencyKey, LinkId, OpId, OrphanId, SessionId, SizeCategory,
    UserId, WriteHandle,
};

/// Now, at the millisecond precision the stores keep, so that what a
/// request returns equals what a later read returns.
pub fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap_or_else(Utc::now)
}

/// `users` collection.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UserRecord {
    #[serde(rename = "_id")]
    pub id: UserId,
    pub name: String,
    /// How many files the user holds. The list itself is the `files`
    /// collection (its `(owner_id, _id)` index): an array of ids here grew
    /// with every file, and every commit rewrote it (issue 22).
    #[serde(default)]
    pub file_count: i64,
    pub used_bytes: i64,
    /// What the user's open resumable uploads reserve (their
    /// `Upload-Length`s): counted against the quota beside `used_bytes`,
    /// from an upload's creation (or the PATCH that declares a deferred
    /// length) until its file commits, it is terminated or it expires. Kept
    /// here, changed in the transaction that changes an upload's
    /// reservation, so that no request counts the user's uploads.
    #[serde(default)]
    pub reserved_bytes: i64,
    /// The user's open resumable uploads (counted as `reserved_bytes` is).
    #[serde(default)]
    pub open_uploads: i64,
    /// Highest fencing token committed, per upload-lock category.
    #[serde(default)]
    pub upload_fence: BTreeMap<String, i64>,
    /// The number of the user's last event (`events`): each change of
    /// theirs adds one in its transaction, so their events have no gap.
    #[serde(default)]
    pub event_seq: i64,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    /// The user's own storage quota; `None`: `FILEDOCK_USER_QUOTA_BYTES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<i64>,
    /// When the user's deletion began: from then on every write of theirs
    /// is refused, and the deletion job removes what they own.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "bson_time::option"
    )]
    pub deleting_since: Option<DateTime<Utc>>,
}

impl UserRecord {
    /// A new user, owning nothing yet.
    pub fn new(name: String) -> Self {
        Self {
            id: UserId::new(),
            name,
            file_count: 0,
            used_bytes: 0,
            reserved_bytes: 0,
            open_uploads: 0,
            upload_fence: BTreeMap::new(),
            event_seq: 0,
            created_at: now(),
            quota_bytes: None,
            deleting_since: None,
        }
    }

    /// What counts against the quota: the bytes stored and the bytes reserved.
    pub fn counted_bytes(&self) -> i64 {
        self.used_bytes + self.reserved_bytes
    }
}

/// `files` collection.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileRecord {
    #[serde(rename = "_id")]
    pub id: FileId,
    pub owner_id: UserId,
    pub filename: String,
    pub content_type: String,
    pub size: i64,
    pub sha256: String,
    pub category: SizeCategory,
    pub bucket: String,
    pub key: BlobKey,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    /// Sessions the file is attached to (so a delete knows where to detach).
    #[serde(default)]
    pub sessions: Vec<SessionId>,
    /// Agents the file is attached to.
    #[serde(default)]
    pub agents: Vec<AgentId>,
}

/// `sessions` collection: a chat session and its files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionRecord {
    #[serde(rename = "_id")]
    pub id: SessionId,
    pub owner_id: UserId,
    pub file_ids: Vec<FileId>,
    /// Highest fencing token committed, per lock (`files`).
    #[serde(default)]
    pub fence: BTreeMap<String, i64>,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
}

/// `agents` collection: an agent, its files and its MCP and toolset connections.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentRecord {
    #[serde(rename = "_id")]
    pub id: AgentId,
    pub owner_id: UserId,
    pub name: String,
    pub file_ids: Vec<FileId>,
    pub mcp_ids: Vec<LinkId>,
    pub toolset_ids: Vec<LinkId>,
    /// Highest fencing token committed, per lock (`files`, `config`).
    #[serde(default)]
    pub fence: BTreeMap<String, i64>,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
}

impl AgentRecord {
    /// A new agent of `owner_id`'s, with no files or connections yet.
    pub fn new(owner_id: UserId, name: String) -> Self {
        Self {
            id: AgentId::new(),
            owner_id,
            name,
            file_ids: Vec::new(),
            mcp_ids: Vec::new(),
            toolset_ids: Vec::new(),
            fence: Default::default(),
            created_at: now(),
        }
    }
}

/// `permissions` collection.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PermissionRecord {
    /// `{file}:{user}`.
    #[serde(rename = "_id")]
    pub id: String,
    pub file_id: FileId,
    pub user_id: UserId,
    pub role: String,
}

impl PermissionRecord {
    /// The owner's permission on a file just uploaded.
    pub fn owner_of(file: &FileRecord) -> Self {
        Self {
            id: format!("{}:{}", file.id, file.owner_id),
            file_id: file.id,
            user_id: file.owner_id,
            role: "owner".into(),
        }
    }
}

/// `upload_intents`: written before the first blob byte, deleted by the commit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IntentRecord {
    /// The file id the upload will commit under.
    #[serde(rename = "_id")]
    pub id: FileId,
    pub user_id: UserId,
    pub bucket: String,
    pub key: BlobKey,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    /// The last time its upload showed it is alive (it refreshes the intent
    /// while it streams), if ever: a slow upload is not an abandoned one.
    #[serde(default, with = "bson_time::option")]
    pub refreshed_at: Option<DateTime<Utc>>,
    /// A resumable upload waits for its client between PATCHes until it
    /// expires: its intent is not stale before then. Kept out of the
    /// sweeper's stale-intent scan until that time, open resumable uploads
    /// cannot fill its batches and starve the plain uploads that died.
    #[serde(default, with = "bson_time::option")]
    pub alive_until: Option<DateTime<Utc>>,
}

impl IntentRecord {
    /// The intent of an upload by `user` that will commit as file `file`,
    /// its blob at the file's key in `bucket`: the one place an intent is made.
    pub fn new(user: UserId, file: FileId, bucket: &str) -> Self {
        Self {
            id: file,
            user_id: user,
            bucket: bucket.to_owned(),
            key: BlobKey::file(user, file),
            created_at: now(),
            refreshed_at: None,
            alive_until: None,
        }
    }

    /// Until when its upload counts as alive: the last time it showed it
    /// is, or the time a resumable upload expires, whichever is later.
    pub fn alive_at(&self) -> DateTime<Utc> {
        let seen = self.refreshed_at.unwrap_or(self.created_at);
        self.alive_until.map_or(seen, |until| until.max(seen))
    }
}

/// `orphan_minio_objects`: a blob with no metadata that still has to go.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OrphanRecord {
    #[serde(rename = "_id")]
    pub id: OrphanId,
    pub bucket: String,
    pub key: BlobKey,
    pub status: OrphanStatus,
    pub retries: i32,
    pub error: Option<String>,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "bson_time::option")]
    pub last_retry_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OrphanStatus {
    Pending,
    Deleted,
    Failed,
}

/// `processed_ops`: ids of queued operations already applied, or settled
/// without applying (`refused`, so a redelivery answers the same).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessedOp {
    #[serde(rename = "_id")]
    pub id: OpId,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
}

impl ProcessedOp {
    /// The record of an operation applied now.
    pub fn applied(id: OpId) -> Self {
        Self {
            id,
            created_at: now(),
            refused: None,
        }
    }
}

/// Why a queued operation was settled without applying.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// Its list was at the bound (the bound).
    ContainerFull(usize),
    /// It kept failing and went to the dead-letter queue.
    DeadLettered,
    /// Its waiter gave up on it.
    Cancelled,
    /// What it names was not there (answered 404): a redelivery after a
    /// failover must not apply it once the target exists.
    NotFound,
}

/// What settling a queued operation found (see `ContainerRepo::cancel_op`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Settled now: it can no longer apply.
    Now,
    /// It had applied.
    Applied,
    /// It had been settled before, for this reason.
    Refused(Refusal),
}

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

/// A file whose metadata was deleted, and the pending orphan that now
/// stands for its blob.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletedFile {
    pub file: FileRecord,
    pub orphan_id: OrphanId,
}

/// Sizes of the bookkeeping collections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaCounts {
    pub intents: u64,
    pub orphans_pending: u64,
    pub orphans_deleted: u64,
    pub orphans_failed: u64,
}

/// What a commit did.
#[derive(Clone, Debug, PartialEq)]
pub enum CommitOutcome {
    Committed,
    /// Another request with the same idempotency key committed first; this
    /// is its record, and nothing of this attempt was kept.
    Replayed(Box<IdempotencyRecord>),
}

impl OrphanRecord {
    /// A pending orphan for a blob that has to be deleted.
    pub fn pending(bucket: &str, key: &BlobKey, error: Option<String>) -> Self {
        Self {
            id: OrphanId::new(),
            bucket: bucket.to_owned(),
            key: *key,
            status: OrphanStatus::Pending,
            retries: 0,
            error,
            created_at: now(),
            last_retry_at: None,
        }
    }

    /// Whether a sweep should try this orphan now.
    pub fn is_due(&self, max_retries: i32, retry_before: DateTime<Utc>) -> bool {
        self.status == OrphanStatus::Pending
            && self.retries < max_retries
            && self.last_retry_at.is_none_or(|t| t <= retry_before)
    }

    /// The blob of a file whose metadata is being deleted.
    pub fn pending_for(file: &FileRecord) -> Self {
        Self::pending(&file.bucket, &file.key, None)
    }

    /// Records the outcome of a delete attempt.
    pub fn mark(&mut self, status: OrphanStatus, error: Option<String>) {
        if status != OrphanStatus::Deleted || error.is_some() {
            self.retries += 1;
        }
        self.status = status;
        self.error = error.or(self.error.take());
        self.last_retry_at = Some(now());
    }
}

/// Timestamps as BSON dates (so MongoDB can range-query and index them);
/// other formats (the embedded store's JSON) get BSON's extended JSON.
pub mod bson_time {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        bson::DateTime::from_chrono(*t).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        Ok(bson::DateTime::deserialize(d)?.to_chrono())
    }

    pub mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            t.map(bson::DateTime::from_chrono).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Ok(Option::<bson::DateTime>::deserialize(d)?.map(|t| t.to_chrono()))
        }
    }
}
