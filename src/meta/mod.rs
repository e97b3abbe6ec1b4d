//! The `MetadataStore` port: users, files, permissions, upload intents,
//! orphans and idempotency records, changed only inside transactions. The
//! store is the sum of narrow repositories (users, files, cleanup,
//! containers); each adapter implements them one file each.

mod bell;
mod deletion;
pub mod embedded;
mod error;
mod events;
pub mod group;
mod keys;
pub mod mongo;
mod records;
mod resumable;
pub mod retry;
mod turns;
mod upload_records;
mod webhooks;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub use self::bell::{Bells, EventBell, Listener};
pub use self::deletion::DeletionRepo;
pub use self::error::{MetaError, MetaResult};
pub use self::events::{
    EventDraft, EventRecord, EventRepo, EventType, FEED_STATE, FeedBounds, FeedPage, OwnerPage,
};
pub use self::keys::{ApiKeyRecord, FIRST_KEY_NAME, KeyMint, KeyRepo, REVOKED_KEPT, TokenRecord};
pub use self::records::*;
pub use self::resumable::{Claim, OpenLimits, Reserve, ResumableRepo};
pub use self::turns::UserTurns;
pub use self::upload_records::*;
pub use self::webhooks::{DeadLetter, WebhookMark, WebhookRepo};
use crate::vocab::{
    AgentId, BlobKey, FileId, Filename, IdempotencyKey, OpId, Operation, OrphanId, SessionId,
    UserId,
};

/// Users and their keys.
#[async_trait]
pub trait UserRepo: Send + Sync {
    /// Inserts the user and their first key, in one transaction.
    async fn insert_user(&self, user: &UserRecord, key: &ApiKeyRecord) -> MetaResult<()>;

    async fn user(&self, id: &UserId) -> MetaResult<Option<UserRecord>>;

    /// Users in id (creation) order after `after`, without their file lists.
    async fn list_users(&self, after: Option<&UserId>, limit: usize)
    -> MetaResult<Vec<UserRecord>>;

    /// Sets the user's own quota (`None`: the default again) in one write of
    /// the user document, which every commit of theirs reads in its
    /// transaction; the user as written (without the file list), `None` if
    /// there is no such user.
    async fn set_quota(&self, id: &UserId, quota: Option<i64>) -> MetaResult<Option<UserRecord>>;
}

/// Files: the upload commit, reads, lists and the delete.
#[async_trait]
pub trait FileRepo: Send + Sync {
    /// Inserts the file and its owner permission, counts it in the user's
    /// `file_count`, adds to `used_bytes` (checking the quota), checks and
    /// stores the fencing token, deletes the intent and records the
    /// idempotency key — all or nothing. A key already recorded makes it
    /// [`CommitOutcome::Replayed`] with that record, and nothing is written.
    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome>;

    /// What `user_id`'s idempotency key `key` stands for, if it was used
    /// and its file has not been deleted since.
    async fn idempotency_record(
        &self,
        user_id: &UserId,
        key: &IdempotencyKey,
    ) -> MetaResult<Option<IdempotencyRecord>>;

    /// Commits one user's uploads in one transaction (a group commit), in
    /// order, each as [`Self::commit_upload`] would, under the fences they
    /// carry (one per slot: a group never holds two tokens of one slot) and
    /// with one write of the user document. Each upload gets its own
    /// outcome: the quota is decided upload by upload in order (one past it
    /// is left out with `Err(QuotaExceeded)` and the ones after it may still
    /// fit), and an idempotency key recorded before, or taken by an earlier
    /// upload of the group, is a replay. Any other refusal (a stale fence, a
    /// swept intent, the user gone, a key another request is committing)
    /// fails the whole group and changes nothing: the caller then commits
    /// the uploads one at a time, so that each gets its own answer.
    async fn commit_uploads(
        &self,
        group: &[CommitUpload],
    ) -> MetaResult<Vec<MetaResult<CommitOutcome>>>;

    /// The file if `owner_id` owns it.
    async fn file(&self, owner_id: &UserId, file_id: &FileId) -> MetaResult<Option<FileRecord>>;

    /// The owner's files in id (creation) order, after `after`.
    async fn list_files(
        &self,
        owner_id: &UserId,
        after: Option<&FileId>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>>;

    /// Deletes the file, its permissions, its id on the user and the
    /// idempotency key that created it (the key is free again), in one
    /// transaction; records its blob as a pending orphan in the same
    /// transaction so that a crash before the blob delete loses nothing.
    async fn delete_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>>;

    /// Renames the owner's file, checking and storing the fencing token on
    /// the user, in one transaction; `None` if the owner has no such file
    /// (then nothing is written).
    async fn rename_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        filename: &Filename,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>>;

    /// Every file, in id order, after `after` (audits).
    async fn all_files(&self, after: Option<&FileId>, limit: usize) -> MetaResult<Vec<FileRecord>>;
}

/// Cleanup: upload intents (uploads in flight) and orphans (blobs that
/// still have to go). The sweeper and reconcile work from it. An intent is
/// found by its id and its user (`owner`), who is known wherever one is
/// read or written: a sharded cluster then reads the one shard that holds
/// the user's documents (README "Scaling out: MongoDB sharded").
#[async_trait]
pub trait CleanupRepo: Send + Sync {
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()>;

    /// Writes several intents at once (one `insert_many`).
    async fn put_intents(&self, intents: &[IntentRecord]) -> MetaResult<()>;

    async fn delete_intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<()>;

    /// The intent of `owner`'s upload that will commit as `file_id`, if it
    /// is in flight.
    async fn intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<Option<IntentRecord>>;

    /// [`Self::intent`] whoever's it is: on a sharded cluster, a read of
    /// every shard. Only for what knows no owner (the sweeper, of the local
    /// blob store's staging files, whose names carry none).
    async fn intent_by_id_alone(&self, file_id: &FileId) -> MetaResult<Option<IntentRecord>>;

    /// Intents whose upload was last alive before `before`, oldest first.
    async fn intents(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<Vec<IntentRecord>>;

    /// Marks the intent's upload alive now and, with `until`, alive until
    /// then (a resumable upload renewed to that expiry): the intent as
    /// updated, `None` if it is gone. One round trip.
    async fn touch_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        until: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<IntentRecord>>;

    /// Turns an upload intent into a pending orphan, in one transaction, if
    /// its upload was last alive before `stale_before` (always, if `None`).
    /// `None` if the intent is gone (its upload committed or was cleaned up)
    /// or was refreshed since.
    async fn abandon_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        stale_before: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<OrphanRecord>>;

    /// Pending orphans with fewer than `max_retries` failed deletes whose last
    /// attempt (if any) was at or before `retry_before`, oldest first.
    async fn orphans_due(
        &self,
        max_retries: i32,
        retry_before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>>;

    /// Intents and orphans by status, for metrics.
    async fn counts(&self) -> MetaResult<MetaCounts>;

    async fn record_orphan(&self, orphan: &OrphanRecord) -> MetaResult<()>;

    async fn mark_orphan(
        &self,
        id: &OrphanId,
        status: OrphanStatus,
        error: Option<String>,
    ) -> MetaResult<()>;

    async fn orphans(
        &self,
        status: Option<OrphanStatus>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>>;

    /// Whether a pending orphan names `key`: its blob is on the sweeper's
    /// list (a delete's or a refused upload's clean-up that failed).
    async fn pending_orphan(&self, key: &BlobKey) -> MetaResult<bool>;
}

/// Sessions and agents, and the writes to them (commands).
#[async_trait]
pub trait ContainerRepo: Send + Sync {
    /// Adds a session (or an agent, below) in one transaction with a write
    /// of its owner's document, so that it cannot slip past the owner's
    /// deletion; `UserDeleting` if the owner is gone or being deleted.
    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()>;

    /// The session if `owner_id` owns it.
    async fn session(&self, owner_id: &UserId, id: &SessionId)
    -> MetaResult<Option<SessionRecord>>;

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()>;

    /// The agent if `owner_id` owns it.
    async fn agent(&self, owner_id: &UserId, id: &AgentId) -> MetaResult<Option<AgentRecord>>;

    /// The owner's sessions in id (creation) order, after `after`.
    async fn list_sessions(
        &self,
        owner_id: &UserId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> MetaResult<Vec<SessionRecord>>;

    /// The owner's agents in id (creation) order, after `after`.
    async fn list_agents(
        &self,
        owner_id: &UserId,
        after: Option<&AgentId>,
        limit: usize,
    ) -> MetaResult<Vec<AgentRecord>>;

    /// Applies a container write in one transaction, checking and storing
    /// the container's fence. An attach (detach) puts (removes) a file the
    /// owner may use in (from) a container the owner owns and records the
    /// back-reference on the file; a link connects (disconnects) an MCP or
    /// toolset. Both are idempotent; `NotFound` if either side is not the
    /// owner's. A delete removes the container and, on every file it
    /// names, the back-reference to it (`NotFound` if it is not the
    /// owner's). A write that would grow a list past `max_items` members is
    /// `ContainerFull`, checked in the transaction (so concurrent writes cannot
    /// pass it together). With an operation id, the id is recorded in `processed_ops`
    /// in the same transaction, and an id seen before makes the call
    /// `AlreadyApplied` without changing anything. A write that changed
    /// the container writes its event (numbered by a write of the owner's
    /// document, the transaction's last); how many events it wrote (0 or 1).
    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&OpId>,
        max_items: usize,
    ) -> MetaResult<usize>;

    /// Settles a queued operation that will not be applied (its waiter gave
    /// up, it was dead-lettered or refused): records its id in
    /// `processed_ops` with `why`, so that it can never apply and a
    /// redelivery answers the same ([`Settled::Now`]), unless it had applied
    /// or been settled before.
    async fn cancel_op(&self, op_id: &OpId, why: Refusal) -> MetaResult<Settled>;

    /// How a queued operation was settled, if it was: applied
    /// ([`Settled::Applied`]) or refused ([`Settled::Refused`]); `None`
    /// while its id is not in `processed_ops`. A read: it settles nothing.
    async fn find_op(&self, op_id: &OpId) -> MetaResult<Option<Settled>>;

    /// Applies queued operations in order in one transaction, recording each
    /// one's id (the second of the pair) as `apply_op` does,
    /// under one fence: all or none, with the events of those that changed
    /// something (how many). Any refusal, or an id seen before, fails
    /// the whole group; the caller then applies them one at a time.
    async fn apply_group(
        &self,
        ops: &[(Operation, OpId)],
        fence: &Fence,
        max_items: usize,
    ) -> MetaResult<usize>;
}

/// One method per unit of work; each mutating method is a single transaction
/// attempt, and a `WriteConflict` is returned, not retried, so that the one
/// retry policy in [`retry`] serves every adapter.
/// It is the sum of narrow repositories, so that each service and worker
/// can hold only the one it uses (pict-rs's `FullRepo`).
#[async_trait]
pub trait MetadataStore:
    UserRepo
    + KeyRepo
    + FileRepo
    + CleanupRepo
    + ContainerRepo
    + ResumableRepo
    + DeletionRepo
    + EventRepo
    + WebhookRepo
{
    /// Answers when the store is reachable.
    async fn ping(&self) -> MetaResult<()>;
}
