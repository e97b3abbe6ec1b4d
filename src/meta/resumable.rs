//! Resumable (tus) uploads in flight: the `ResumableRepo` port and its
//! record, kept in the metadata store so that any instance can continue an
//! upload another one started.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    error::{MetaError, MetaResult},
    group::effective_quota,
    records::{IntentRecord, UserRecord},
    upload_records::{Progress, ResumableRecord},
};
use crate::vocab::{FileId, UserId};

/// What a user's open uploads are held to when one is created.
#[derive(Clone, Copy, Debug)]
pub struct OpenLimits {
    /// The default quota (`None`: none), which stored and reserved bytes
    /// share; a user's own (`UserRecord::quota_bytes`) holds over it.
    pub quota_bytes: Option<u64>,
    /// The most open uploads a user may have.
    pub max_open: u64,
}

impl OpenLimits {
    /// Whether `user` may reserve `more` bytes (`QuotaExceeded` if not)
    /// under their own quota, else `default`.
    pub fn check_quota(default: Option<u64>, user: &UserRecord, more: i64) -> MetaResult<()> {
        Self::may_write(user)?;
        match effective_quota(user.quota_bytes, default) {
            Some(q) if (user.counted_bytes() + more).max(0) as u64 > q => {
                Err(MetaError::QuotaExceeded)
            }
            _ => Ok(()),
        }
    }

    /// Whether `user` may still write: not once their deletion began.
    pub fn may_write(user: &UserRecord) -> MetaResult<()> {
        match user.deleting_since {
            Some(_) => Err(MetaError::UserDeleting),
            None => Ok(()),
        }
    }

    /// Whether `user` may open one more upload reserving `reserved` bytes.
    pub fn check(&self, user: &UserRecord, reserved: i64) -> MetaResult<()> {
        Self::may_write(user)?;
        if user.open_uploads.max(0) as u64 >= self.max_open {
            return Err(MetaError::TooManyOpenUploads);
        }
        Self::check_quota(self.quota_bytes, user, reserved)
    }
}

impl ResumableRecord {
    /// `Upload-Length` as a number, once known.
    pub fn known_length(&self) -> Option<u64> {
        self.length.map(|l| l as u64)
    }

    /// Where the tail starts: after the whole parts.
    pub fn tail_start(&self) -> i64 {
        self.parts.len() as i64 * self.part_size
    }

    /// Whether every byte is stored and the last part with them, so that
    /// only the commit may be left. A deferred length declared at the
    /// offset leaves the tail in staging: every byte is stored, but the
    /// last part is still to be written.
    pub fn last_part_stored(&self) -> bool {
        self.all_stored() && self.tail_start() >= self.offset
    }

    /// Whether every byte is stored (and only the commit may be left).
    pub fn all_stored(&self) -> bool {
        self.length == Some(self.offset)
    }

    /// Whether it holds the bytes `sent` records (the same offset, parts
    /// and hash state; committed or not): the write of `sent` applied.
    pub fn same_bytes(&self, sent: &ResumableRecord) -> bool {
        (self.offset, &self.parts, &self.sha256_state)
            == (sent.offset, &sent.parts, &sent.sha256_state)
    }

    /// How far it has got.
    pub fn progress(&self) -> Progress {
        Progress {
            offset: self.offset,
            parts: self.parts.len(),
            committed: self.committed,
        }
    }
}

/// What a deferred upload (no `Upload-Length` yet) reserves against its
/// user's quota.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reserve {
    /// Its length, declared by a PATCH: set, and reserved whole.
    Length(i64),
    /// The bytes it has stored, up to this offset, while its length is
    /// still deferred: a PATCH reserves them before the state records
    /// them, so that undeclared uploads cannot hold more than the quota.
    Stored(i64),
}

impl Reserve {
    /// What `upload` becomes and how many more bytes (fewer, if negative)
    /// its user then holds reserved; `None` when nothing changes: its
    /// length is known already, a length is below its offset (a PATCH
    /// moved it on meanwhile), or its stored bytes are reserved already.
    pub fn apply(self, upload: &ResumableRecord) -> Option<(ResumableRecord, i64)> {
        if upload.length.is_some() {
            return None;
        }
        let (length, reserved) = match self {
            Reserve::Length(l) if l < upload.offset => return None,
            Reserve::Length(l) => (Some(l), l),
            Reserve::Stored(upto) if upto <= upload.reserved => return None,
            Reserve::Stored(upto) => (None, upto),
        };
        let next = ResumableRecord {
            length,
            reserved,
            ..upload.clone()
        };
        Some((next, reserved - upload.reserved))
    }
}

/// `upload` holding nothing of its user's counters.
pub fn uncounted(upload: &ResumableRecord) -> ResumableRecord {
    ResumableRecord {
        reserved: 0,
        open: false,
        ..upload.clone()
    }
}

/// What [`ResumableRepo::delete_resumable_if_expires`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nothing: a PATCH renewed the upload since it was read, or it is gone.
    Missed,
    /// Deleted; `told`: with its `upload.expired` event written.
    Claimed { told: bool },
}

impl Claim {
    pub fn claimed(self) -> bool {
        matches!(self, Claim::Claimed { .. })
    }
}

/// Resumable uploads' records. One is found by its id and its user
/// (`owner`), who is known wherever one is read or written: a sharded
/// cluster then reads the one shard that holds the user's documents
/// (README "Scaling out: MongoDB sharded").
#[async_trait]
pub trait ResumableRepo: Send + Sync {
    /// Inserts the uploads (all of one user) with their intents and counts
    /// them against their user, in one transaction: as many more open
    /// uploads (`TooManyOpenUploads` past `limits.max_open`) and their
    /// `reserved` more reserved bytes (`QuotaExceeded` past the user's own
    /// quota, else `limits.quota_bytes`); refused, nothing is written (the
    /// error says why for one upload; for several, that they do not fit
    /// together).
    async fn insert_resumables(
        &self,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()>;

    /// Reserves what a deferred upload needs ([`Reserve`]: its declared
    /// length, which is set, or its stored bytes) on its user, in one
    /// transaction (`QuotaExceeded` past the user's own
    /// quota, else the default `quota`: nothing changes). The
    /// record as it is then (as it was when [`Reserve::apply`] changes
    /// nothing); `None` if the upload is gone.
    async fn reserve_deferred(
        &self,
        owner: &UserId,
        id: &FileId,
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>>;

    /// `owner`'s upload `id`, if there is one.
    async fn resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<Option<ResumableRecord>>;

    /// [`Self::resumable`] whoever's it is: on a sharded cluster, a read of
    /// every shard. Only for what knows no owner (the sweeper, of the local
    /// blob store's staging files, whose names carry none).
    async fn resumable_by_id_alone(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>>;

    /// Replaces the record with `upload` (keeping the stored `reserved`,
    /// `open` and `length`, which only the counting writes change) if its
    /// progress is still `expected` and its length (if declared) is not
    /// below `upload`'s offset: `false` (nothing changed) if another
    /// request moved it first (its offset, its parts, or its commit),
    /// declared a length it passes, or the upload is gone.
    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected: Progress,
    ) -> MetaResult<bool>;

    /// Deletes the upload and gives back what it still holds of its user's
    /// counters (its reservation, its open slot), in one transaction.
    async fn delete_resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<()>;

    /// Deletes the record if its expiry is still `expires_at` (no PATCH
    /// renewed it since it was read), giving back what it held of its
    /// user's counters in the same transaction: `false`, and nothing
    /// changed, if one did or the upload is gone. The sweeper claims an expired upload so,
    /// which is safe with or without the upload's lock; with `tell`, the
    /// claim writes its `upload.expired` (see `EventDraft::expiry_told_by`;
    /// none once its user is gone; a user's deletion, which ends their
    /// uploads, tells none).
    async fn delete_resumable_if_expires(
        &self,
        owner: &UserId,
        id: &FileId,
        expires_at: DateTime<Utc>,
        tell: bool,
    ) -> MetaResult<Claim>;

    /// Puts back an upload [`Self::delete_resumable_if_expires`] claimed
    /// (its abort failed), counting nothing: the claim gave back what it
    /// held, and an expired upload is no one's to resume.
    async fn restore_resumable(&self, upload: &ResumableRecord) -> MetaResult<()>;

    /// Uploads that expired before `before`, soonest first.
    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>>;
}
