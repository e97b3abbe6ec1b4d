//! `MetadataStore` on MongoDB: one multi-document transaction per unit of
//! work. Errors are classified by code and label, never by message:
//! `WriteConflict` (112) and other `TransientTransactionError`s → retry the
//! whole transaction (the caller's policy; only 112 is named contention); `UnknownTransactionCommitResult` →
//! retry the commit here, then report [`MetaError::OutcomeUnknown`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use bson::{Document, bson, doc};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use mongodb::{
    Client, ClientSession, Collection, Database, IndexModel,
    error::{
        ErrorKind, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT, WriteFailure,
    },
    options::{ClientOptions, IndexOptions},
};

use super::*;

const WRITE_CONFLICT: i32 = 112;
const DUPLICATE_KEY: i32 = 11000;
/// Attempts at `commitTransaction` when its result is unknown.
const COMMIT_ATTEMPTS: u32 = 3;

#[derive(Clone)]
pub struct MongoStore {
    client: Client,
    db: Database,
    pinned: Arc<Mutex<Pinned>>,
    /// Sessions whose transaction may still be open on the server: it failed
    /// over a broken link, so its abort may never have arrived. Left alone,
    /// it holds the documents it wrote (a user's, an intent) until the server
    /// reaps it (60 s by default), and every writer to them meets a write
    /// conflict meanwhile; the next transaction ends them first.
    stranded: Arc<Mutex<Vec<Document>>>,
}

/// Sessions of pinned fence slots (see [`Fence::pinned`]): one per slot,
/// reused by every transaction under it, and the token under which this
/// process last recorded the session as the slot's holder in `txn_holders`.
#[derive(Default)]
struct Pinned {
    idle: HashMap<String, ClientSession>,
    recorded: HashMap<String, (Document, i64)>,
}

/// Who last ran transactions under a pinned fence slot.
#[derive(Debug, Serialize, Deserialize)]
struct TxnHolder {
    #[serde(rename = "_id")]
    slot: String,
    lsid: Document,
    token: i64,
}

/// The server's error code, wherever the driver put it.
fn code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

/// Whether the error means the server could not be reached.
fn is_unreachable(e: &mongodb::error::Error) -> bool {
    matches!(
        e.kind.as_ref(),
        ErrorKind::ServerSelection { .. }
            | ErrorKind::Io(_)
            | ErrorKind::ConnectionPoolCleared { .. }
            | ErrorKind::DnsResolve { .. }
            | ErrorKind::Shutdown
    )
}

/// Maps a driver error to the store's error kinds.
pub fn classify(e: mongodb::error::Error) -> MetaError {
    if is_unreachable(&e) {
        return MetaError::Unavailable(e.to_string());
    }
    match code(&e) {
        Some(WRITE_CONFLICT) => MetaError::WriteConflict,
        Some(DUPLICATE_KEY) => MetaError::Duplicate,
        _ if e.contains_label(TRANSIENT_TRANSACTION_ERROR) => MetaError::Transient(e.to_string()),
        _ => MetaError::Other(e.to_string()),
    }
}

/// Maps an error of `commitTransaction`. A transient error means the
/// server aborted the transaction (retry it whole); an unknown result, or a
/// link that failed after the command was sent, means it may have committed.
fn classify_commit(e: mongodb::error::Error) -> MetaError {
    if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return classify(e);
    }
    if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) || is_unreachable(&e) {
        return MetaError::OutcomeUnknown(e.to_string());
    }
    classify(e)
}

/// Intents whose upload was last alive before `t` (see [`IntentRecord::alive_at`]).
fn last_alive_before(t: DateTime<Utc>) -> Document {
    let t = bson::DateTime::from_chrono(t);
    doc! {"$or": [
        {"refreshed_at": {"$lt": t}},
        {"refreshed_at": null, "created_at": {"$lt": t}},
    ]}
}

/// Whether the transaction failed over a broken link (so it may still be
/// open on the server, or even committed).
fn link_failed(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::Unavailable(_) | MetaError::Transient(_) | MetaError::OutcomeUnknown(_)
    )
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

/// Connects and disconnects of one agent's list in a row, each link once.
/// One `$pullAll` and one `$addToSet` with `$each` leave the list exactly as
/// applying them one by one would: new links are appended in order, present
/// ones stay where they are. A link seen again starts a new run (removing
/// and re-adding it moves it to the end, which one update cannot express).
struct LinkRun<'a> {
    owner_id: &'a str,
    agent_id: &'a str,
    kind: LinkKind,
    add: Vec<&'a str>,
    remove: Vec<&'a str>,
}

enum GroupStep<'a> {
    Links(LinkRun<'a>),
    One(&'a Operation),
}

/// A group's operations, in order, with runs of link changes merged: a
/// burst on one agent costs a few statements instead of one per operation.
fn plan_group(ops: &[(Operation, String)]) -> Vec<GroupStep<'_>> {
    let mut steps: Vec<GroupStep<'_>> = Vec::new();
    for (op, _) in ops {
        let Operation::Link {
            owner_id,
            agent_id,
            kind,
            link_id,
            connected,
        } = op
        else {
            steps.push(GroupStep::One(op));
            continue;
        };
        let link = link_id.as_str();
        let extends = matches!(steps.last(), Some(GroupStep::Links(run))
            if run.agent_id == agent_id
                && run.owner_id == owner_id
                && run.kind == *kind
                && !run.add.contains(&link)
                && !run.remove.contains(&link));
        if !extends {
            steps.push(GroupStep::Links(LinkRun {
                owner_id,
                agent_id,
                kind: *kind,
                add: Vec::new(),
                remove: Vec::new(),
            }));
        }
        if let Some(GroupStep::Links(run)) = steps.last_mut() {
            match connected {
                true => run.add.push(link),
                false => run.remove.push(link),
            }
        }
    }
    steps
}

/// Adds a fencing condition (stored token below ours, or none yet) to
/// `filter`, and stores our token with `update`.
fn add_fence(filter: &mut Document, update: &mut Document, map: &str, fence: Option<&Fence>) {
    if let Some(f) = fence {
        let field = format!("{map}.{}", f.slot);
        filter.insert(
            "$or",
            vec![
                doc! {&field: {"$lte": f.token}},
                doc! {&field: {"$exists": false}},
            ],
        );
        if !update.contains_key("$set") {
            update.insert("$set", Document::new());
        }
        if let Ok(set) = update.get_document_mut("$set") {
            set.insert(field, f.token);
        }
    }
}

impl MongoStore {
    /// Connects, checks the server answers, and creates the indexes.
    pub async fn connect(uri: &str, db: &str) -> anyhow::Result<Self> {
        let mut opts = ClientOptions::parse(uri).await?;
        opts.app_name = Some("filedock".into());
        // Fail fast when the server is gone: requests answer 503, not hang.
        opts.server_selection_timeout
            .get_or_insert(Duration::from_secs(5));
        opts.connect_timeout.get_or_insert(Duration::from_secs(3));
        let client = Client::with_options(opts)?;
        let store = Self {
            db: client.database(db),
            client,
            pinned: Arc::default(),
            stranded: Arc::default(),
        };
        store.db.run_command(doc! {"ping": 1}).await?;
        store.create_indexes().await?;
        Ok(store)
    }

    async fn create_indexes(&self) -> Res<()> {
        let index = |keys: Document, unique: bool| {
            IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().unique(unique).build())
                .build()
        };
        self.users()
            .create_index(index(doc! {"api_key_hash": 1}, true))
            .await?;
        self.files()
            .create_index(index(doc! {"owner_id": 1, "_id": 1}, false))
            .await?;
        self.permissions()
            .create_index(index(doc! {"file_id": 1, "user_id": 1}, true))
            .await?;
        self.intents()
            .create_index(index(doc! {"created_at": 1}, false))
            .await?;
        self.orphans()
            .create_index(index(doc! {"status": 1, "created_at": 1}, false))
            .await?;
        self.idempotency()
            .create_index(index(doc! {"created_at": 1}, false))
            .await?;
        self.sessions()
            .create_index(index(doc! {"owner_id": 1}, false))
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
            .create_index(index(doc! {"owner_id": 1}, false))
            .await?;
        Ok(())
    }

    fn users(&self) -> Collection<UserRecord> {
        self.db.collection("users")
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

    /// Starts a transaction; under a pinned fence, on the slot's session.
    async fn begin(&self, fence: Option<&Fence>) -> MetaResult<ClientSession> {
        self.end_stranded().await;
        let pinned = fence.filter(|f| f.pinned);
        let idle = pinned.and_then(|f| self.pinned.lock().unwrap().idle.remove(&f.slot));
        let mut s = match idle {
            Some(s) => s,
            None => self.client.start_session().await.map_err(classify)?,
        };
        if let Some(f) = pinned {
            self.take_slot(&s, f).await?;
        }
        s.start_transaction().await.map_err(classify)?;
        Ok(s)
    }

    /// Records `s` as the holder of `f`'s slot, once per token, and aborts
    /// what an earlier holder (a lower token, another session) may have left
    /// open: a process killed mid-transaction would otherwise block the
    /// documents it wrote until the server reaps the transaction (60 s by
    /// default), and every queued operation behind it would wait as long.
    async fn take_slot(&self, s: &ClientSession, f: &Fence) -> MetaResult<()> {
        let lsid = s.id().clone();
        let mine = (lsid.clone(), f.token);
        if self.pinned.lock().unwrap().recorded.get(&f.slot) == Some(&mine) {
            return Ok(());
        }
        let before = self
            .db
            .collection::<TxnHolder>("txn_holders")
            .find_one_and_update(
                doc! {"_id": &f.slot, "token": {"$lte": f.token}},
                doc! {"$set": {"lsid": &lsid, "token": f.token}},
            )
            .upsert(true)
            .await;
        match before.map_err(classify) {
            Ok(Some(earlier)) if earlier.lsid != lsid => {
                let kill = doc! {"killSessions": [&earlier.lsid]};
                match self.client.database("admin").run_command(kill).await {
                    Ok(_) => tracing::info!(
                        slot = f.slot,
                        earlier_token = earlier.token,
                        "aborted whatever the slot's earlier holder left open"
                    ),
                    Err(e) => tracing::warn!(
                        slot = f.slot,
                        error = %e,
                        "could not abort the slot's earlier holder's session"
                    ),
                }
            }
            Ok(_) => {}
            // A newer holder took the slot: our fence check will refuse us.
            Err(MetaError::Duplicate) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.pinned
            .lock()
            .unwrap()
            .recorded
            .insert(f.slot.clone(), mine);
        Ok(())
    }

    /// Ends (`killSessions`) the sessions a broken link may have left with
    /// an open transaction; keeps them for the next try if the server does
    /// not answer.
    async fn end_stranded(&self) {
        let lsids = std::mem::take(&mut *self.stranded.lock().unwrap());
        if lsids.is_empty() {
            return;
        }
        let kill = doc! {"killSessions": &lsids};
        match self.client.database("admin").run_command(kill).await {
            Ok(_) => tracing::info!(n = lsids.len(), "ended sessions a broken link left open"),
            Err(e) => {
                tracing::debug!(error = %e, "could not end stranded sessions yet");
                self.stranded.lock().unwrap().extend(lsids);
            }
        }
    }

    /// Ends the transaction by [`Self::end`]; a pinned slot's session goes
    /// back to its slot, unless a broken link stranded it.
    async fn finish<T>(
        &self,
        mut s: ClientSession,
        fence: Option<&Fence>,
        result: MetaResult<T>,
    ) -> MetaResult<T> {
        let outcome = self.end(&mut s, result).await;
        if let Err(e) = &outcome
            && link_failed(e)
        {
            self.stranded.lock().unwrap().push(s.id().clone());
            return outcome;
        }
        if let Some(f) = fence.filter(|f| f.pinned) {
            self.pinned.lock().unwrap().idle.insert(f.slot.clone(), s);
        }
        outcome
    }

    /// Commits when `result` is Ok (retrying a commit whose outcome is
    /// unknown), aborts otherwise.
    async fn end<T>(&self, s: &mut ClientSession, result: MetaResult<T>) -> MetaResult<T> {
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                // The driver ignores the abort's own errors: over a broken
                // link it may not arrive (see `stranded`).
                let _ = s.abort_transaction().await;
                return Err(e);
            }
        };
        crate::crash_point("before_txn_commit");
        let mut attempt = 1;
        loop {
            match s.commit_transaction().await {
                Ok(()) => return Ok(value),
                Err(e)
                    if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                        && attempt < COMMIT_ATTEMPTS =>
                {
                    attempt += 1;
                    tracing::debug!(attempt, "commit result unknown; retrying the commit");
                }
                Err(e) => return Err(classify_commit(e)),
            }
        }
    }

    async fn commit_upload_in(
        &self,
        s: &mut ClientSession,
        c: &CommitUpload,
    ) -> MetaResult<CommitOutcome> {
        let file = &c.file;
        if let Some(key) = &c.idempotency_key {
            let id = IdempotencyRecord::id_for(&file.owner_id, key);
            if let Some(first) = self
                .idempotency()
                .find_one(doc! {"_id": &id})
                .session(&mut *s)
                .await
                .map_err(classify)?
            {
                return Ok(CommitOutcome::Replayed(Box::new(first.file)));
            }
            let record = IdempotencyRecord {
                id,
                file: file.clone(),
                created_at: crate::meta::now(),
            };
            self.idempotency()
                .insert_one(&record)
                .session(&mut *s)
                .await
                .map_err(classify)?;
        }
        let mut filter = doc! {"_id": &file.owner_id};
        if let Some(quota) = c.quota_bytes {
            filter.insert("used_bytes", doc! {"$lte": quota as i64 - file.size});
        }
        let mut update = doc! {"$push": {"file_ids": &file.id}, "$inc": {"used_bytes": file.size}};
        add_fence(&mut filter, &mut update, "upload_fence", c.fence.as_ref());
        let updated = self
            .users()
            .update_one(filter, update)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 0 {
            return Err(self
                .why_user_unmatched(s, &file.owner_id, c.fence.as_ref())
                .await);
        }
        self.files()
            .insert_one(file)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let perm = PermissionRecord {
            id: format!("{}:{}", file.id, file.owner_id),
            file_id: file.id.clone(),
            user_id: file.owner_id.clone(),
            role: "owner".into(),
        };
        self.permissions()
            .insert_one(&perm)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let removed = self
            .intents()
            .delete_one(doc! {"_id": &file.id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if removed.deleted_count == 0 {
            return Err(MetaError::IntentGone);
        }
        Ok(CommitOutcome::Committed)
    }

    fn sessions(&self) -> Collection<SessionRecord> {
        self.db.collection("sessions")
    }
    fn agents(&self) -> Collection<AgentRecord> {
        self.db.collection("agents")
    }

    /// Records a queued operation's id; `AlreadyApplied` if it was seen before.
    async fn record_op(&self, s: &mut ClientSession, op_id: Option<&str>) -> MetaResult<()> {
        let Some(id) = op_id else { return Ok(()) };
        let op = ProcessedOp {
            id: id.to_owned(),
            created_at: now(),
        };
        match self
            .db
            .collection::<ProcessedOp>("processed_ops")
            .insert_one(&op)
            .session(&mut *s)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(e) {
                MetaError::Duplicate => Err(MetaError::AlreadyApplied),
                e => Err(e),
            },
        }
    }

    /// Applies a container write in `s`, checking and storing `fence` on the
    /// container.
    async fn write_op(
        &self,
        s: &mut ClientSession,
        op: &Operation,
        fence: Option<&Fence>,
    ) -> MetaResult<()> {
        match op {
            Operation::Attach {
                owner_id,
                container,
                file_id,
                attached,
            } => {
                let (collection, cid) = (container.collection(), container.id());
                // The file's document is written too, so that a concurrent
                // delete of the file conflicts with this attach.
                if *attached {
                    let allowed = self
                        .permissions()
                        .find_one(doc! {"file_id": file_id, "user_id": owner_id})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                    let updated = self
                        .files()
                        .update_one(doc! {"_id": file_id}, doc! {"$addToSet": {collection: cid}})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                    if allowed.is_none() || updated.matched_count == 0 {
                        return Err(MetaError::NotFound);
                    }
                } else {
                    self.files()
                        .update_one(doc! {"_id": file_id}, doc! {"$pull": {collection: cid}})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                }
                let verb = if *attached { "$addToSet" } else { "$pull" };
                let mut filter = doc! {"_id": cid, "owner_id": owner_id};
                let mut update = doc! {verb: {"file_ids": file_id}};
                add_fence(&mut filter, &mut update, "fence", fence);
                self.update_owned(s, collection, filter, update, owner_id, cid)
                    .await
            }
            Operation::Link {
                owner_id,
                agent_id,
                kind,
                link_id,
                connected,
            } => {
                let verb = if *connected { "$addToSet" } else { "$pull" };
                let mut filter = doc! {"_id": agent_id, "owner_id": owner_id};
                let mut update = doc! {verb: {kind.field(): link_id}};
                add_fence(&mut filter, &mut update, "fence", fence);
                self.update_owned(s, "agents", filter, update, owner_id, agent_id)
                    .await
            }
        }
    }

    /// Applies a fenced update to an owned document; tells `NotFound` (not
    /// the owner's, or absent) from `StaleFence` when nothing matched.
    async fn update_owned(
        &self,
        s: &mut ClientSession,
        collection: &str,
        filter: Document,
        update: Document,
        owner_id: &str,
        id: &str,
    ) -> MetaResult<()> {
        let coll = self.db.collection::<Document>(collection);
        let updated = coll
            .update_one(filter, update)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 1 {
            return Ok(());
        }
        match coll
            .find_one(doc! {"_id": id, "owner_id": owner_id})
            .session(&mut *s)
            .await
        {
            Ok(Some(_)) => Err(MetaError::StaleFence),
            Ok(None) => Err(MetaError::NotFound),
            Err(e) => Err(classify(e)),
        }
    }

    /// Why a conditional update of the user document matched nothing.
    async fn why_user_unmatched(
        &self,
        s: &mut ClientSession,
        user_id: &str,
        fence: Option<&Fence>,
    ) -> MetaError {
        match self
            .users()
            .find_one(doc! {"_id": user_id})
            .session(&mut *s)
            .await
        {
            Ok(None) => MetaError::NotFound,
            Ok(Some(u)) => match fence {
                Some(f) if u.upload_fence.get(&f.slot).is_some_and(|t| *t > f.token) => {
                    MetaError::StaleFence
                }
                _ => MetaError::QuotaExceeded,
            },
            Err(e) => classify(e),
        }
    }

    async fn delete_file_in(
        &self,
        s: &mut ClientSession,
        owner: &str,
        id: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let Some(file) = self
            .files()
            .find_one(doc! {"_id": id, "owner_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        let mut filter = doc! {"_id": owner};
        let mut update = doc! {"$pull": {"file_ids": id}, "$inc": {"used_bytes": -file.size}};
        add_fence(&mut filter, &mut update, "upload_fence", fence);
        let updated = self
            .users()
            .update_one(filter, update)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 0 {
            return Err(self.why_user_unmatched(s, owner, fence).await);
        }
        for (collection, ids) in [("sessions", &file.sessions), ("agents", &file.agents)] {
            if !ids.is_empty() {
                self.db
                    .collection::<Document>(collection)
                    .update_many(doc! {"_id": {"$in": ids}}, doc! {"$pull": {"file_ids": id}})
                    .session(&mut *s)
                    .await
                    .map_err(classify)?;
            }
        }
        self.files()
            .delete_one(doc! {"_id": id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        self.permissions()
            .delete_many(doc! {"file_id": id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let orphan = OrphanRecord::pending_for(&file);
        self.orphans()
            .insert_one(&orphan)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(Some(DeletedFile {
            file,
            orphan_id: orphan.id,
        }))
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

    async fn insert_user(&self, user: &UserRecord) -> MetaResult<()> {
        self.users()
            .insert_one(user)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn user(&self, id: &str) -> MetaResult<Option<UserRecord>> {
        self.users()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn user_by_key_hash(&self, hash: &str) -> MetaResult<Option<UserRecord>> {
        // Authentication needs neither the file list nor its size on the wire.
        self.users()
            .find_one(doc! {"api_key_hash": hash})
            .projection(doc! {"file_ids": 0})
            .await
            .map_err(classify)
    }

    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        self.intents()
            .insert_one(intent)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn delete_intent(&self, file_id: &str) -> MetaResult<()> {
        self.intents()
            .delete_one(doc! {"_id": file_id})
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn intent(&self, file_id: &str) -> MetaResult<Option<IntentRecord>> {
        self.intents()
            .find_one(doc! {"_id": file_id})
            .await
            .map_err(classify)
    }

    async fn intents(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<Vec<IntentRecord>> {
        find_sorted(
            self.intents(),
            last_alive_before(before),
            doc! {"created_at": 1},
            limit,
        )
        .await
    }

    async fn touch_intent(&self, file_id: &str) -> MetaResult<bool> {
        let now = bson::DateTime::from_chrono(crate::meta::now());
        let touched = self
            .intents()
            .update_one(doc! {"_id": file_id}, doc! {"$set": {"refreshed_at": now}})
            .await
            .map_err(classify)?;
        Ok(touched.matched_count > 0)
    }

    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let mut s = self.begin(commit.fence.as_ref()).await?;
        let result = self.commit_upload_in(&mut s, commit).await;
        self.finish(s, commit.fence.as_ref(), result).await
    }

    async fn idempotent_file(&self, user_id: &str, key: &str) -> MetaResult<Option<FileRecord>> {
        let id = IdempotencyRecord::id_for(user_id, key);
        Ok(self
            .idempotency()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)?
            .map(|r| r.file))
    }

    async fn file(&self, owner_id: &str, file_id: &str) -> MetaResult<Option<FileRecord>> {
        self.files()
            .find_one(doc! {"_id": file_id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn list_files(
        &self,
        owner_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>> {
        let mut filter = doc! {"owner_id": owner_id};
        if let Some(a) = after {
            filter.insert("_id", doc! {"$gt": a});
        }
        find_sorted(self.files(), filter, doc! {"_id": 1}, limit).await
    }

    async fn delete_file(
        &self,
        owner_id: &str,
        file_id: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let mut s = self.begin(fence).await?;
        let result = self.delete_file_in(&mut s, owner_id, file_id, fence).await;
        self.finish(s, fence, result).await
    }

    async fn abandon_intent(
        &self,
        file_id: &str,
        stale_before: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<OrphanRecord>> {
        let mut filter = stale_before.map_or_else(Document::new, last_alive_before);
        filter.insert("_id", file_id);
        let mut s = self.begin(None).await?;
        let result = async {
            let Some(intent) = self
                .intents()
                .find_one_and_delete(filter)
                .session(&mut s)
                .await
                .map_err(classify)?
            else {
                return Ok(None);
            };
            let orphan = OrphanRecord::pending(
                &intent.bucket,
                &intent.key,
                Some("upload never committed".into()),
            );
            self.orphans()
                .insert_one(&orphan)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(Some(orphan))
        }
        .await;
        self.finish(s, None, result).await
    }

    async fn orphans_due(
        &self,
        max_retries: i32,
        retry_before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        let filter = doc! {
            "status": "pending",
            "retries": {"$lt": max_retries},
            "$or": [
                {"last_retry_at": null},
                {"last_retry_at": {"$lte": bson::DateTime::from_chrono(retry_before)}},
            ],
        };
        find_sorted(self.orphans(), filter, doc! {"created_at": 1}, limit).await
    }

    async fn all_files(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        let filter = match after {
            Some(a) => doc! {"_id": {"$gt": a}},
            None => doc! {},
        };
        find_sorted(self.files(), filter, doc! {"_id": 1}, limit).await
    }

    async fn counts(&self) -> MetaResult<MetaCounts> {
        let orphans = self.orphans();
        let count = |status: &'static str| orphans.count_documents(doc! {"status": status});
        Ok(MetaCounts {
            intents: self
                .intents()
                .count_documents(doc! {})
                .await
                .map_err(classify)?,
            orphans_pending: count("pending").await.map_err(classify)?,
            orphans_deleted: count("deleted").await.map_err(classify)?,
            orphans_failed: count("failed").await.map_err(classify)?,
        })
    }

    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()> {
        self.sessions()
            .insert_one(session)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn session(&self, owner_id: &str, id: &str) -> MetaResult<Option<SessionRecord>> {
        self.sessions()
            .find_one(doc! {"_id": id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()> {
        self.agents()
            .insert_one(agent)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn agent(&self, owner_id: &str, id: &str) -> MetaResult<Option<AgentRecord>> {
        self.agents()
            .find_one(doc! {"_id": id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&str>,
    ) -> MetaResult<()> {
        let mut s = self.begin(fence).await?;
        let result = async {
            self.record_op(&mut s, op_id).await?;
            self.write_op(&mut s, op, fence).await
        }
        .await;
        self.finish(s, fence, result).await
    }

    async fn apply_group(&self, ops: &[(Operation, String)], fence: &Fence) -> MetaResult<()> {
        let mut s = self.begin(Some(fence)).await?;
        let result = async {
            let records: Vec<ProcessedOp> = ops
                .iter()
                .map(|(_, id)| ProcessedOp {
                    id: id.clone(),
                    created_at: now(),
                })
                .collect();
            self.db
                .collection::<ProcessedOp>("processed_ops")
                .insert_many(records)
                .session(&mut s)
                .await
                .map_err(classify)?;
            for step in plan_group(ops) {
                match step {
                    GroupStep::One(op) => self.write_op(&mut s, op, Some(fence)).await?,
                    GroupStep::Links(run) => {
                        let field = run.kind.field();
                        let changes = [
                            ("$pullAll", bson!(&run.remove)),
                            ("$addToSet", bson!({"$each": &run.add})),
                        ];
                        for ((verb, value), ids) in changes.into_iter().zip([&run.remove, &run.add])
                        {
                            if ids.is_empty() {
                                continue;
                            }
                            let mut filter = doc! {"_id": run.agent_id, "owner_id": run.owner_id};
                            let mut update = doc! {verb: {field: value}};
                            add_fence(&mut filter, &mut update, "fence", Some(fence));
                            self.update_owned(
                                &mut s,
                                "agents",
                                filter,
                                update,
                                run.owner_id,
                                run.agent_id,
                            )
                            .await?;
                        }
                    }
                }
            }
            Ok(())
        }
        .await;
        self.finish(s, Some(fence), result).await
    }

    async fn record_orphan(&self, orphan: &OrphanRecord) -> MetaResult<()> {
        self.orphans()
            .insert_one(orphan)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn mark_orphan(
        &self,
        id: &str,
        status: OrphanStatus,
        error: Option<String>,
    ) -> MetaResult<()> {
        let mut orphan = self
            .orphans()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)?
            .ok_or(MetaError::NotFound)?;
        orphan.mark(status, error);
        self.orphans()
            .replace_one(doc! {"_id": id}, &orphan)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn orphans(
        &self,
        status: Option<OrphanStatus>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        let filter = match status {
            Some(st) => {
                doc! {"status": bson::to_bson(&st).map_err(|e| MetaError::Other(e.to_string()))?}
            }
            None => doc! {},
        };
        find_sorted(self.orphans(), filter, doc! {"created_at": 1}, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::commands::Container;

    fn link(agent: &str, kind: LinkKind, id: &str, connected: bool) -> (Operation, String) {
        let op = Operation::Link {
            owner_id: "u".into(),
            agent_id: agent.into(),
            kind,
            link_id: id.into(),
            connected,
        };
        (op, format!("op-{id}"))
    }

    /// A merged run: agent, list, added, removed.
    type Run<'a> = (&'a str, LinkKind, Vec<&'a str>, Vec<&'a str>);

    /// Each step as a run, or `None` for a single operation.
    fn shape(ops: &[(Operation, String)]) -> Vec<Option<Run<'_>>> {
        plan_group(ops)
            .into_iter()
            .map(|s| match s {
                GroupStep::Links(r) => Some((r.agent_id, r.kind, r.add, r.remove)),
                GroupStep::One(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_run_of_link_changes_merges_until_a_link_repeats_or_the_list_changes() {
        use LinkKind::{Mcp, Toolset};
        let attach = Operation::Attach {
            owner_id: "u".into(),
            container: Container::Agent("a".into()),
            file_id: "f".into(),
            attached: true,
        };
        let ops = vec![
            link("a", Mcp, "m1", true),
            link("a", Mcp, "m2", true),
            link("a", Mcp, "m3", false),
            link("a", Mcp, "m1", false), // m1 again: a new run
            link("a", Toolset, "t1", true),
            link("b", Toolset, "t2", true),
            (attach, "op-f".into()),
            link("b", Toolset, "t3", true),
        ];
        assert_eq!(
            shape(&ops),
            vec![
                Some(("a", Mcp, vec!["m1", "m2"], vec!["m3"])),
                Some(("a", Mcp, vec![], vec!["m1"])),
                Some(("a", Toolset, vec!["t1"], vec![])),
                Some(("b", Toolset, vec!["t2"], vec![])),
                None,
                Some(("b", Toolset, vec!["t3"], vec![])),
            ]
        );
    }
}
