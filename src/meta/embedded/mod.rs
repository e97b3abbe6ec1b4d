//! Embedded `MetadataStore` on redb: one on-disk file under the data dir,
//! with optimistic transactions that report write-write conflicts the way
//! MongoDB does, so the same retry path runs on both.
//!
//! A transaction reads from a redb snapshot and buffers its writes. At commit
//! (redb runs one write transaction at a time) every written key's version is
//! compared with the version the snapshot saw: if another transaction has
//! committed that key since, the commit fails with `WriteConflict`
//! (first committer wins, as WiredTiger's snapshot isolation does).

//!
//! `txn.rs` is that transaction engine; `users.rs`, `files.rs`,
//! `cleanup.rs` and `containers.rs` implement one repository each.

mod cleanup;
mod containers;
mod files;
mod resumable;
mod txn;
mod users;

use std::{
    collections::{BTreeMap, HashMap},
    ops::Bound,
    path::Path,
    sync::Arc,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redb::{Database, ReadOnlyTable, ReadableTable, TableDefinition};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use self::{containers::set_member, txn::Txn};
use super::*;

const DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("docs");

const SEQ_KEY: &str = "\0seq";

/// The embedded store; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    db: Arc<Database>,
}

fn other(e: impl std::fmt::Display) -> MetaError {
    MetaError::Other(e.to_string())
}

impl EmbeddedStore {
    /// Opens (or creates) `dir/metadata.redb`. Only one process may hold it.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("metadata.redb");
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => anyhow::anyhow!(
                "{} is in use by another filedock process (the embedded store allows one)",
                path.display()
            ),
            e => anyhow::anyhow!("opening {}: {e}", path.display()),
        })?;
        let w = db.begin_write()?;
        w.open_table(DOCS)?;
        w.commit()?;
        Ok(Self { db: Arc::new(db) })
    }
}

fn user_key(id: &str) -> String {
    format!("users/{id}")
}

fn file_key(id: &str) -> String {
    format!("files/{id}")
}

fn owner_prefix(owner: &str) -> String {
    format!("owner_files/{owner}/")
}

/// The document if it exists and `owner` owns it.
fn owned(doc: Option<Value>, owner: &str) -> MetaResult<Value> {
    doc.filter(|d| d["owner_id"] == owner)
        .ok_or(MetaError::NotFound)
}

/// Checks and advances a fencing token stored in a document's `fence` map.
fn apply_fence_value(doc: &mut Value, fence: Option<&Fence>) -> MetaResult<()> {
    if let Some(f) = fence {
        if doc["fence"][&f.slot].as_i64().unwrap_or(0) > f.token {
            return Err(MetaError::StaleFence);
        }
        doc["fence"][&f.slot] = Value::from(f.token);
    }
    Ok(())
}

/// Checks and advances a fencing token on a user document.
pub(crate) fn apply_fence(user: &mut UserRecord, fence: Option<&Fence>) -> MetaResult<()> {
    if let Some(f) = fence {
        let slot = user.upload_fence.entry(f.slot.clone()).or_insert(0);
        if *slot > f.token {
            return Err(MetaError::StaleFence);
        }
        *slot = f.token;
    }
    Ok(())
}

#[async_trait]
impl MetadataStore for EmbeddedStore {
    async fn ping(&self) -> MetaResult<()> {
        self.transaction(|_| Ok(())).await
    }
}
