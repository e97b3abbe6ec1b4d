//! A user's deletion in the embedded store (see [`DeletionRepo`]).

use async_trait::async_trait;

use super::{
    EmbeddedStore,
    events::{emit, events_of, purge_events, purged},
    files::delete_file_in,
    owner_index,
    txn::Txn,
    user_key,
    users::drop_token,
    webhooks::purge_dead_letters,
};
use crate::{
    meta::{
        DeletionRepo, EventDraft, EventRecord, IntentRecord, MetaResult, OrphanRecord,
        ResumableRecord, TokenRecord, UserRecord, now,
    },
    vocab::{ApiKeyHash, FileId, UserId},
};

/// The index of the users being deleted: `deleting/{id}`, so that a sweep
/// pass finds them without reading every user.
const DELETING: &str = "deleting/";

fn deleting_key(id: &UserId) -> String {
    format!("{DELETING}{id}")
}

/// Every document under `prefix` that `keep` accepts, at most `limit`.
fn scan<T: serde::de::DeserializeOwned>(
    tx: &mut Txn,
    prefix: &str,
    limit: usize,
    keep: impl Fn(&T) -> bool,
) -> MetaResult<Vec<(String, T)>> {
    let mut found = Vec::new();
    for k in tx.keys(prefix, None, usize::MAX)? {
        if found.len() >= limit {
            break;
        }
        if let Some(doc) = tx.get::<T>(&k)?
            && keep(&doc)
        {
            found.push((k, doc));
        }
    }
    Ok(found)
}

/// Deletes the user's keys and their tokens inside `tx`.
fn delete_credentials(tx: &mut Txn, id: UserId) -> MetaResult<()> {
    for k in tx.keys(&format!("user_keys/{id}/"), None, usize::MAX)? {
        if let Some(hash) = tx.get::<ApiKeyHash>(&k)? {
            tx.delete(&format!("keys/{}", hash.as_str()));
        }
        tx.delete(&k);
    }
    for (_, t) in scan::<TokenRecord>(tx, "tokens/", usize::MAX, |t| t.user_id == id)? {
        drop_token(tx, &t);
    }
    Ok(())
}

#[async_trait]
impl DeletionRepo for EmbeddedStore {
    async fn begin_user_deletion(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        let id = *id;
        self.transaction(move |tx| {
            let ukey = user_key(&id);
            let Some(mut user) = tx.get::<UserRecord>(&ukey)? else {
                return Ok(None);
            };
            // Marked before: nothing to write (a write would conflict
            // with the deletion's own steps, which write the user).
            if user.deleting_since.is_some() {
                return Ok(Some(user));
            }
            user.deleting_since = Some(now());
            // Told once, numbered after their last event; kept by the
            // purge of the rest.
            emit(tx, &mut user, vec![EventDraft::user_deleted(&id)])?;
            tx.put(&ukey, &user)?;
            tx.put(&deleting_key(&id), &id)?;
            delete_credentials(tx, id)?;
            Ok(Some(user))
        })
        .await
    }

    async fn users_being_deleted(&self, limit: usize) -> MetaResult<Vec<UserRecord>> {
        self.transaction(move |tx| {
            let mut users = Vec::new();
            for k in tx.keys(DELETING, None, limit)? {
                if let Some(id) = tx.get::<UserId>(&k)?
                    && let Some(u) = tx.get::<UserRecord>(&user_key(&id))?
                    && u.deleting_since.is_some()
                {
                    users.push(u);
                }
            }
            Ok(users)
        })
        .await
    }

    async fn user_resumables(&self, id: &UserId, limit: usize) -> MetaResult<Vec<ResumableRecord>> {
        let id = *id;
        self.transaction(move |tx| {
            let found = scan::<ResumableRecord>(tx, "resumables/", limit, |r| r.user_id == id)?;
            Ok(found.into_iter().map(|(_, r)| r).collect())
        })
        .await
    }

    async fn user_intents(&self, id: &UserId, limit: usize) -> MetaResult<Vec<IntentRecord>> {
        let id = *id;
        self.transaction(move |tx| {
            let found = scan::<IntentRecord>(tx, "intents/", limit, |i| i.user_id == id)?;
            Ok(found.into_iter().map(|(_, i)| i).collect())
        })
        .await
    }

    async fn purge_containers(&self, id: &UserId, limit: usize) -> MetaResult<usize> {
        let id = *id;
        self.transaction(move |tx| {
            let mut purged = 0;
            for collection in ["sessions", "agents"] {
                let index = owner_index(collection, id);
                for k in tx.keys(&index, None, limit)? {
                    tx.delete(&format!("{collection}/{}", &k[index.len()..]));
                    tx.delete(&k);
                    purged += 1;
                }
            }
            purged += purge_events(tx, &id, limit)?;
            purged += purge_dead_letters(tx, &id, limit)?;
            Ok(purged)
        })
        .await
    }

    async fn purge_files(&self, id: &UserId, limit: usize) -> MetaResult<Vec<OrphanRecord>> {
        let id = *id;
        self.transaction(move |tx| {
            let prefix = owner_index("files", id);
            let mut orphans = Vec::new();
            for k in tx.keys(&prefix, None, limit)? {
                let Some(file) = FileId::parse(&k[prefix.len()..]) else {
                    continue;
                };
                if let Some(deleted) = delete_file_in(tx, id, file, (None, false))? {
                    orphans.push(OrphanRecord {
                        id: deleted.orphan_id,
                        ..OrphanRecord::pending_for(&deleted.file)
                    });
                }
            }
            Ok(orphans)
        })
        .await
    }

    async fn finish_user_deletion(&self, id: &UserId) -> MetaResult<bool> {
        let id = *id;
        self.transaction(move |tx| {
            for collection in ["files", "sessions", "agents"] {
                if !tx.keys(&owner_index(collection, id), None, 1)?.is_empty() {
                    return Ok(false);
                }
            }
            for k in tx.keys(&events_of(&id), None, 2)? {
                if tx.get::<EventRecord>(&k)?.is_some_and(|e| purged(&e)) {
                    return Ok(false);
                }
            }
            if !scan::<IntentRecord>(tx, "intents/", 1, |i| i.user_id == id)?.is_empty()
                || !scan::<ResumableRecord>(tx, "resumables/", 1, |r| r.user_id == id)?.is_empty()
            {
                return Ok(false);
            }
            let ukey = user_key(&id);
            match tx.get::<UserRecord>(&ukey)? {
                Some(u) if u.deleting_since.is_some() => tx.delete(&ukey),
                _ => return Ok(false),
            }
            tx.delete(&deleting_key(&id));
            delete_credentials(tx, id)?;
            let of_user = format!("idempotency/{id}:");
            for k in tx.keys(&of_user, None, usize::MAX)? {
                tx.delete(&k);
            }
            // Their orphan records, whatever their status: every blob under
            // their prefixes is gone by now (the pass swept them first).
            let history = scan::<OrphanRecord>(tx, "orphans/", usize::MAX, |o| o.key.user() == id)?;
            for (k, _) in history {
                tx.delete(&k);
            }
            Ok(true)
        })
        .await
    }
}
