//! Driver errors as the store's error kinds: by code and label, never by message.

use mongodb::error::{ErrorKind, TRANSIENT_TRANSACTION_ERROR, WriteFailure};

use crate::meta::MetaError;

const WRITE_CONFLICT: i32 = 112;
/// The server waited too long for a lock another transaction holds: contention too.
const LOCK_TIMEOUT: i32 = 24;

const DUPLICATE_KEY: i32 = 11000;

const MIGRATION_CONFLICT: i32 = 117;
const SNAPSHOT_TOO_OLD: i32 = 239;
const SNAPSHOT_UNAVAILABLE: i32 = 246;
const STALE_CHUNK_HISTORY: i32 = 249;

/// The server's error code, wherever the driver put it.
fn code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        // `insert_many`: its first failed write says why.
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map(|w| w.code)
            .or(m.write_concern_error.as_ref().map(|w| w.code)),
        // `bulkWrite`: its first failed write, else its write concern's.
        ErrorKind::BulkWrite(b) => failed_write(e)
            .and_then(|i| b.write_errors.get(&i))
            .map(|w| w.code)
            .or(b.write_concern_errors.first().map(|w| w.code)),
        _ => None,
    }
}

/// Which of a `bulkWrite`'s writes failed first (its index in the command).
pub fn failed_write(e: &mongodb::error::Error) -> Option<usize> {
    match e.kind.as_ref() {
        ErrorKind::BulkWrite(b) => b.write_errors.keys().min().copied(),
        _ => None,
    }
}

/// Whether the error means the server could not be reached.
fn is_unreachable(e: &mongodb::error::Error) -> bool {
    matches!(
        e.kind.as_ref(),
        ErrorKind::ServerSelection { .. }
            | ErrorKind::Io(_)
            | ErrorKind::ConnectionPoolCleared { .. }
            | ErrorKind::DnsResolve { .. }
            | ErrorKind::Shutdown
    )
}

/// Maps a driver error to the store's error kinds.
pub fn classify(e: mongodb::error::Error) -> MetaError {
    if is_unreachable(&e) {
        return MetaError::Unavailable(e.to_string());
    }
    match code(&e) {
        Some(WRITE_CONFLICT | LOCK_TIMEOUT) => MetaError::WriteConflict,
        Some(DUPLICATE_KEY) => MetaError::Duplicate,
        // A snapshot read's point in time no longer (or not yet) held, a
        // chunk moved under it: the next read takes a new one.
        Some(
            SNAPSHOT_TOO_OLD | SNAPSHOT_UNAVAILABLE | STALE_CHUNK_HISTORY | MIGRATION_CONFLICT,
        ) => MetaError::Transient(e.to_string()),
        _ if e.contains_label(TRANSIENT_TRANSACTION_ERROR) => MetaError::Transient(e.to_string()),
        _ => MetaError::Other(e.to_string()),
    }
}

/// Maps the error of a single write outside a transaction: one that broke
/// off on an open link may have reached the server and applied (the
/// driver's own retry included), so its outcome is unknown; one that found
/// no server was never sent.
pub fn classify_sent(e: mongodb::error::Error) -> MetaError {
    match e.kind.as_ref() {
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => {
            MetaError::OutcomeUnknown(e.to_string())
        }
        _ => classify(e),
    }
}
