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
    upload_records::ResumableRecord,
};
use crate::vocab::{Container, KeyId, LinkKind, Operation, UserId};

/// What happened. Stored by its name: a reader of an older version that
/// meets a newer type passes it on as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    FileCreated,
    FileDeleted,
    FileRenamed,
    SessionCreated,
    SessionDeleted,
    SessionFileAttached,
    SessionFileDetached,
    AgentCreated,
    AgentDeleted,
    AgentFileAttached,
    AgentFileDetached,
    AgentMcpConnected,
    AgentMcpDisconnected,
    AgentToolsetConnected,
    AgentToolsetDisconnected,
    KeyCreated,
    KeyRevoked,
    UserDeleted,
    UploadExpired,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FileCreated => "file.created",
            Self::FileDeleted => "file.deleted",
            Self::FileRenamed => "file.renamed",
            Self::SessionCreated => "session.created",
            Self::SessionDeleted => "session.deleted",
            Self::SessionFileAttached => "session.file_attached",
            Self::SessionFileDetached => "session.file_detached",
            Self::AgentCreated => "agent.created",
            Self::AgentDeleted => "agent.deleted",
            Self::AgentFileAttached => "agent.file_attached",
            Self::AgentFileDetached => "agent.file_detached",
            Self::AgentMcpConnected => "agent.mcp_connected",
            Self::AgentMcpDisconnected => "agent.mcp_disconnected",
            Self::AgentToolsetConnected => "agent.toolset_connected",
            Self::AgentToolsetDisconnected => "agent.toolset_disconnected",
            Self::KeyCreated => "key.created",
            Self::KeyRevoked => "key.revoked",
            Self::UserDeleted => "user.deleted",
            Self::UploadExpired => "upload.expired",
        }
    }

    /// A container's creation, deletion, or a file put in (`Some(true)`)
    /// or taken out of it.
    fn of_container(c: &Container, attached: Option<bool>, deleted: bool) -> Self {
        let session = matches!(c, Container::Session(_));
        match (session, attached, deleted) {
            (true, Some(true), _) => Self::SessionFileAttached,
            (true, Some(false), _) => Self::SessionFileDetached,
            (true, None, true) => Self::SessionDeleted,
            (true, None, false) => Self::SessionCreated,
            (false, Some(true), _) => Self::AgentFileAttached,
            (false, Some(false), _) => Self::AgentFileDetached,
            (false, None, true) => Self::AgentDeleted,
            (false, None, false) => Self::AgentCreated,
        }
    }

    fn of_link(kind: LinkKind, connected: bool) -> Self {
        match (kind, connected) {
            (LinkKind::Mcp, true) => Self::AgentMcpConnected,
            (LinkKind::Mcp, false) => Self::AgentMcpDisconnected,
            (LinkKind::Toolset, true) => Self::AgentToolsetConnected,
            (LinkKind::Toolset, false) => Self::AgentToolsetDisconnected,
        }
    }
}

/// What a container's events name it by in their data.
fn container_field(c: &Container) -> &'static str {
    match c {
        Container::Session(_) => "session_id",
        Container::Agent(_) => "agent_id",
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
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
            data: object(data),
        }
    }

    /// A session's or agent's creation (`name`: an agent's) or deletion.
    pub fn container(c: &Container, name: Option<&str>, deleted: bool) -> Self {
        let mut data = object(json!({ container_field(c): c.id() }));
        if let Some(name) = name {
            data.insert("name".to_owned(), Value::from(name));
        }
        Self {
            kind: EventType::of_container(c, None, deleted),
            subject: c.id(),
            data,
        }
    }

    /// A key's minting or revocation: its id and name (never its secret
    /// or hash).
    pub fn key(id: &KeyId, name: &str, revoked: bool) -> Self {
        Self {
            kind: match revoked {
                false => EventType::KeyCreated,
                true => EventType::KeyRevoked,
            },
            subject: id.to_string(),
            data: object(json!({"key_id": id, "name": name})),
        }
    }

    /// A user's deletion, begun: the one of their events it keeps (for the
    /// admin's reader) while it removes the rest with their data.
    pub fn user_deleted(user: &UserId) -> Self {
        Self {
            kind: EventType::UserDeleted,
            subject: user.to_string(),
            data: object(json!({"user_id": user})),
        }
    }

    /// A resumable upload that expired before its file committed: its id
    /// (the file's, had it committed), name, declared length (`None`:
    /// deferred) and the bytes it had received.
    pub fn upload_expired(upload: &ResumableRecord) -> Self {
        Self {
            kind: EventType::UploadExpired,
            subject: upload.id.to_string(),
            data: object(json!({
                "upload_id": upload.id,
                "filename": upload.filename,
                "length": upload.length,
                "offset": upload.offset,
            })),
        }
    }

    /// Whether the claim of an expired `upload` writes [`Self::upload_expired`]:
    /// not for one whose file committed (its state only lingered), nor for
    /// one put back after a claim whose clean-up failed (counted no more:
    /// its expiry was told when it was first claimed).
    pub fn expiry_told_by(upload: &ResumableRecord) -> bool {
        upload.open && !upload.committed
    }

    /// The event `op` writes when it changes its container (an attach of
    /// a file already there, say, changes nothing and writes none).
    pub fn of_op(op: &Operation) -> Self {
        match op {
            Operation::Attach {
                container,
                file_id,
                attached,
                ..
            } => Self {
                kind: EventType::of_container(container, Some(*attached), false),
                subject: container.id(),
                data: object(json!({
                    container_field(container): container.id(),
                    "file_id": file_id,
                })),
            },
            Operation::Link {
                agent_id,
                kind,
                link_id,
                connected,
                ..
            } => {
                let field = match kind {
                    LinkKind::Mcp => "mcp_id",
                    LinkKind::Toolset => "toolset_id",
                };
                Self {
                    kind: EventType::of_link(*kind, *connected),
                    subject: agent_id.to_string(),
                    data: object(json!({"agent_id": agent_id, field: link_id})),
                }
            }
            Operation::Delete { container, .. } => Self::container(container, None, true),
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
            feed: None,
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
    /// Its place in the feed of every owner's events (the admin's reader),
    /// given after its transaction committed ([`EventRepo::sequence_events`]):
    /// 1, 2, 3… in an order that keeps each owner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feed: Option<i64>,
}

impl EventRecord {
    pub fn id_for(owner: &UserId, seq: i64) -> String {
        format!("{owner}:{seq}")
    }
}

/// The events a group of changes writes, per owner (in the order the
/// owners first appear), each owner's in the group's order.
#[derive(Default)]
pub struct Owners(pub Vec<(UserId, Vec<EventDraft>)>);

impl Owners {
    pub fn add(&mut self, owner: &UserId, drafts: impl IntoIterator<Item = EventDraft>) {
        let mut drafts = drafts.into_iter().peekable();
        if drafts.peek().is_none() {
            return;
        }
        match self.0.iter_mut().find(|(o, _)| o == owner) {
            Some((_, mine)) => mine.extend(drafts),
            None => self.0.push((*owner, drafts.collect())),
        }
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

    /// In one snapshot of the store (a commit is seen whole or not at all,
    /// on a sharded cluster too): the number of `owner`'s last event (0:
    /// none yet, or no such user), and their events numbered above `after`
    /// as [`Self::events`] gives them. Every event numbered up to `last`
    /// is in the page unless the page is full or the retention removed it.
    async fn owner_page(&self, owner: &UserId, after: i64, limit: usize) -> MetaResult<OwnerPage>;

    /// Deletes the oldest events written before `before` (any owner's, at
    /// most `limit` of them found), each owner's with every event of theirs
    /// numbered before it (an owner's events are only ever removed from
    /// the first on), and up to `limit` dead letters of events written
    /// before it (their copies); how many.
    async fn expire_events(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<usize>;

    /// When the oldest event kept was written.
    async fn oldest_event(&self) -> MetaResult<Option<DateTime<Utc>>>;

    /// Places up to `limit` events not in the feed yet at its end, in one
    /// transaction: each owner's from their first one not placed on, in
    /// sequence order (an owner's later event never commits before an
    /// earlier one: both write the owner's document), owners in id order;
    /// how many. Two at once conflict (`WriteConflict`) on the feed's
    /// counter: positions are never given twice nor skipped.
    async fn sequence_events(&self, limit: usize) -> MetaResult<usize>;

    /// In one snapshot of the store (a sequencing transaction is seen
    /// whole or not at all, on a sharded cluster too, so no event placed up
    /// to `upto` is missed for not being visible yet): the feed's bounds,
    /// and the events placed after position `after`, in feed order, at
    /// most `limit` (a deleted user's are gone from it: only their
    /// `user.deleted` stays). Read a window of `width` places at a time
    /// (a store may read a whole range before it limits: the cost stays
    /// that of a page, not of the feed behind it), widened past windows
    /// with none (places left empty by deleted users' events, by the
    /// retention), up to the last place; `upto` is where the last window
    /// read ends. The bounds' floor is read again after the events: the
    /// retention marks the feed before it removes, so a removal the reads
    /// met shows there, even on a store that does not hold its reads to
    /// one snapshot.
    async fn feed(&self, after: i64, width: i64, limit: usize) -> MetaResult<FeedPage>;
}

/// See [`EventRepo::owner_page`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnerPage {
    pub last: i64,
    pub events: Vec<EventRecord>,
}

/// See [`EventRepo::feed`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedPage {
    pub bounds: FeedBounds,
    pub upto: i64,
    pub events: Vec<EventRecord>,
}

impl FeedPage {
    /// Where a window of `width` after `after` ends under `bounds`.
    pub fn upto(bounds: FeedBounds, after: i64, width: i64) -> i64 {
        bounds.last.min(after.saturating_add(width)).max(after)
    }
}

/// The feed's last position given, and the highest the retention
/// removed ([`FeedPage::bounds`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedBounds {
    /// The last position given (0: none yet).
    #[serde(default)]
    pub last: i64,
    /// The highest position of an event the retention removed: a reader
    /// whose cursor is below it may have missed one.
    #[serde(default)]
    pub floor: i64,
}

/// The key of the one document (MongoDB) or entry (embedded) that holds
/// the feed's [`FeedBounds`].
pub const FEED_STATE: &str = "event_feed";
