//! Domain types and the services that hold the flows (upload, files, users).

pub mod files;
pub mod ids;
pub mod upload;
pub mod users;

pub use ids::{FileId, Filename, SizeCategory, UserId};
