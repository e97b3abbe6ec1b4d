//! Webhooks' delivery state: where each endpoint's delivery stands, so that
//! whichever instance delivers next goes on from there.
//!
//! - A *mark* per endpoint and partition of owners: every event placed in
//!   the feed up to it (a feed position) is delivered to the endpoint or
//!   dead-lettered; and, for each owner with an event past it delivered,
//!   the number of their last one delivered. A new holder reads the feed
//!   from the mark and skips what those numbers say was delivered. Written
//!   by the partition's lease holder, fenced by its lease's token: a holder
//!   whose lease passed to another writes nothing. An owner leaves it once
//!   the mark passes their events (a deleted user's id too).
//! - *Dead letters*: events given up on after `FILEDOCK_WEBHOOK_MAX_AGE_SECS`,
//!   kept with the event until an admin replays or discards them.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    error::MetaResult,
    events::{EventRecord, EventType},
    records::bson_time,
};

/// An event given up on for one endpoint.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeadLetter {
    /// `{endpoint}:{event id}` ([`DeadLetter::id_for`]).
    #[serde(rename = "_id")]
    pub id: String,
    /// The endpoint's id (a hash of its URL).
    pub endpoint: String,
    /// The endpoint's URL when it was given up on.
    pub url: String,
    pub event: EventRecord,
    /// Attempts made.
    pub attempts: u32,
    /// What the last attempt met (a status, a timeout, a refused connection).
    pub last_error: String,
    #[serde(with = "bson_time")]
    pub dead_at: DateTime<Utc>,
}

impl DeadLetter {
    pub fn id_for(endpoint: &str, event: &EventRecord) -> String {
        format!("{endpoint}:{}", event.id)
    }

    /// Whether it is kept after its owner's deletion began: a
    /// `user.deleted` letter is, as that event is (it names the user and
    /// nothing of theirs; the retention removes both).
    pub fn outlives_its_owner(&self) -> bool {
        self.event.kind == EventType::UserDeleted.as_str()
    }
}

/// Where a partition's delivery stands (see the module's comment).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookMark {
    /// Every event placed in the feed up to here is done.
    #[serde(default)]
    pub position: i64,
    /// Owner id → the number of their last event delivered, for the owners
    /// with one delivered past `position`.
    #[serde(default)]
    pub owners: BTreeMap<String, i64>,
}

/// The delivery state of webhooks (see the module's comment).
#[async_trait]
pub trait WebhookRepo: Send + Sync {
    /// The mark of `endpoint`'s `partition` (the default: none written yet).
    async fn webhook_mark(&self, endpoint: &str, partition: u32) -> MetaResult<WebhookMark>;

    /// Writes the mark (its position never lowered), as the holder of the
    /// partition's lease with fencing token `fence`: `Ok(false)`, and
    /// nothing written, if a holder with a greater token wrote it since
    /// (this one's lease is gone).
    async fn raise_webhook_mark(
        &self,
        endpoint: &str,
        partition: u32,
        fence: u64,
        mark: &WebhookMark,
    ) -> MetaResult<bool>;

    /// Keeps `letter` (again: replaced), unless its owner is deleted or
    /// being deleted: then nothing is kept (`false`), as their deletion
    /// removes every letter of theirs it finds; but a `user.deleted`
    /// letter is kept (see [`DeadLetter::outlives_its_owner`]).
    async fn put_dead_letter(&self, letter: &DeadLetter) -> MetaResult<bool>;

    /// Dead letters in id order after `after`, at most `limit`.
    async fn dead_letters(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<DeadLetter>>;

    async fn dead_letter(&self, id: &str) -> MetaResult<Option<DeadLetter>>;

    /// Removes a dead letter; whether there was one.
    async fn remove_dead_letter(&self, id: &str) -> MetaResult<bool>;

    /// How many dead letters are kept.
    async fn count_dead_letters(&self) -> MetaResult<u64>;
}
