//! filedock: a file-upload backend where many writes to the same user,
//! session or agent, arriving within milliseconds, all succeed.

pub mod blob;
pub mod config;
pub mod coord;
pub mod domain;
pub mod error;
pub mod http;
pub mod lock;
pub mod meta;
pub mod metrics;
pub mod reconcile;
pub mod retry;
pub mod startup;
pub mod sweeper;
pub mod telemetry;
