//! Start-up migrations on MongoDB: each rewrites documents of an older shape
//! and finds none on the current one, so it runs at every start. Users of
//! the shape before issue 22 carried a `file_ids` array; before issue 25
//! their one key's hash in `users.api_key_hash`.

use bson::{Document, doc};
use futures::TryStreamExt;

use super::{
    MongoStore, Res,
    errors::classify,
    feed::{LAYOUT, Pending, Place},
};
use crate::{
    meta::{
        ApiKeyRecord, FEED_STATE, FIRST_KEY_NAME, MetaError, MetaResult,
        retry::{TxnRetryPolicy, with_txn_retry},
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

/// Where a user of the old shape kept their one key's hash.
const LEGACY_KEY_FIELD: &str = "api_key_hash";

impl MongoStore {
    /// Runs every migration; what each changed is logged.
    pub(super) async fn migrate(&self) -> MetaResult<()> {
        let users = self.count_user_files().await.map_err(classify)?;
        if users > 0 {
            tracing::info!(users, "migrated users' file_ids arrays to file_count");
        }
        let moved = self.migrate_single_keys().await?;
        if moved > 0 {
            tracing::info!(moved, "moved users' single keys into api keys");
        }
        let events = self.migrate_feed().await?;
        if events > 0 {
            tracing::info!(events, "moved the feed's places out of the events");
        }
        Ok(())
    }

    /// Replaces a user's `file_ids` array (the shape before issue 22) with
    /// `file_count`, counted from the `files` collection (the truth, even
    /// for a document an older instance wrote both fields to); returns how
    /// many users it rewrote. Each user is rewritten only while it still has
    /// the array, so a second run, or two instances starting together, count
    /// no user twice. Instances of the older shape must be stopped first: one
    /// still committing would push to the array after its count.
    async fn count_user_files(&self) -> Res<usize> {
        let users = self.db.collection::<Document>("users");
        let mut old = users
            .find(doc! {"file_ids": {"$exists": true}})
            .projection(doc! {"_id": 1})
            .await?;
        let mut rewritten = 0;
        while let Some(user) = old.try_next().await? {
            let Some(id) = user.get("_id").cloned() else {
                continue;
            };
            let count = self
                .db
                .collection::<Document>("files")
                .count_documents(doc! {"owner_id": &id})
                .await? as i64;
            let done = users
                .update_one(
                    doc! {"_id": id, "file_ids": {"$exists": true}},
                    doc! {"$set": {"file_count": count}, "$unset": {"file_ids": ""}},
                )
                .await?;
            rewritten += done.modified_count as usize;
        }
        Ok(rewritten)
    }

    /// Moves every user's key of the old shape into `api_keys`, named
    /// [`FIRST_KEY_NAME`] and dated as its user; how many. Each move is one
    /// transaction that unsets the field it moves, so a start after a crash
    /// and instances starting at once move each key exactly once.
    async fn migrate_single_keys(&self) -> MetaResult<usize> {
        let legacy: Vec<Document> = self
            .db
            .collection::<Document>("users")
            .find(doc! {LEGACY_KEY_FIELD: {"$exists": true}})
            .projection(doc! {LEGACY_KEY_FIELD: 1, "created_at": 1})
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)?;
        let mut moved = 0;
        for user in legacy {
            let (Ok(Ok(user_id)), Ok(hash)) = (
                user.get_str("_id").map(str::parse::<UserId>),
                user.get_str(LEGACY_KEY_FIELD),
            ) else {
                continue;
            };
            let key = ApiKeyRecord {
                id: KeyId::new(),
                user_id,
                name: FIRST_KEY_NAME.into(),
                hash: ApiKeyHash::from_hex(hash.to_string()),
                created_at: user
                    .get_datetime("created_at")
                    .map_or_else(|_| crate::meta::now(), |t| t.to_chrono()),
            };
            let policy = TxnRetryPolicy::default();
            if with_txn_retry(&policy, || self.move_single_key(&key))
                .await?
                .value
            {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// Moves one key, unless another start moved it first (`false`).
    async fn move_single_key(&self, key: &ApiKeyRecord) -> MetaResult<bool> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let unset = self
                .users()
                .update_one(
                    doc! {"_id": &key.user_id, LEGACY_KEY_FIELD: &key.hash},
                    doc! {"$unset": {LEGACY_KEY_FIELD: ""}},
                )
                .session(&mut s)
                .await
                .map_err(classify)?;
            if unset.matched_count == 0 {
                return Ok(false);
            }
            self.keys()
                .insert_one(key)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(true)
        }
        .await;
        self.txns.finish(s, None, result).await
    }
}

/// An event as the feed's first layout kept it: its place in it, if any.
#[derive(serde::Deserialize)]
struct PlacedIn {
    #[serde(rename = "_id")]
    id: String,
    owner_id: UserId,
    seq: i64,
    feed: Option<i64>,
}

/// How many places or marks one insert writes.
const FEED_BATCH: usize = 500;

impl MongoStore {
    /// The feed's first layout kept an event's place in the event
    /// (`feed`, unset until placed); now a place is a `feed` document and
    /// an event waiting for one has a `feed_pending` mark (feed.rs). Moves
    /// a store over once (the `event_feed` document's `layout`, which a
    /// new store gets at its first start): a place for each placed event,
    /// a mark for each other. Nothing places before it is done (the
    /// sequencer requires the layout), so no mark is made for an event
    /// placed meanwhile; after a crash it runs again and writes the same
    /// (places by position, marks by event id). Instances of the older
    /// version must be stopped first. How many events it moved.
    async fn migrate_feed(&self) -> MetaResult<usize> {
        let state = (self.db.collection::<Document>(FEED_STATE))
            .find_one(doc! {"_id": FEED_STATE})
            .await
            .map_err(classify)?;
        if state.is_some_and(|s| s.get_i32("layout") == Ok(LAYOUT)) {
            return Ok(0);
        }
        let mut old = (self.db.collection::<PlacedIn>("events"))
            .find(doc! {})
            .projection(doc! {"_id": 1, "owner_id": 1, "seq": 1, "feed": 1})
            .await
            .map_err(classify)?;
        let (mut places, mut pending, mut moved) = (Vec::new(), Vec::new(), 0);
        while let Some(event) = old.try_next().await.map_err(classify)? {
            moved += 1;
            match event.feed {
                Some(place) => places.push(Place {
                    place,
                    event: event.id,
                }),
                None => pending.push(Pending::of(event.id, event.owner_id, event.seq)),
            }
            if places.len() + pending.len() >= FEED_BATCH {
                self.write_moved(&mut places, &mut pending).await?;
            }
        }
        self.write_moved(&mut places, &mut pending).await?;
        (self.db.collection::<Document>(FEED_STATE))
            .update_one(doc! {"_id": FEED_STATE}, doc! {"$set": {"layout": LAYOUT}})
            .upsert(true)
            .await
            .map_err(classify)?;
        // The first layout's indexes: each cost every insert of an event.
        for index in ["feed_1_owner_id_1_seq_1", "time_1"] {
            let _ = self.events().drop_index(index).await;
        }
        Ok(moved)
    }

    /// Writes (and empties) `places` and `pending`; one already written (a
    /// run before that crashed) is left as it is.
    async fn write_moved(
        &self,
        places: &mut Vec<Place>,
        pending: &mut Vec<Pending>,
    ) -> MetaResult<()> {
        fn written(
            r: Result<mongodb::results::InsertManyResult, mongodb::error::Error>,
        ) -> MetaResult<()> {
            match r.map_err(classify) {
                Ok(_) | Err(MetaError::Duplicate) => Ok(()),
                Err(e) => Err(e),
            }
        }
        if !places.is_empty() {
            written(
                self.places()
                    .insert_many(places.drain(..))
                    .ordered(false)
                    .await,
            )?;
        }
        if !pending.is_empty() {
            written(
                self.pending()
                    .insert_many(pending.drain(..))
                    .ordered(false)
                    .await,
            )?;
        }
        Ok(())
    }
}
