//! Embedded `MetadataStore` on redb: one on-disk file under the data dir,
//! with optimistic transactions that report write-write conflicts the way
//! MongoDB does, so the same retry path runs on both.
//!
//! A transaction reads from a redb snapshot and buffers its writes. At commit
//! (redb runs one write transaction at a time) every written key's version is
//! compared with the version the snapshot saw: if another transaction has
//! committed that key since, the commit fails with `WriteConflict`
//! (first committer wins, as WiredTiger's snapshot isolation does).

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

    /// Begins a transaction on a snapshot of the current state.
    pub fn begin(&self) -> MetaResult<Txn> {
        let snapshot = self
            .db
            .begin_read()
            .map_err(other)?
            .open_table(DOCS)
            .map_err(other)?;
        Ok(Txn {
            snapshot,
            read_versions: HashMap::new(),
            writes: BTreeMap::new(),
        })
    }

    /// Runs `f` in a transaction on a blocking thread and commits it.
    pub async fn transaction<T, F>(&self, f: F) -> MetaResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Txn) -> MetaResult<T> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut tx = store.begin()?;
            let out = f(&mut tx)?;
            tx.commit(&store)?;
            Ok(out)
        })
        .await
        .map_err(other)?
    }
}

/// An open optimistic transaction.
pub struct Txn {
    snapshot: ReadOnlyTable<&'static str, &'static [u8]>,
    read_versions: HashMap<String, u64>,
    writes: BTreeMap<String, Option<Vec<u8>>>,
}

fn split(raw: &[u8]) -> (u64, &[u8]) {
    let (v, doc) = raw.split_at(8);
    (u64::from_le_bytes(v.try_into().expect("8 bytes")), doc)
}

impl Txn {
    fn snapshot_raw(&self, key: &str) -> MetaResult<Option<(u64, Vec<u8>)>> {
        Ok(self.snapshot.get(key).map_err(other)?.map(|g| {
            let (v, doc) = split(g.value());
            (v, doc.to_vec())
        }))
    }

    /// Reads a document: this transaction's own write if any, else the snapshot.
    pub fn get<T: DeserializeOwned>(&mut self, key: &str) -> MetaResult<Option<T>> {
        if let Some(w) = self.writes.get(key) {
            return w
                .as_deref()
                .map(serde_json::from_slice)
                .transpose()
                .map_err(other);
        }
        let raw = self.snapshot_raw(key)?;
        self.read_versions
            .insert(key.to_owned(), raw.as_ref().map_or(0, |(v, _)| *v));
        raw.map(|(_, doc)| serde_json::from_slice(&doc))
            .transpose()
            .map_err(other)
    }

    pub fn put<T: Serialize>(&mut self, key: &str, doc: &T) -> MetaResult<()> {
        let bytes = serde_json::to_vec(doc).map_err(other)?;
        self.writes.insert(key.to_owned(), Some(bytes));
        Ok(())
    }

    /// Writes a new document; `Duplicate` if the key exists.
    pub fn insert<T: Serialize>(&mut self, key: &str, doc: &T) -> MetaResult<()> {
        if self.get::<serde_json::Value>(key)?.is_some() {
            return Err(MetaError::Duplicate);
        }
        self.put(key, doc)
    }

    pub fn delete(&mut self, key: &str) {
        self.writes.insert(key.to_owned(), None);
    }

    /// Keys under `prefix`, after `after` (exclusive), from the snapshot.
    pub fn keys(&self, prefix: &str, after: Option<&str>, limit: usize) -> MetaResult<Vec<String>> {
        // The byte after '/' is '0': everything under `prefix/` sorts before `prefix0`.
        let end = format!(
            "{}{}",
            &prefix[..prefix.len() - 1],
            (prefix.as_bytes()[prefix.len() - 1] + 1) as char
        );
        let start_key = after.map(|a| format!("{prefix}{a}"));
        let start = match &start_key {
            Some(k) => Bound::Excluded(k.as_str()),
            None => Bound::Included(prefix),
        };
        let mut out = Vec::new();
        for item in self
            .snapshot
            .range::<&str>((start, Bound::Excluded(end.as_str())))
            .map_err(other)?
        {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item.map_err(other)?;
            out.push(k.value().to_owned());
        }
        Ok(out)
    }

    /// Commits, or fails with `WriteConflict` if a written key changed since the snapshot.
    pub fn commit(self, store: &EmbeddedStore) -> MetaResult<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let wtx = store.db.begin_write().map_err(other)?;
        {
            let mut table = wtx.open_table(DOCS).map_err(other)?;
            for key in self.writes.keys() {
                let seen = match self.read_versions.get(key) {
                    Some(v) => *v,
                    None => self.snapshot_raw(key)?.map_or(0, |(v, _)| v),
                };
                let current = table
                    .get(key.as_str())
                    .map_err(other)?
                    .map_or(0, |g| split(g.value()).0);
                if current != seen {
                    return Err(MetaError::WriteConflict); // dropping `wtx` aborts
                }
            }
            let seq = table
                .get(SEQ_KEY)
                .map_err(other)?
                .map_or(0, |g| split(g.value()).0)
                + 1;
            for (key, value) in &self.writes {
                match value {
                    Some(doc) => {
                        let mut raw = Vec::with_capacity(8 + doc.len());
                        raw.extend_from_slice(&seq.to_le_bytes());
                        raw.extend_from_slice(doc);
                        table.insert(key.as_str(), raw.as_slice()).map_err(other)?;
                    }
                    None => {
                        table.remove(key.as_str()).map_err(other)?;
                    }
                }
            }
            table
                .insert(SEQ_KEY, seq.to_le_bytes().as_slice())
                .map_err(other)?;
        }
        wtx.commit().map_err(other)
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

/// Records a queued operation's id; `AlreadyApplied` if it was seen before.
fn record_op(tx: &mut Txn, op_id: Option<&str>) -> MetaResult<()> {
    let Some(id) = op_id else { return Ok(()) };
    let op = ProcessedOp {
        id: id.to_owned(),
        created_at: now(),
    };
    match tx.insert(&format!("processed_ops/{id}"), &op) {
        Err(MetaError::Duplicate) => Err(MetaError::AlreadyApplied),
        r => r,
    }
}

/// The document if it exists and `owner` owns it.
fn owned(doc: Option<Value>, owner: &str) -> MetaResult<Value> {
    doc.filter(|d| d["owner_id"] == owner)
        .ok_or(MetaError::NotFound)
}

/// Adds `id` to (or removes it from) the array `field`, keeping one copy.
fn set_member(doc: &mut Value, field: &str, id: &str, present: bool) {
    if !doc[field].is_array() {
        doc[field] = Value::Array(Vec::new());
    }
    let list = doc[field].as_array_mut().expect("an array");
    let has = list.iter().any(|v| v == id);
    if present && !has {
        list.push(Value::from(id));
    } else if !present {
        list.retain(|v| v != id);
    }
}

/// Applies a container write inside `tx`, checking and storing `fence` on
/// the container.
fn write_op(tx: &mut Txn, op: &Operation, fence: Option<&Fence>) -> MetaResult<()> {
    match op {
        Operation::Attach {
            owner_id,
            container,
            file_id,
            attached,
        } => {
            let (collection, cid) = (container.collection(), container.id());
            let ckey = format!("{collection}/{cid}");
            let mut doc = owned(tx.get::<Value>(&ckey)?, owner_id)?;
            apply_fence_value(&mut doc, fence)?;
            let fkey = file_key(file_id);
            match tx.get::<Value>(&fkey)? {
                // The file's document is written too, so that a concurrent
                // delete of the file conflicts with this attach.
                Some(mut file)
                    if tx
                        .get::<Value>(&format!("permissions/{file_id}:{owner_id}"))?
                        .is_some() =>
                {
                    set_member(&mut file, collection, cid, *attached);
                    tx.put(&fkey, &file)?;
                }
                _ if *attached => return Err(MetaError::NotFound),
                _ => {} // detaching a file that is gone: nothing to undo on it
            }
            set_member(&mut doc, "file_ids", file_id, *attached);
            tx.put(&ckey, &doc)
        }
        Operation::Link {
            owner_id,
            agent_id,
            kind,
            link_id,
            connected,
        } => {
            let key = format!("agents/{agent_id}");
            let mut doc = owned(tx.get::<Value>(&key)?, owner_id)?;
            apply_fence_value(&mut doc, fence)?;
            set_member(&mut doc, kind.field(), link_id, *connected);
            tx.put(&key, &doc)
        }
    }
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

    async fn insert_user(&self, user: &UserRecord) -> MetaResult<()> {
        let user = user.clone();
        self.transaction(move |tx| {
            tx.insert(&format!("api_keys/{}", user.api_key_hash), &user.id)?;
            tx.insert(&user_key(&user.id), &user)
        })
        .await
    }

    async fn user(&self, id: &str) -> MetaResult<Option<UserRecord>> {
        let key = user_key(id);
        self.transaction(move |tx| tx.get(&key)).await
    }

    async fn user_by_key_hash(&self, hash: &str) -> MetaResult<Option<UserRecord>> {
        let key = format!("api_keys/{hash}");
        self.transaction(move |tx| match tx.get::<String>(&key)? {
            Some(id) => tx.get(&user_key(&id)),
            None => Ok(None),
        })
        .await
    }

    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        let intent = intent.clone();
        self.transaction(move |tx| tx.insert(&format!("intents/{}", intent.id), &intent))
            .await
    }

    async fn touch_intent(&self, file_id: &str) -> MetaResult<bool> {
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| {
            let Some(mut intent) = tx.get::<IntentRecord>(&key)? else {
                return Ok(false);
            };
            intent.refreshed_at = Some(super::now());
            tx.put(&key, &intent)?;
            Ok(true)
        })
        .await
    }

    async fn delete_intent(&self, file_id: &str) -> MetaResult<()> {
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| {
            tx.delete(&key);
            Ok(())
        })
        .await
    }

    async fn intent(&self, file_id: &str) -> MetaResult<Option<IntentRecord>> {
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| tx.get::<IntentRecord>(&key))
            .await
    }

    async fn intents(
        &self,
        before: chrono::DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<IntentRecord>> {
        self.transaction(move |tx| {
            let mut out: Vec<IntentRecord> = Vec::new();
            for k in tx.keys("intents/", None, usize::MAX)? {
                if let Some(i) = tx.get::<IntentRecord>(&k)?
                    && i.alive_at() < before
                {
                    out.push(i);
                }
            }
            out.sort_by_key(|i| i.alive_at());
            out.truncate(limit);
            Ok(out)
        })
        .await
    }

    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let c = commit.clone();
        self.transaction(move |tx| {
            let file = &c.file;
            if let Some(key) = &c.idempotency_key {
                let id = IdempotencyRecord::id_for(&file.owner_id, key);
                let ikey = format!("idempotency/{id}");
                if let Some(first) = tx.get::<IdempotencyRecord>(&ikey)? {
                    return Ok(CommitOutcome::Replayed(Box::new(first.file)));
                }
                tx.put(
                    &ikey,
                    &IdempotencyRecord {
                        id,
                        file: file.clone(),
                        created_at: crate::meta::now(),
                    },
                )?;
            }
            let ukey = user_key(&file.owner_id);
            let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
            apply_fence(&mut user, c.fence.as_ref())?;
            if let Some(quota) = c.quota_bytes
                && (user.used_bytes + file.size) as u64 > quota
            {
                return Err(MetaError::QuotaExceeded);
            }
            user.used_bytes += file.size;
            user.file_ids.push(file.id.clone());
            tx.put(&ukey, &user)?;
            tx.insert(&file_key(&file.id), file)?;
            tx.put(&format!("{}{}", owner_prefix(&file.owner_id), file.id), &())?;
            let perm = PermissionRecord {
                id: format!("{}:{}", file.id, file.owner_id),
                file_id: file.id.clone(),
                user_id: file.owner_id.clone(),
                role: "owner".into(),
            };
            tx.insert(&format!("permissions/{}", perm.id), &perm)?;
            let intent_key = format!("intents/{}", file.id);
            if tx.get::<IntentRecord>(&intent_key)?.is_none() {
                return Err(MetaError::IntentGone);
            }
            tx.delete(&intent_key);
            Ok(CommitOutcome::Committed)
        })
        .await
    }

    async fn idempotent_file(&self, user_id: &str, key: &str) -> MetaResult<Option<FileRecord>> {
        let key = format!("idempotency/{}", IdempotencyRecord::id_for(user_id, key));
        self.transaction(move |tx| Ok(tx.get::<IdempotencyRecord>(&key)?.map(|r| r.file)))
            .await
    }

    async fn file(&self, owner_id: &str, file_id: &str) -> MetaResult<Option<FileRecord>> {
        let (owner, key) = (owner_id.to_owned(), file_key(file_id));
        self.transaction(move |tx| Ok(tx.get::<FileRecord>(&key)?.filter(|f| f.owner_id == owner)))
            .await
    }

    async fn list_files(
        &self,
        owner_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>> {
        let prefix = owner_prefix(owner_id);
        let after = after.map(str::to_owned);
        self.transaction(move |tx| {
            let keys = tx.keys(&prefix, after.as_deref(), limit)?;
            let mut files = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(f) = tx.get(&file_key(&k[prefix.len()..]))? {
                    files.push(f);
                }
            }
            Ok(files)
        })
        .await
    }

    async fn delete_file(
        &self,
        owner_id: &str,
        file_id: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let (owner, id, fence) = (owner_id.to_owned(), file_id.to_owned(), fence.cloned());
        self.transaction(move |tx| {
            let Some(file) = tx
                .get::<FileRecord>(&file_key(&id))?
                .filter(|f| f.owner_id == owner)
            else {
                return Ok(None);
            };
            let ukey = user_key(&owner);
            let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
            apply_fence(&mut user, fence.as_ref())?;
            user.file_ids.retain(|f| *f != id);
            user.used_bytes -= file.size;
            tx.put(&ukey, &user)?;
            for (collection, ids) in [("sessions", &file.sessions), ("agents", &file.agents)] {
                for cid in ids {
                    let key = format!("{collection}/{cid}");
                    if let Some(mut doc) = tx.get::<Value>(&key)? {
                        set_member(&mut doc, "file_ids", &id, false);
                        tx.put(&key, &doc)?;
                    }
                }
            }
            tx.delete(&file_key(&id));
            tx.delete(&format!("{}{}", owner_prefix(&owner), id));
            tx.delete(&format!("permissions/{id}:{owner}"));
            let orphan = OrphanRecord::pending_for(&file);
            tx.insert(&format!("orphans/{}", orphan.id), &orphan)?;
            Ok(Some(DeletedFile {
                file,
                orphan_id: orphan.id,
            }))
        })
        .await
    }

    async fn abandon_intent(
        &self,
        file_id: &str,
        stale_before: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<OrphanRecord>> {
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| {
            let Some(intent) = tx.get::<IntentRecord>(&key)? else {
                return Ok(None);
            };
            if stale_before.is_some_and(|t| intent.alive_at() >= t) {
                return Ok(None);
            }
            tx.delete(&key);
            let orphan = OrphanRecord::pending(
                &intent.bucket,
                &intent.key,
                Some("upload never committed".into()),
            );
            tx.insert(&format!("orphans/{}", orphan.id), &orphan)?;
            Ok(Some(orphan))
        })
        .await
    }

    async fn orphans_due(
        &self,
        max_retries: i32,
        retry_before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        let mut due: Vec<OrphanRecord> = self
            .orphans(Some(OrphanStatus::Pending), usize::MAX)
            .await?
            .into_iter()
            .filter(|o| o.is_due(max_retries, retry_before))
            .collect();
        due.sort_by_key(|o| o.created_at);
        due.truncate(limit);
        Ok(due)
    }

    async fn all_files(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        let after = after.map(str::to_owned);
        self.transaction(move |tx| {
            let keys = tx.keys("files/", after.as_deref(), limit)?;
            let mut files = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(f) = tx.get(&k)? {
                    files.push(f);
                }
            }
            Ok(files)
        })
        .await
    }

    async fn counts(&self) -> MetaResult<MetaCounts> {
        let mut c = MetaCounts::default();
        for o in self.orphans(None, usize::MAX).await? {
            match o.status {
                OrphanStatus::Pending => c.orphans_pending += 1,
                OrphanStatus::Deleted => c.orphans_deleted += 1,
                OrphanStatus::Failed => c.orphans_failed += 1,
            }
        }
        c.intents = self
            .transaction(|tx| Ok(tx.keys("intents/", None, usize::MAX)?.len() as u64))
            .await?;
        Ok(c)
    }

    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()> {
        let session = session.clone();
        self.transaction(move |tx| tx.insert(&format!("sessions/{}", session.id), &session))
            .await
    }

    async fn session(&self, owner_id: &str, id: &str) -> MetaResult<Option<SessionRecord>> {
        let (owner, key) = (owner_id.to_owned(), format!("sessions/{id}"));
        self.transaction(move |tx| {
            Ok(tx
                .get::<SessionRecord>(&key)?
                .filter(|s| s.owner_id == owner))
        })
        .await
    }

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()> {
        let agent = agent.clone();
        self.transaction(move |tx| tx.insert(&format!("agents/{}", agent.id), &agent))
            .await
    }

    async fn agent(&self, owner_id: &str, id: &str) -> MetaResult<Option<AgentRecord>> {
        let (owner, key) = (owner_id.to_owned(), format!("agents/{id}"));
        self.transaction(move |tx| Ok(tx.get::<AgentRecord>(&key)?.filter(|a| a.owner_id == owner)))
            .await
    }

    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&str>,
    ) -> MetaResult<()> {
        let (op, fence, op_id) = (op.clone(), fence.cloned(), op_id.map(str::to_owned));
        self.transaction(move |tx| {
            record_op(tx, op_id.as_deref())?;
            write_op(tx, &op, fence.as_ref())
        })
        .await
    }

    async fn apply_group(&self, ops: &[(Operation, String)], fence: &Fence) -> MetaResult<()> {
        let (ops, fence) = (ops.to_vec(), fence.clone());
        self.transaction(move |tx| {
            for (op, id) in &ops {
                record_op(tx, Some(id))?;
                write_op(tx, op, Some(&fence))?;
            }
            Ok(())
        })
        .await
    }

    async fn record_orphan(&self, orphan: &OrphanRecord) -> MetaResult<()> {
        let orphan = orphan.clone();
        self.transaction(move |tx| tx.put(&format!("orphans/{}", orphan.id), &orphan))
            .await
    }

    async fn mark_orphan(
        &self,
        id: &str,
        status: OrphanStatus,
        error: Option<String>,
    ) -> MetaResult<()> {
        let key = format!("orphans/{id}");
        self.transaction(move |tx| {
            let mut o: OrphanRecord = tx.get(&key)?.ok_or(MetaError::NotFound)?;
            o.mark(status, error);
            tx.put(&key, &o)
        })
        .await
    }

    async fn orphans(
        &self,
        status: Option<OrphanStatus>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        self.transaction(move |tx| {
            let mut out = Vec::new();
            for k in tx.keys("orphans/", None, usize::MAX)? {
                if let Some(o) = tx.get::<OrphanRecord>(&k)?
                    && status.is_none_or(|s| s == o.status)
                {
                    out.push(o);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Barrier,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;
    use crate::meta::retry::{TxnRetryPolicy, with_txn_retry};

    fn user(id: &str) -> UserRecord {
        UserRecord {
            id: id.into(),
            name: "u".into(),
            api_key_hash: format!("hash-{id}"),
            file_ids: vec![],
            used_bytes: 0,
            upload_fence: Default::default(),
            created_at: crate::meta::now(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_transactions_conflict_and_the_retry_path_absorbs_it() {
        let dir = tempdir();
        let store = EmbeddedStore::open(&dir).unwrap();
        store.insert_user(&user("u1")).await.unwrap();

        // Both transactions read the user document before either commits.
        let barrier = Arc::new(Barrier::new(2));
        let attempts = Arc::new(AtomicU32::new(0));
        let policy = TxnRetryPolicy {
            max_attempts: 3,
            base_delay: std::time::Duration::from_millis(5),
        };
        let push = |file: &'static str| {
            let (store, barrier, attempts) = (store.clone(), barrier.clone(), attempts.clone());
            async move {
                with_txn_retry(&policy, || {
                    let (barrier, attempts) = (barrier.clone(), attempts.clone());
                    store.transaction(move |tx| {
                        let first = attempts.fetch_add(1, Ordering::SeqCst) < 2;
                        let mut u: UserRecord = tx.get("users/u1")?.unwrap();
                        if first {
                            barrier.wait();
                        }
                        u.file_ids.push(file.into());
                        tx.put("users/u1", &u)
                    })
                })
                .await
            }
        };
        let (a, b) = tokio::join!(push("f1"), push("f2"));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            a.retries + b.retries,
            1,
            "exactly one side conflicted and retried"
        );
        assert_eq!(attempts.load(Ordering::SeqCst), 3);
        let mut ids = store.user("u1").await.unwrap().unwrap().file_ids;
        ids.sort();
        assert_eq!(ids, ["f1", "f2"], "no update lost");
    }

    #[tokio::test]
    async fn a_conflict_is_reported_not_silently_overwritten() {
        let dir = tempdir();
        let store = EmbeddedStore::open(&dir).unwrap();
        store.insert_user(&user("u1")).await.unwrap();
        let mut a = store.begin().unwrap();
        let mut b = store.begin().unwrap();
        let ua: UserRecord = a.get("users/u1").unwrap().unwrap();
        let ub: UserRecord = b.get("users/u1").unwrap().unwrap();
        a.put("users/u1", &ua).unwrap();
        b.put("users/u1", &ub).unwrap();
        a.commit(&store).unwrap();
        assert!(matches!(b.commit(&store), Err(MetaError::WriteConflict)));
    }

    #[tokio::test]
    async fn a_second_process_cannot_open_the_store() {
        let dir = tempdir();
        let _first = EmbeddedStore::open(&dir).unwrap();
        let err = EmbeddedStore::open(&dir)
            .err()
            .expect("second open must fail")
            .to_string();
        assert!(err.contains("in use"), "{err}");
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("filedock-meta-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
