//! Domain types and the services that hold the flows (upload, files, users).

pub mod containers;
pub mod files;
pub mod ids;
pub mod upload;
pub mod users;

pub use ids::{AgentId, FileId, Filename, LinkId, SessionId, SizeCategory, UserId};
