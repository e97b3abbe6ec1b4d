//! Webhooks: every event (the outbox, `domain::events`) delivered to each
//! `FILEDOCK_WEBHOOK_URL`, signed (`hooks`), at least once, each owner's in
//! sequence order: the next only once the previous got a 2xx, or was given
//! up on after `FILEDOCK_WEBHOOK_MAX_AGE_SECS` (a dead letter; the owner's
//! later events go on). Owners are delivered in parallel.
//!
//! - The owners fall in [`PARTITIONS`] fixed partitions (a hash of their
//!   id). Each partition is delivered by one instance at a time, the holder
//!   of its lease (with a fencing token); the live instances share them as
//!   the queue's buckets are shared (`coord::members`).
//! - A holder reads the feed of every owner's events (one reader per
//!   endpoint and instance, woken by the feed's bell) and queues each
//!   event of its partitions by owner. Where it stands is kept in the store
//!   (`meta::webhooks`): the partition's mark (the feed position up to which
//!   all is done, fenced by the lease's token) and each owner's last event
//!   delivered; the next holder goes on from there, so an event delivered
//!   just before a holder died may be delivered again (the same
//!   `webhook-id`), never skipped.
//! - A holder sends only while its lease surely holds by its own clock
//!   ([`LeaseClock`](crate::lock::LeaseClock)), checked before the request
//!   is first polled and at every poll of it: a process paused past its
//!   lease wakes to find it passed and sends nothing more, so a later
//!   holder's deliveries are never followed by an earlier event of the
//!   same owner.

mod dispatch;
mod endpoint;
mod owners;
mod service;
mod tasks;

pub use self::dispatch::{Dispatcher, dispatchers};
pub use self::endpoint::{Endpoint, PARTITIONS, body_of, partition_of};
pub use self::service::{WebhookPorts, Webhooks};
pub use crate::hooks::Answer;
