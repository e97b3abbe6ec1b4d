//! The records the metadata store keeps (one struct per MongoDB collection;
//! the embedded store mirrors them) and the values its methods take.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::vocab::{
    AgentId, BlobKey, FileId, LinkId, OpId, OrphanId, SessionId, SizeCategory, UserId,
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
