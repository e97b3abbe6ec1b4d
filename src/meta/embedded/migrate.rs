//! Start-up migrations of the embedded store: each rewrites documents of an
//! older shape and is a no-op on the current one, so it runs at every open.

use serde_json::Value;

use super::{EmbeddedStore, owner_index};
use crate::meta::MetaResult;

impl EmbeddedStore {
    /// Runs every migration; what each changed is logged.
    pub(super) fn migrate(&self) -> MetaResult<()> {
        self.index_owned_containers()?;
        let users = self.count_user_files()?;
        if users > 0 {
            tracing::info!(users, "migrated users' file_ids arrays to file_count");
        }
        Ok(())
    }

    /// Indexes the sessions and agents of a store written before they had
    /// an owner index (see [`owner_index`]).
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

    /// Replaces a user's `file_ids` array (the shape before issue 22) with
    /// `file_count`, counted from the user's files (their owner index);
    /// returns how many users it rewrote.
    fn count_user_files(&self) -> MetaResult<usize> {
        let mut tx = self.begin()?;
        let mut rewritten = 0;
        for key in tx.keys("users/", None, usize::MAX)? {
            let Some(mut doc) = tx.get::<Value>(&key)? else {
                continue;
            };
            let Some(obj) = doc.as_object_mut() else {
                continue;
            };
            if obj.remove("file_ids").is_none() {
                continue;
            }
            let owner = key.trim_start_matches("users/");
            let count = tx
                .keys(&owner_index("files", owner), None, usize::MAX)?
                .len();
            obj.insert("file_count".into(), Value::from(count as i64));
            tx.put(&key, &doc)?;
            rewritten += 1;
        }
        tx.commit(self)?;
        Ok(rewritten)
    }
}
