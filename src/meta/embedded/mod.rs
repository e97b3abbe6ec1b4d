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
mod deletion;
mod events;
mod files;
mod migrate;
mod resumable;
mod txn;
mod users;
mod webhooks;

use std::path::Path;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;

use self::txn::{Db, Txn};
use crate::{
    meta::{Fence, MetaError, MetaResult, MetadataStore, UserRecord},
    vocab::{FileId, UserId},
};

/// The embedded store; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    db: Db,
}

impl AsRef<Db> for EmbeddedStore {
    fn as_ref(&self) -> &Db {
        &self.db
    }
}

impl EmbeddedStore {
    /// Opens (or creates) `dir/metadata.redb`. Only one process may hold it.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let store = Self {
            db: Db::open(&dir.join("metadata.redb"))?,
        };
        store.migrate()?;
        Ok(store)
    }

    /// Begins a transaction on a snapshot of the current state.
    pub fn begin(&self) -> MetaResult<Txn> {
        self.db.begin()
    }

    /// Runs `f` in a transaction on a blocking thread and commits it.
    pub async fn transaction<T, F>(&self, f: F) -> MetaResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Txn) -> MetaResult<T> + Send + 'static,
    {
        self.db.transaction(f).await
    }
}

pub(super) fn user_key(id: &UserId) -> String {
    format!("users/{id}")
}

pub(super) fn file_key(id: &FileId) -> String {
    format!("files/{id}")
}

/// The index of an owner's documents in `collection`: a key
/// `owner_{collection}/{owner}/{id}` per document, so that a list is a range read.
pub(super) fn owner_index(collection: &str, owner: impl std::fmt::Display) -> String {
    format!("owner_{collection}/{owner}/")
}

/// A page of `owner`'s documents in `collection`, in id order, after `after`.
pub(super) fn owned_page<T: DeserializeOwned>(
    tx: &mut Txn,
    collection: &str,
    owner: &UserId,
    after: Option<&dyn std::fmt::Display>,
    limit: usize,
) -> MetaResult<Vec<T>> {
    let prefix = owner_index(collection, owner);
    let after = after.map(ToString::to_string);
    let keys = tx.keys(&prefix, after.as_deref(), limit)?;
    let mut docs = Vec::with_capacity(keys.len());
    for k in keys {
        if let Some(doc) = tx.get(&format!("{collection}/{}", &k[prefix.len()..]))? {
            docs.push(doc);
        }
    }
    Ok(docs)
}

/// The document if it exists and `owner` owns it.
pub(super) fn owned(doc: Option<Value>, owner: &UserId) -> MetaResult<Value> {
    doc.filter(|d| d["owner_id"] == owner.to_string().as_str())
        .ok_or(MetaError::NotFound)
}

/// Checks and advances a fencing token stored in a document's `fence` map.
pub(super) fn apply_fence_value(doc: &mut Value, fence: Option<&Fence>) -> MetaResult<()> {
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
