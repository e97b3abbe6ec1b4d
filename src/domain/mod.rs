//! The domain: its vocabulary (`ids`, `commands`), its error, and the
//! services that hold the flows (upload, files, containers, users, the
//! sweeper, reconcile). Services hold the ports they use and never see the
//! HTTP layer or the application state.

pub mod commands;
mod commit;
pub mod containers;
pub mod digest;
pub mod error;
pub mod files;
pub mod ids;
pub mod links;
pub mod media;
pub mod page;
pub mod reconcile;
pub mod resumable;
pub mod sweeper;
pub mod upload;
pub mod users;

pub use error::DomainError;
pub use ids::{AgentId, FileId, Filename, LinkId, MediaType, SessionId, SizeCategory, UserId};
