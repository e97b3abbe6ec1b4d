//! The optimistic-transaction engine: snapshot reads, buffered writes, and
//! a commit that fails with `WriteConflict` if a key it wrote was committed
//! by another transaction since its snapshot.

use std::{
    collections::{BTreeMap, HashMap},
    ops::Bound,
    path::Path,
    sync::Arc,
};

use redb::{Database, ReadOnlyTable, ReadableTable, TableDefinition};
use serde::{Serialize, de::DeserializeOwned};

use crate::meta::{MetaError, MetaResult};

const DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("docs");

const SEQ_KEY: &str = "\0seq";

pub(super) fn other(e: impl std::fmt::Display) -> MetaError {
    MetaError::Other(e.to_string())
}

/// The database: one redb file holding one table of versioned documents.
/// Cheap to clone.
#[derive(Clone)]
pub struct Db {
    db: Arc<Database>,
}

impl AsRef<Db> for Db {
    fn as_ref(&self) -> &Db {
        self
    }
}

impl Db {
    /// Opens (or creates) the database at `path`. Only one process may hold it.
    pub(super) fn open(path: &Path) -> anyhow::Result<Self> {
        let db = Database::create(path).map_err(|e| match e {
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
    pub(super) fn begin(&self) -> MetaResult<Txn> {
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
    pub(super) async fn transaction<T, F>(&self, f: F) -> MetaResult<T>
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

pub(super) fn split(raw: &[u8]) -> (u64, &[u8]) {
    let (v, doc) = raw.split_at(8);
    (u64::from_le_bytes(v.try_into().expect("8 bytes")), doc)
}

impl Txn {
    pub(super) fn snapshot_raw(&self, key: &str) -> MetaResult<Option<(u64, Vec<u8>)>> {
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
    pub fn commit(self, store: &impl AsRef<Db>) -> MetaResult<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let wtx = store.as_ref().db.begin_write().map_err(other)?;
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

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Barrier,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;
    use crate::{
        meta::{
            ApiKeyRecord, UserRecord, UserRepo,
            embedded::EmbeddedStore,
            retry::{TxnRetryPolicy, with_txn_retry},
        },
        vocab::{ApiKeyHash, UserId},
    };

    fn user(id: UserId) -> UserRecord {
        UserRecord {
            id,
            ..UserRecord::new("u".into())
        }
    }

    fn key_of(user: &UserRecord) -> ApiKeyRecord {
        ApiKeyRecord {
            id: Default::default(),
            user_id: user.id,
            name: "default".into(),
            hash: ApiKeyHash::from_hex(format!("hash-{}", user.id)),
            created_at: crate::meta::now(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_transactions_conflict_and_the_retry_path_absorbs_it() {
        let dir = tempdir();
        let store = EmbeddedStore::open(&dir).unwrap();
        let u1 = UserId::new();
        let key = format!("users/{u1}");
        let u = user(u1);
        store.insert_user(&u, &key_of(&u)).await.unwrap();
        // Both transactions read the user document before either commits.
        let barrier = Arc::new(Barrier::new(2));
        let attempts = Arc::new(AtomicU32::new(0));
        let policy = TxnRetryPolicy {
            max_attempts: 3,
            base_delay: std::time::Duration::from_millis(5),
        };
        let push = |size: i64| {
            let (store, barrier, attempts) = (store.clone(), barrier.clone(), attempts.clone());
            let key = key.clone();
            async move {
                with_txn_retry(&policy, || {
                    let (barrier, attempts) = (barrier.clone(), attempts.clone());
                    let key = key.clone();
                    store.transaction(move |tx| {
                        let first = attempts.fetch_add(1, Ordering::SeqCst) < 2;
                        let mut u: UserRecord = tx.get(&key)?.unwrap();
                        if first {
                            barrier.wait();
                        }
                        u.file_count += 1;
                        u.used_bytes += size;
                        tx.put(&key, &u)
                    })
                })
                .await
            }
        };
        let (a, b) = tokio::join!(push(1), push(2));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            a.retries + b.retries,
            1,
            "exactly one side conflicted and retried"
        );
        assert_eq!(attempts.load(Ordering::SeqCst), 3);
        let u = store.user(&u1).await.unwrap().unwrap();
        assert_eq!((u.file_count, u.used_bytes), (2, 3), "no update lost");
    }

    #[tokio::test]
    async fn a_conflict_is_reported_not_silently_overwritten() {
        let dir = tempdir();
        let store = EmbeddedStore::open(&dir).unwrap();
        let u1 = UserId::new();
        let key = format!("users/{u1}");
        let u = user(u1);
        store.insert_user(&u, &key_of(&u)).await.unwrap();
        let mut a = store.begin().unwrap();
        let mut b = store.begin().unwrap();
        let ua: UserRecord = a.get(&key).unwrap().unwrap();
        let ub: UserRecord = b.get(&key).unwrap().unwrap();
        a.put(&key, &ua).unwrap();
        b.put(&key, &ub).unwrap();
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
