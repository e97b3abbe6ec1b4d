//! Reading, listing and deleting files.

use super::{
    FileId, SizeCategory, UserId,
    upload::{UserCommitError, user_commit},
};
use crate::{
    blob::{ByteRange, ByteStream},
    error::ApiError,
    lock::LockKey,
    meta::{Fence, FileRecord, MetaError, OrphanStatus, UserRecord},
    startup::AppState,
};

/// The caller's file, or `NotFound` (also for other users' files).
pub async fn find(state: &AppState, user: &UserRecord, id: &str) -> Result<FileRecord, ApiError> {
    let id = FileId::parse(id).ok_or(ApiError::NotFound)?;
    state
        .meta
        .file(&user.id, &id.to_string())
        .await?
        .ok_or(ApiError::NotFound)
}

/// A page of the caller's files in creation order, and the cursor of the next page.
pub async fn list(
    state: &AppState,
    user: &UserRecord,
    limit: usize,
    cursor: Option<&str>,
) -> Result<(Vec<FileRecord>, Option<String>), ApiError> {
    let after = match cursor {
        Some(c) => Some(
            FileId::parse(c)
                .ok_or_else(|| {
                    ApiError::InvalidRequest("cursor is not a cursor this API returned".into())
                })?
                .to_string(),
        ),
        None => None,
    };
    let mut files = state
        .meta
        .list_files(&user.id, after.as_deref(), limit + 1)
        .await?;
    let next = if files.len() > limit {
        files.truncate(limit);
        files.last().map(|f| f.id.clone())
    } else {
        None
    };
    Ok((files, next))
}

/// Streams the file's bytes, or `range` of them.
pub async fn content(
    state: &AppState,
    file: &FileRecord,
    range: Option<ByteRange>,
) -> Result<ByteStream<'static>, ApiError> {
    Ok(state.blobs.get(&file.key, range).await?)
}

/// Deletes the file under the owner's upload lock for its category: the
/// metadata goes in one transaction, which also queues the blob as a
/// pending orphan; then the blob goes and the orphan is marked deleted.
pub async fn delete(state: &AppState, user: &UserRecord, id: &str) -> Result<(), ApiError> {
    let file = find(state, user, id).await?;
    let user_id = UserId::parse(&user.id).ok_or(ApiError::NotFound)?;
    let category = SizeCategory::from_stored(&file.category);
    let guard = state
        .locks
        .acquire(&LockKey::user_upload(&user_id, category))
        .await?;
    let fence = guard.as_ref().map(|g| Fence {
        slot: file.category.clone(),
        token: g.fence() as i64,
        pinned: false,
    });
    let deleted = user_commit(state, &user_id, || {
        state.meta.delete_file(&user.id, &file.id, fence.as_ref())
    })
    .await;
    if let Some(g) = guard {
        g.release().await;
    }
    let deleted = deleted.map_err(|e| match e {
        // The delete may have applied: if it did, its pending orphan takes the blob.
        UserCommitError::Meta(MetaError::OutcomeUnknown(_)) => {
            ApiError::OutcomeUnknown(Some(format!("/v1/files/{}", file.id)))
        }
        e => e.into(),
    })?;
    state.metrics.observe_txn("delete_file", deleted.retries);
    // Deleted concurrently by another request: same answer as never found.
    let gone = deleted.value.ok_or(ApiError::NotFound)?;
    // The metadata is gone, so the delete has happened whatever follows: the
    // blob goes now, or the pending orphan written with the delete keeps it
    // on the sweeper's list.
    let cleaned = match state.blobs.delete(&gone.file.key).await {
        Ok(()) => state
            .meta
            .mark_orphan(&gone.orphan_id, OrphanStatus::Deleted, None)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = cleaned {
        tracing::warn!(key = %file.key, error = %e, "blob clean-up after a delete left for the sweeper");
    }
    Ok(())
}
