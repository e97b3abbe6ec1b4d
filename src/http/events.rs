//! `GET /v1/events?after=&limit=&wait=`: the caller's events in sequence
//! order, waiting up to `wait` seconds for one when there is none yet; with
//! the admin key, every owner's, in the feed's order (each owner's in
//! sequence order), the cursor a place in the feed.

use std::time::Duration;

use axum::{Json, extract::State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    error::{ApiResult, ok},
    extract::{AdminOrUser, AppQuery},
    state::AppState,
};
use crate::{
    domain::{
        DomainError,
        events::{DEFAULT_LIMIT, EventPage},
    },
    meta::EventRecord,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The cursor a previous read returned (`0`, or none: from the first).
    after: Option<String>,
    limit: Option<usize>,
    /// Seconds to wait for an event when there is none yet (0 to 60).
    wait: Option<u64>,
}

/// A cursor: the number of the last event read, in decimal digits.
fn cursor(raw: Option<&str>) -> Result<i64, DomainError> {
    let Some(raw) = raw else { return Ok(0) };
    let bad = || DomainError::InvalidRequest("after must be a cursor this API returned".into());
    if raw.is_empty() || raw.len() > 18 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    raw.parse().map_err(|_| bad())
}

/// `GET /v1/events`.
pub async fn list(
    caller: AdminOrUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<EventsQuery>,
) -> ApiResult {
    let after = cursor(q.after.as_deref())?;
    let wait = Duration::from_secs(q.wait.unwrap_or(0).min(u32::MAX.into()));
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let events = &state.events;
    let caller = &caller;
    let pull = |wait| async move {
        match caller {
            AdminOrUser::User(user) => events.pull_waiting(user, after, limit, wait).await,
            AdminOrUser::Admin => events.pull_feed_waiting(after, limit, wait).await,
        }
    };
    // A long poll answers with what it has once the instance drains.
    let EventPage { events, cursor } = tokio::select! {
        page = pull(wait) => page?,
        () = state.drain.closing().cancelled() => pull(Duration::ZERO).await?,
    };
    let events: Vec<_> = events.into_iter().map(event_json).collect();
    ok(Json(
        json!({"events": events, "cursor": cursor.to_string()}),
    ))
}

/// An event as the API shows it (`GET /v1/events`, a dead letter's event).
pub(super) fn event_json(e: EventRecord) -> Value {
    json!({
        "id": e.id,
        "type": e.kind,
        "time": e.time,
        "owner_id": e.owner_id,
        "seq": e.seq,
        "subject": e.subject,
        "data": e.data,
    })
}
