//! Start-up migrations of the embedded store: each rewrites documents of an
//! older shape and is a no-op on the current one, so it runs at every open.

use serde_json::Value;

use super::{
    EmbeddedStore, events, owner_index, user_key, users::put_key, webhooks::index_dead_letters,
};
use crate::{
    meta::{ApiKeyRecord, EventRecord, FIRST_KEY_NAME, MetaResult, UserRecord},
    vocab::{ApiKeyHash, KeyId, UserId},
};

/// Where a store of the shape before issue 25 indexed a user's one key by
/// its hash (the user's id under `api_keys/{hash}`, and the hash again as
/// the user's `api_key_hash`).
const LEGACY_KEY_PREFIX: &str = "api_keys/";

impl EmbeddedStore {
    /// Runs every migration; what each changed is logged.
    pub(super) fn migrate(&self) -> MetaResult<()> {
        self.index_owned_containers()?;
        let users = self.count_user_files()?;
        if users > 0 {
            tracing::info!(users, "migrated users' file_ids arrays to file_count");
        }
        let moved = self.migrate_single_keys()?;
        if moved > 0 {
            tracing::info!(moved, "moved users' single keys into api keys");
        }
        let mut tx = self.begin()?;
        let letters = index_dead_letters(&mut tx)?;
        tx.commit(self)?;
        if letters > 0 {
            tracing::info!(letters, "indexed webhook dead letters by owner and time");
        }
        let pending = pend_unplaced_events(self)?;
        if pending > 0 {
            tracing::info!(
                pending,
                "events written before the feed now wait to be placed in it"
            );
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

    /// Moves every key of the old shape into `keys/`, named
    /// [`FIRST_KEY_NAME`] and dated as its user, in one transaction; how
    /// many. The user's document loses only `api_key_hash` (rewritten as
    /// stored, not through [`UserRecord`], so that no other field of an
    /// older shape is dropped before its own migration reads it). A no-op
    /// once done, so every start may run it.
    fn migrate_single_keys(&self) -> MetaResult<usize> {
        let mut tx = self.begin()?;
        let legacy = tx.keys(LEGACY_KEY_PREFIX, None, usize::MAX)?;
        let mut moved = 0;
        for index in legacy {
            let user_id = tx.get::<UserId>(&index)?;
            tx.delete(&index);
            let Some(ukey) = user_id.map(|id| user_key(&id)) else {
                continue;
            };
            let (Some(mut doc), Some(user)) =
                (tx.get::<Value>(&ukey)?, tx.get::<UserRecord>(&ukey)?)
            else {
                continue; // a key whose user is gone authenticates no one
            };
            if let Some(obj) = doc.as_object_mut() {
                obj.remove("api_key_hash");
            }
            tx.put(&ukey, &doc)?;
            let key = ApiKeyRecord {
                id: KeyId::new(),
                user_id: user.id,
                name: FIRST_KEY_NAME.into(),
                hash: ApiKeyHash::from_hex(index[LEGACY_KEY_PREFIX.len()..].to_string()),
                created_at: user.created_at,
            };
            put_key(&mut tx, &key)?;
            moved += 1;
        }
        tx.commit(self)?;
        Ok(moved)
    }
}

/// Marks that every event written before the feed existed has its entry
/// `feed_pending/…` (so that this runs once, not at every open).
const FEED_PENDING_DONE: &str = "migrations/feed_pending";

/// Gives every event not placed in the feed the entry that has the
/// sequencer place it (events written before the feed had none: they
/// would never be placed, and neither the retention nor a user's
/// deletion, which remove only placed events, would remove them); how many.
fn pend_unplaced_events(store: &EmbeddedStore) -> MetaResult<usize> {
    let mut tx = store.begin()?;
    if tx.get::<Value>(FEED_PENDING_DONE)?.is_some() {
        return Ok(0);
    }
    let mut pended = 0;
    for key in tx.keys("events/", None, usize::MAX)? {
        if let Some(event) = tx.get::<EventRecord>(&key)?
            && event.feed.is_none()
            && events::pend(&mut tx, &event)?
        {
            pended += 1;
        }
    }
    tx.put(FEED_PENDING_DONE, &true)?;
    tx.commit(store)?;
    Ok(pended)
}
