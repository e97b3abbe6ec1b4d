//! `MetadataStore` on MongoDB: one multi-document transaction per unit of
//! work. Errors are classified by code and label, never by message:
//! `WriteConflict` (112) and other `TransientTransactionError`s → retry the
//! whole transaction (the caller's policy; only 112 is named contention); `UnknownTransactionCommitResult` →
//! retry the commit here, then report [`MetaError::OutcomeUnknown`].
//!
//! `txn.rs` runs the transactions (sessions, fences, stranded and pinned
//! sessions); `users.rs`, `files.rs`, `cleanup.rs` and `containers.rs`
//! implement one repository each.

mod batch;
mod cleanup;
mod containers;
mod deletion;
mod errors;
mod events;
mod feed;
mod files;
mod migrate;
mod op_group;
mod resumable;
mod txn;
mod users;
mod webhooks;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use bson::{Bson, Document, doc};
use futures::TryStreamExt;
use mongodb::{
    ClientSession, Collection, Database, IndexModel,
    event::{EventHandler, cmap::CmapEvent, command::CommandEvent},
    options::{ClientOptions, CollectionOptions, IndexOptions, ReadConcern},
};
use prometheus_client::metrics::counter::Counter;

pub use self::errors::classify;
use self::txn::Sessions;
use crate::{
    meta::{
        AgentRecord, ApiKeyRecord, FileRecord, IdempotencyRecord, IntentRecord, MetaResult,
        MetadataStore, OrphanRecord, PermissionRecord, ProcessedOp, ResumableRecord, SessionRecord,
        TokenRecord, UserRecord,
    },
    vocab::{
        AgentId, ApiKeyHash, BlobKey, FileId, KeyId, LinkId, OpId, OrphanId, SessionId, UserId,
    },
};

/// Ids, keys and hashes in a filter or an update (`doc!`): as the strings
/// their records are written as.
macro_rules! as_bson_string {
    ($($t:ty),*) => {$(
        impl From<$t> for Bson {
            fn from(v: $t) -> Self {
                Bson::String(v.to_string())
            }
        }
    )*};
}

as_bson_string!(
    UserId, FileId, SessionId, AgentId, OrphanId, OpId, BlobKey, KeyId
);

impl From<LinkId> for Bson {
    fn from(v: LinkId) -> Self {
        Bson::String(v.as_str().to_owned())
    }
}

impl From<ApiKeyHash> for Bson {
    fn from(v: ApiKeyHash) -> Self {
        Bson::String(v.as_str().to_owned())
    }
}

#[derive(Clone)]
pub struct MongoStore {
    db: Database,
    /// Where transactions begin and end (`txn.rs`).
    txns: Sessions,
    /// Whether a transaction's writes go in one `bulkWrite` (`batch.rs`):
    /// MongoDB 8.0 or later, unless turned off.
    bulk_write: Arc<AtomicBool>,
}

type Res<T> = Result<T, mongodb::error::Error>;

/// Every document matching `filter`, sorted, at most `limit`.
async fn find_sorted<T>(
    coll: Collection<T>,
    filter: Document,
    sort: Document,
    limit: usize,
) -> MetaResult<Vec<T>>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    coll.find(filter)
        .sort(sort)
        .limit(i64::try_from(limit).unwrap_or(i64::MAX))
        .await
        .map_err(classify)?
        .try_collect()
        .await
        .map_err(classify)
}

/// [`find_sorted`] in session `s` (a snapshot's, say).
async fn find_sorted_in<T>(
    s: &mut ClientSession,
    coll: Collection<T>,
    filter: Document,
    sort: Document,
    limit: usize,
) -> MetaResult<Vec<T>>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    let mut found = coll
        .find(filter)
        .sort(sort)
        .limit(i64::try_from(limit).unwrap_or(i64::MAX))
        .session(&mut *s)
        .await
        .map_err(classify)?;
    let mut out = Vec::new();
    while let Some(doc) = found.next(s).await {
        out.push(doc.map_err(classify)?);
    }
    Ok(out)
}

impl MongoStore {
    /// A session whose reads all see one snapshot of what a majority
    /// holds (`readConcern: snapshot`): a transaction, distributed over
    /// shards or not, is seen whole or not at all.
    async fn snapshot(&self) -> MetaResult<ClientSession> {
        self.db
            .client()
            .start_session()
            .snapshot(true)
            .await
            .map_err(classify)
    }

    /// Collection `name` for reads in a [`Self::snapshot`] session: its
    /// read concern says `snapshot` whatever the URI's says (the driver
    /// keeps a level it inherits and only adds the point in time).
    fn in_snapshot<T: Send + Sync>(&self, name: &str) -> Collection<T> {
        let snapshot = CollectionOptions::builder()
            .read_concern(ReadConcern::snapshot())
            .build();
        self.db.collection_with_options(name, snapshot)
    }
}

/// The filter of a page of an owner's documents: theirs, after the cursor.
fn owned_after(owner_id: &UserId, after: Option<impl Into<Bson>>) -> Document {
    let mut filter = doc! {"owner_id": owner_id};
    if let Some(a) = after {
        filter.insert("_id", doc! {"$gt": a});
    }
    filter
}

/// A command as the driver sent it (see [`MongoStore::connect_observed`]).
#[derive(Clone, Debug)]
pub struct SentCommand {
    /// `find`, `update`, `findAndModify`, …
    pub name: String,
    /// The command document, with the documents of its batches (an
    /// insert's `documents`, an update's `updates`) in it.
    pub body: Document,
}

impl SentCommand {
    /// The collection it names, if any (a command's first field names it).
    pub fn collection(&self) -> Option<&str> {
        self.body.get_str(&self.name).ok()
    }
}

/// Told of every command sent (tests: which filters the requests send).
pub type CommandObserver = Arc<dyn Fn(SentCommand) + Send + Sync>;

impl MongoStore {
    /// Connects, checks the server answers, and creates the indexes;
    /// `commands` counts every command sent (round trips, for the benchmarks).
    pub async fn connect(uri: &str, db: &str, commands: Counter) -> anyhow::Result<Self> {
        Self::open(uri, db, commands, None).await
    }

    /// [`Self::connect`], and `observer` is told of every command sent
    /// (tests read the filters; the product never sets one).
    pub async fn connect_observed(
        uri: &str,
        db: &str,
        commands: Counter,
        observer: CommandObserver,
    ) -> anyhow::Result<Self> {
        Self::open(uri, db, commands, Some(observer)).await
    }

    async fn open(
        uri: &str,
        db: &str,
        commands: Counter,
        observer: Option<CommandObserver>,
    ) -> anyhow::Result<Self> {
        let mut opts = ClientOptions::parse(uri).await?;
        opts.app_name = Some("filedock".into());
        // A command event costs the driver a copy and a parse of the command
        // and of its reply (about a tenth of filedock's CPU per small
        // upload, BENCHMARKS 13): the command events are listened to only
        // for an observer or RUST_LOG=filedock::mongo=trace. Otherwise a
        // command is counted as the connection checked out to send it
        // (each command, retries and cursors' getMore included, checks one
        // out; a connection's handshake is not a command in either count).
        let traced = tracing::enabled!(target: "filedock::mongo", tracing::Level::TRACE);
        if observer.is_some() || traced {
            opts.command_event_handler = Some(EventHandler::callback(move |e| {
                if let CommandEvent::Started(started) = e {
                    commands.inc();
                    // Each round trip, by name and collection.
                    tracing::trace!(
                        target: "filedock::mongo",
                        command = %started.command_name,
                        collection = started.command.get_str(&started.command_name).ok(),
                        "mongo command"
                    );
                    // The event is ours: its document moves, it is not copied.
                    if let Some(observe) = &observer {
                        observe(SentCommand {
                            name: started.command_name,
                            body: started.command,
                        });
                    }
                }
            }));
        } else {
            opts.cmap_event_handler = Some(EventHandler::callback(move |e| {
                if let CmapEvent::ConnectionCheckedOut(_) = e {
                    commands.inc();
                }
            }));
        }
        // Fail fast when the server is gone: requests answer 503, not hang.
        opts.server_selection_timeout
            .get_or_insert(Duration::from_secs(5));
        opts.connect_timeout.get_or_insert(Duration::from_secs(3));
        let client = mongodb::Client::with_options(opts)?;
        let db = client.database(db);
        let store = Self {
            txns: Sessions::new(client, db.clone()),
            db,
            bulk_write: Arc::new(AtomicBool::new(false)),
        };
        // A page of events is read in one snapshot: MongoDB 5.0 or later
        // (wire version 13).
        // (`isMaster` where `hello` is unknown: older servers, refused below.)
        let hello = match store.db.run_command(doc! {"hello": 1}).await {
            Ok(hello) => hello,
            Err(_) => store.db.run_command(doc! {"isMaster": 1}).await?,
        };
        let wire = match hello.get("maxWireVersion") {
            Some(Bson::Int32(v)) => i64::from(*v),
            Some(Bson::Int64(v)) => *v,
            Some(Bson::Double(v)) => *v as i64,
            _ => 0,
        };
        anyhow::ensure!(
            wire >= 13,
            "MongoDB 5.0 or later is required (events are read in snapshots); the server's wire version is {wire}"
        );
        // `bulkWrite`: MongoDB 8.0 or later (wire version 25), with its
        // features on.
        let bulk = wire >= 25 && store.takes_bulk_write().await;
        store.bulk_write.store(bulk, Ordering::Relaxed);
        store.create_indexes().await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Sends a transaction's writes a command per collection, as before
    /// MongoDB 8.0, even to a server that takes them in one `bulkWrite`
    /// (`FILEDOCK_MONGODB_BULK_WRITE=false`).
    pub fn without_bulk_write(self) -> Self {
        self.bulk_write.store(false, Ordering::Relaxed);
        self
    }

    async fn create_indexes(&self) -> Res<()> {
        let index = |keys: Document, unique: bool| {
            IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().unique(unique).build())
                .build()
        };
        // Keys live in `api_keys` now; the users' old unique index on a
        // field no new user has would refuse every user after the first.
        let _ = self.users().drop_index("api_key_hash_1").await;
        self.keys()
            .create_index(index(doc! {"hash": 1}, true))
            .await?;
        self.keys()
            .create_index(index(doc! {"user_id": 1, "_id": 1}, false))
            .await?;
        self.tokens()
            .create_index(index(doc! {"hash": 1}, true))
            .await?;
        self.tokens()
            .create_index(index(doc! {"key_id": 1}, false))
            .await?;
        self.tokens()
            .create_index(index(doc! {"expires_at": 1}, false))
            .await?;
        self.revoked_keys()
            .create_index(index(doc! {"at": 1}, false))
            .await?;
        // A user's deletion finds their open uploads and tokens by these;
        // a mint counts the user's live tokens by the second.
        self.resumables()
            .create_index(index(doc! {"user_id": 1, "_id": 1}, false))
            .await?;
        self.tokens()
            .create_index(index(doc! {"user_id": 1, "expires_at": 1}, false))
            .await?;
        // A sweep pass finds the users being deleted by it.
        self.users()
            .create_index(index(doc! {"deleting_since": 1}, false))
            .await?;
        self.files()
            .create_index(index(doc! {"owner_id": 1, "_id": 1}, false))
            .await?;
        // An owner's events are read in sequence order; a number is
        // never given twice.
        self.events()
            .create_index(index(doc! {"owner_id": 1, "seq": 1}, true))
            .await?;
        // The feed's sequencing finds the events not placed yet (each
        // owner's in order), and the admin's reader reads it in order.
        self.events()
            .create_index(index(doc! {"feed": 1, "owner_id": 1, "seq": 1}, false))
            .await?;
        // The sweeper removes the oldest first (FILEDOCK_EVENT_RETENTION_SECS).
        self.events()
            .create_index(index(doc! {"time": 1}, false))
            .await?;
        // A user's deletion and the events' retention remove the dead
        // letters of their events by these.
        self.dead()
            .create_index(index(doc! {"event.owner_id": 1}, false))
            .await?;
        self.dead()
            .create_index(index(doc! {"event.time": 1}, false))
            .await?;
        self.permissions()
            .create_index(index(doc! {"file_id": 1, "user_id": 1}, true))
            .await?;
        self.intents()
            .create_index(index(doc! {"created_at": 1}, false))
            .await?;
        // The stale-intent scan reads past no open resumable upload.
        self.intents()
            .create_index(index(doc! {"alive_until": 1, "created_at": 1}, false))
            .await?;
        self.orphans()
            .create_index(index(doc! {"status": 1, "created_at": 1}, false))
            .await?;
        // Reconcile asks whether a stray is on the sweeper's list.
        self.orphans()
            .create_index(index(doc! {"key": 1, "status": 1}, false))
            .await?;
        self.idempotency()
            .create_index(index(doc! {"created_at": 1}, false))
            .await?;
        // A file's delete frees the key that created it.
        self.idempotency()
            .create_index(index(doc! {"file._id": 1}, false))
            .await?;
        // Lists page through an owner's documents in id order.
        self.sessions()
            .create_index(index(doc! {"owner_id": 1, "_id": 1}, false))
            .await?;
        // Operation ids only need to outlive redelivery: a week is plenty.
        let expire = IndexOptions::builder()
            .expire_after(Duration::from_secs(7 * 24 * 3600))
            .build();
        self.db
            .collection::<ProcessedOp>("processed_ops")
            .create_index(
                IndexModel::builder()
                    .keys(doc! {"created_at": 1})
                    .options(expire)
                    .build(),
            )
            .await?;
        self.agents()
            .create_index(index(doc! {"owner_id": 1, "_id": 1}, false))
            .await?;
        self.resumables()
            .create_index(index(doc! {"expires_at": 1}, false))
            .await?;
        Ok(())
    }

    fn users(&self) -> Collection<UserRecord> {
        self.db.collection("users")
    }

    fn keys(&self) -> Collection<ApiKeyRecord> {
        self.db.collection("api_keys")
    }

    fn tokens(&self) -> Collection<TokenRecord> {
        self.db.collection("api_tokens")
    }

    /// `revoked_keys {_id: key id, at}`: the ids of keys revoked within
    /// [`crate::meta::REVOKED_KEPT`], so that the resend of a key's insert
    /// whose answer was lost cannot bring back a key revoked meanwhile.
    fn revoked_keys(&self) -> Collection<Document> {
        self.db.collection("revoked_keys")
    }

    fn files(&self) -> Collection<FileRecord> {
        self.db.collection("files")
    }

    fn permissions(&self) -> Collection<PermissionRecord> {
        self.db.collection("permissions")
    }

    fn intents(&self) -> Collection<IntentRecord> {
        self.db.collection("upload_intents")
    }

    fn orphans(&self) -> Collection<OrphanRecord> {
        self.db.collection("orphan_minio_objects")
    }

    fn idempotency(&self) -> Collection<IdempotencyRecord> {
        self.db.collection("idempotency")
    }

    fn sessions(&self) -> Collection<SessionRecord> {
        self.db.collection("sessions")
    }

    fn agents(&self) -> Collection<AgentRecord> {
        self.db.collection("agents")
    }

    fn resumables(&self) -> Collection<ResumableRecord> {
        self.db.collection("resumable_uploads")
    }
}

#[async_trait]
impl MetadataStore for MongoStore {
    async fn ping(&self) -> MetaResult<()> {
        self.db
            .run_command(doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(classify)
    }
}
