//! A user's deletion, as the metadata store serves it: the mark that
//! begins it (and survives a crash: the sweeper resumes every marked user),
//! what the job finds of the user, and the end.

use async_trait::async_trait;

use super::{
    error::MetaResult,
    records::{IntentRecord, OrphanRecord, UserRecord},
    upload_records::ResumableRecord,
};
use crate::vocab::UserId;

#[async_trait]
pub trait DeletionRepo: Send + Sync {
    /// Marks the user as being deleted (`deleting_since`, kept if already
    /// set) and deletes their keys and tokens, in one transaction: from
    /// then on no request authenticates as them (past the auth caches).
    /// The user as marked; `None` if there is no such user.
    async fn begin_user_deletion(&self, id: &UserId) -> MetaResult<Option<UserRecord>>;

    /// Users being deleted (at most `limit`).
    async fn users_being_deleted(&self, limit: usize) -> MetaResult<Vec<UserRecord>>;

    /// The user's resumable uploads.
    async fn user_resumables(&self, id: &UserId, limit: usize) -> MetaResult<Vec<ResumableRecord>>;

    /// The user's upload intents (uploads in flight or abandoned).
    async fn user_intents(&self, id: &UserId, limit: usize) -> MetaResult<Vec<IntentRecord>>;

    /// Deletes up to `limit` of the user's sessions, agents and events, and
    /// of their events' dead letters (their files go with the user: no
    /// back-reference is kept); how many.
    async fn purge_containers(&self, id: &UserId, limit: usize) -> MetaResult<usize>;

    /// Deletes up to `limit` of the user's files as `delete_file` does each,
    /// in one transaction, recording each blob as a pending orphan in it;
    /// the orphans.
    async fn purge_files(&self, id: &UserId, limit: usize) -> MetaResult<Vec<OrphanRecord>>;

    /// Ends the deletion if the user owns nothing any more: deletes the
    /// user document and what is left of their keys, tokens, permissions
    /// and idempotency records, in one transaction. `false` (nothing
    /// deleted) if a file, session, agent, event, intent or resumable
    /// upload of theirs is still there, or the user is not marked.
    async fn finish_user_deletion(&self, id: &UserId) -> MetaResult<bool>;
}
