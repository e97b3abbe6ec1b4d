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
        let store = Self { db: Arc::new(db) };
        store.index_owned_containers()?;
        Ok(store)
    }

    /// Indexes the sessions and agents of a store written before they had
    /// an owner index (see [`owner_index`]); a no-op once they have.
    fn index_owned_containers(&self) -> MetaResult<()> {
        let mut tx = self.begin()?;
        for collection in ["sessions", "agents"] {
            for key in tx.keys(&format!("{collection}/"), None, usize::MAX)? {
                let Some(doc) = tx.get::<Value>(&key)? else {
                    continue;
                };
                let (Some(owner), Some(id)) = (doc["owner_id"].as_str(), doc["_id"].as_str())
                else {
                    continue;
                };
                let index_key = format!("{}{id}", owner_index(collection, owner));
                if tx.get::<Value>(&index_key)?.is_none() {
                    tx.put(&index_key, &())?;
                }
            }
        }
        tx.commit(self)
    }
}

fn user_key(id: &str) -> String {
    format!("users/{id}")
}

fn file_key(id: &str) -> String {
    format!("files/{id}")
}

/// The index of an owner's documents in `collection`: a key
/// `owner_{collection}/{owner}/{id}` per document, so that a list is a range read.
fn owner_index(collection: &str, owner: &str) -> String {
    format!("owner_{collection}/{owner}/")
}

/// A page of `owner`'s documents in `collection`, in id order, after `after`.
fn owned_page<T: DeserializeOwned>(
    tx: &mut Txn,
    collection: &str,
    owner: &str,
    after: Option<&str>,
    limit: usize,
) -> MetaResult<Vec<T>> {
    let prefix = owner_index(collection, owner);
    let keys = tx.keys(&prefix, after, limit)?;
    let mut docs = Vec::with_capacity(keys.len());
    for k in keys {
        if let Some(doc) = tx.get(&format!("{collection}/{}", &k[prefix.len()..]))? {
            docs.push(doc);
        }
    }
    Ok(docs)
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
