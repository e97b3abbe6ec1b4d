//! Events: the outbox. Every committed change of a user's writes its event
//! in the change's own transaction, numbered by the `event_seq` counter of
//! the user document the transaction writes anyway: an event exists
//! exactly when its change does, and one owner's events are numbered
//! 1, 2, 3… in commit order with no gap (two transactions that write the
//! same user document conflict, and one of them runs again).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    error::MetaResult,
    records::{FileRecord, bson_time, now},
};
use crate::vocab::UserId;

/// What happened. Stored by its name: a reader of an older version that
/// meets a newer type passes it on as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    FileCreated,
    FileDeleted,
    FileRenamed,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FileCreated => "file.created",
            Self::FileDeleted => "file.deleted",
            Self::FileRenamed => "file.renamed",
        }
    }
}

/// An event before its transaction numbers it.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDraft {
    pub kind: EventType,
    /// The id of what the event is about (a file's, for `file.*`).
    pub subject: String,
    /// The subject as the change left it.
    pub data: Map<String, Value>,
}

impl EventDraft {
    fn of_file(kind: EventType, file: &FileRecord) -> Self {
        let data = json!({
            "file_id": file.id,
            "filename": file.filename,
            "size": file.size,
            "content_type": file.content_type,
            "sha256": file.sha256,
        });
        Self {
            kind,
            subject: file.id.to_string(),
            data: match data {
                Value::Object(map) => map,
                _ => unreachable!("an object literal"),
            },
        }
    }

    pub fn file_created(file: &FileRecord) -> Self {
        Self::of_file(EventType::FileCreated, file)
    }

    pub fn file_deleted(file: &FileRecord) -> Self {
        Self::of_file(EventType::FileDeleted, file)
    }

    /// `file` as renamed.
    pub fn file_renamed(file: &FileRecord) -> Self {
        Self::of_file(EventType::FileRenamed, file)
    }

    /// The event numbered `seq` of `owner`, at `time`.
    pub fn numbered(self, owner: UserId, seq: i64, time: DateTime<Utc>) -> EventRecord {
        EventRecord {
            id: EventRecord::id_for(&owner, seq),
            owner_id: owner,
            seq,
            kind: self.kind.as_str().to_owned(),
            subject: self.subject,
            time,
            data: self.data,
        }
    }
}

/// `events` collection: one per committed change, kept for
/// `FILEDOCK_EVENT_RETENTION_SECS` (or until its owner is deleted).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventRecord {
    /// `{owner_id}:{seq}`: unique, and the same however often a reader
    /// (or a redelivery) meets it.
    #[serde(rename = "_id")]
    pub id: String,
    pub owner_id: UserId,
    /// The owner's sequence number: 1, 2, 3… with no gap.
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub subject: String,
    /// When the change's transaction numbered it (by the clock of the
    /// instance that ran it: `seq`, not `time`, orders events).
    #[serde(with = "bson_time")]
    pub time: DateTime<Utc>,
    pub data: Map<String, Value>,
}

impl EventRecord {
    pub fn id_for(owner: &UserId, seq: i64) -> String {
        format!("{owner}:{seq}")
    }
}

/// Numbers `drafts` as the events after `last_before` of `owner` (the
/// user's `event_seq` before the transaction's increment), in order.
pub fn number(owner: UserId, last_before: i64, drafts: Vec<EventDraft>) -> Vec<EventRecord> {
    let time = now();
    drafts
        .into_iter()
        .zip(last_before + 1..)
        .map(|(d, seq)| d.numbered(owner, seq, time))
        .collect()
}

/// Reading events, and their retention.
#[async_trait]
pub trait EventRepo: Send + Sync {
    /// `owner`'s events numbered above `after`, in sequence order, at most
    /// `limit`.
    async fn events(
        &self,
        owner: &UserId,
        after: i64,
        limit: usize,
    ) -> MetaResult<Vec<EventRecord>>;

    /// The number of `owner`'s last event (0: none yet, or no such user),
    /// as durably as [`Self::events`] reads them.
    async fn last_event_seq(&self, owner: &UserId) -> MetaResult<i64>;

    /// Deletes the oldest events written before `before` (any owner's, at
    /// most `limit` of them found), each owner's with every event of theirs
    /// numbered before it (an owner's events are only ever removed from
    /// the first on); how many.
    async fn expire_events(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<usize>;

    /// When the oldest event kept was written.
    async fn oldest_event(&self) -> MetaResult<Option<DateTime<Utc>>>;
}
