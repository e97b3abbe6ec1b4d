//! The metadata layer's errors, classified so callers never read messages.

#[derive(Clone, Debug, thiserror::Error)]
pub enum MetaError {
    /// Another transaction wrote the same document first; retry the whole transaction.
    #[error("write conflict")]
    WriteConflict,
    /// A newer lock holder already committed: this holder's lock had expired.
    #[error("stale fencing token")]
    StaleFence,
    #[error("quota exceeded")]
    QuotaExceeded,
    /// The user has as many open resumable uploads as they may have.
    #[error("too many open uploads")]
    TooManyOpenUploads,
    #[error("not found")]
    NotFound,
    /// The user is being deleted (`deleting_since` is set): none of their
    /// writes commits, whichever instance still takes their key.
    #[error("the user is being deleted")]
    UserDeleting,
    /// The session's or agent's list already holds its limit of members
    /// (`FILEDOCK_MAX_CONTAINER_ITEMS`); nothing was changed.
    #[error("the list already holds its limit of {0} items")]
    ContainerFull(usize),
    /// The key that asked for a new key or token no longer exists (it was
    /// revoked, perhaps while the request ran); nothing was stored.
    #[error("the minting key is revoked")]
    MinterRevoked,
    /// The user holds `FILEDOCK_MAX_KEYS_PER_USER` keys; nothing was stored.
    #[error("the user holds their limit of {0} keys")]
    TooManyKeys(usize),
    /// The user holds `FILEDOCK_MAX_TOKENS_PER_USER` live tokens; nothing
    /// was stored.
    #[error("the user holds their limit of {0} live tokens")]
    TooManyTokens(usize),
    #[error("duplicate key")]
    Duplicate,
    /// The upload's intent was swept before it committed (it ran past the grace period).
    #[error("upload intent gone")]
    IntentGone,
    /// A resumable upload's state moved on (or went) since the committing
    /// request read it ([`StateAdvance`]): another request wrote it.
    ///
    /// [`StateAdvance`]: super::StateAdvance
    #[error("the upload moved on")]
    Moved,
    /// The operation id is in `processed_ops`: it was applied before (a
    /// redelivered queue message); nothing was changed.
    #[error("operation already applied")]
    AlreadyApplied,
    /// The operation id was settled before without applying (see
    /// `processed_ops`): nothing was changed, and it never applies.
    #[error("operation settled unapplied before: {0:?}")]
    Refused(super::records::Refusal),
    /// The server aborted the transaction for a reason other than a write
    /// conflict (a dropped link, an election): retry it whole; if that keeps
    /// failing, the store is the problem, not contention.
    #[error("transaction aborted by the store: {0}")]
    Transient(String),
    /// The store cannot be reached.
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    /// The commit was sent but its answer was lost (the link dropped, the
    /// server stepped down): the transaction may or may not have applied.
    /// Never treat this as a failure; settle it by reading back.
    #[error("commit outcome unknown: {0}")]
    OutcomeUnknown(String),
    #[error("metadata store error: {0}")]
    Other(String),
}

impl MetaError {
    pub fn is_write_conflict(&self) -> bool {
        matches!(self, Self::WriteConflict)
    }

    /// A commit's file insert that met its own id: an earlier attempt of
    /// the same commit (retried whole after an answer that said it had
    /// not applied) may have stored it. Not a conflict to answer 500 on:
    /// the caller settles it by reading the file back.
    pub fn met_own_file(self) -> Self {
        match self {
            Self::Duplicate => Self::OutcomeUnknown(
                "the file is stored already: an earlier attempt of this commit may have applied"
                    .into(),
            ),
            e => e,
        }
    }

    /// Whether running the whole transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::WriteConflict | Self::Transient(_))
    }
}

pub type MetaResult<T> = Result<T, MetaError>;
