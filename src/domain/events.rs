//! Reading a user's events (the outbox every committed change writes in
//! its own transaction, `meta::events`): in their sequence order, from a
//! cursor the previous read returned.

use std::sync::Arc;

use super::DomainError;
use crate::meta::{EventRecord, EventRepo, UserRecord};

/// What one read may ask for.
pub const MAX_LIMIT: usize = 1000;
pub const DEFAULT_LIMIT: usize = 100;

/// Events, and the cursor to read on from (the last one's number, or the
/// cursor read from when there was none).
pub struct EventPage {
    pub events: Vec<EventRecord>,
    pub cursor: i64,
}

pub struct EventService {
    events: Arc<dyn EventRepo>,
}

impl EventService {
    pub fn new(events: Arc<dyn EventRepo>) -> Self {
        Self { events }
    }

    /// `user`'s events numbered above `after`, at most `limit` (1 to
    /// [`MAX_LIMIT`]).
    pub async fn pull(
        &self,
        user: &UserRecord,
        after: i64,
        limit: usize,
    ) -> Result<EventPage, DomainError> {
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(DomainError::InvalidRequest(format!(
                "limit must be between 1 and {MAX_LIMIT}"
            )));
        }
        let events = self.events.events(&user.id, after, limit).await?;
        let cursor = events.last().map_or(after, |e| e.seq);
        Ok(EventPage { events, cursor })
    }
}
