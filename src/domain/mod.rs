//! The domain: its error and the
//! services that hold the flows (upload, files, containers, users, the
//! sweeper, reconcile). Services hold the ports they use and never see the
//! HTTP layer or the application state.

pub mod auth;
pub mod auth_cache;
mod commit;
pub mod containers;
pub mod digest;
pub mod error;
pub mod events;
pub mod files;
pub mod links;
pub mod media;
pub mod page;
pub mod reconcile;
pub mod resumable;
pub mod settle;
pub mod sweeper;
#[cfg(test)]
mod test_keys;
#[cfg(test)]
mod test_kit;
pub mod tokens;
pub mod upload;
pub mod users;
pub mod webhooks;

/// The vocabulary the services speak (`crate::vocab`), named here too.
pub use crate::vocab::{
    AgentId, FileId, Filename, LinkId, MediaType, SessionId, SizeCategory, UserId,
};
pub use error::DomainError;
