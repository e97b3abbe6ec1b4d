//! A transaction's writes sent together. On MongoDB 8.0 or later they go in
//! one `bulkWrite` command (one round trip for writes to several
//! collections: a commit's file, event, permission and intent; the feed
//! places of a batch of events); before it, or with
//! `FILEDOCK_MONGODB_BULK_WRITE=false`, a command each (consecutive
//! inserts into one collection in one `insert`).

use std::sync::atomic::Ordering;

use bson::{Document, doc};
use mongodb::{
    ClientSession, Collection, Namespace,
    error::{Error, ErrorKind},
    options::{DeleteManyModel, InsertOneModel, UpdateOneModel, WriteModel},
};
use serde::Serialize;

use super::{
    MongoStore,
    errors::{classify, failed_write},
};
use crate::meta::{MetaError, MetaResult};

/// One write.
enum Write {
    /// `own_file`: a duplicate key on it is the commit meeting its own
    /// file ([`MetaError::met_own_file`]).
    Insert {
        ns: Namespace,
        doc: Document,
        own_file: bool,
    },
    Update {
        ns: Namespace,
        filter: Document,
        update: Document,
    },
    Delete {
        ns: Namespace,
        filter: Document,
    },
}

impl Write {
    fn own_file(&self) -> bool {
        matches!(self, Self::Insert { own_file: true, .. })
    }

    fn model(self) -> WriteModel {
        match self {
            Self::Insert { ns, doc, .. } => InsertOneModel::builder()
                .namespace(ns)
                .document(doc)
                .build()
                .into(),
            Self::Update { ns, filter, update } => UpdateOneModel::builder()
                .namespace(ns)
                .filter(filter)
                .update(update)
                .build()
                .into(),
            Self::Delete { ns, filter } => DeleteManyModel::builder()
                .namespace(ns)
                .filter(filter)
                .build()
                .into(),
        }
    }
}

/// Writes to send in one transaction, in order; the first that fails fails
/// them all (the transaction is aborted).
#[derive(Default)]
pub(super) struct Writes {
    ops: Vec<Write>,
}

impl Writes {
    /// Inserts `doc` into `coll`.
    pub(super) fn insert<T: Serialize + Send + Sync>(
        &mut self,
        coll: &Collection<T>,
        doc: &T,
    ) -> MetaResult<()> {
        self.push(coll, doc, false)
    }

    /// Inserts an upload's file: one there already means an earlier run of
    /// the same commit may have applied.
    pub(super) fn insert_file<T: Serialize + Send + Sync>(
        &mut self,
        coll: &Collection<T>,
        doc: &T,
    ) -> MetaResult<()> {
        self.push(coll, doc, true)
    }

    fn push<T: Serialize + Send + Sync>(
        &mut self,
        coll: &Collection<T>,
        doc: &T,
        own_file: bool,
    ) -> MetaResult<()> {
        let doc = bson::to_document(doc).map_err(|e| MetaError::Other(e.to_string()))?;
        self.ops.push(Write::Insert {
            ns: coll.namespace(),
            doc,
            own_file,
        });
        Ok(())
    }

    /// Applies `update` to the first document of `coll` matching `filter`.
    pub(super) fn update_one<T: Send + Sync>(
        &mut self,
        coll: &Collection<T>,
        filter: Document,
        update: Document,
    ) {
        self.ops.push(Write::Update {
            ns: coll.namespace(),
            filter,
            update,
        });
    }

    /// Deletes every document of `coll` matching `filter`.
    pub(super) fn delete_many<T: Send + Sync>(&mut self, coll: &Collection<T>, filter: Document) {
        self.ops.push(Write::Delete {
            ns: coll.namespace(),
            filter,
        });
    }
}

impl MongoStore {
    /// Sends `writes` in `s`'s transaction; how many documents they deleted.
    pub(super) async fn send(&self, s: &mut ClientSession, writes: Writes) -> MetaResult<u64> {
        if writes.ops.is_empty() {
            return Ok(0);
        }
        // Several documents into one collection (a group commit's files,
        // events, permissions): one `insert` of them all, where a
        // `bulkWrite` is one write each to the server (SecantusDB runs
        // each through its one-document handler).
        if !self.bulk_write.load(Ordering::Relaxed) || writes.inserts_many() {
            return self.send_each(s, writes).await;
        }
        let own_file: Vec<bool> = writes.ops.iter().map(Write::own_file).collect();
        let models = writes.ops.into_iter().map(Write::model);
        match self.db.client().bulk_write(models).session(&mut *s).await {
            Ok(done) => Ok(done.deleted_count.max(0) as u64),
            Err(e) => match unwrapped(e) {
                // Refused whole (a server older than 8.0, or one an upgrade
                // was rolled back to): nothing was written, and the
                // transaction runs again with a command each.
                e if refused(&e) => {
                    tracing::warn!(error = %e, "MongoDB refused bulkWrite: a command each from now on");
                    self.bulk_write.store(false, Ordering::Relaxed);
                    Err(MetaError::Transient(e.to_string()))
                }
                e => {
                    let own = failed_write(&e).is_some_and(|i| own_file.get(i) == Some(&true));
                    let e = classify(e);
                    Err(if own { e.met_own_file() } else { e })
                }
            },
        }
    }

    /// Whether the server takes `bulkWrite` (a MongoDB 8.0 binary may still
    /// run with the features of 7.0): one that matches nothing, sent once
    /// at start.
    pub(super) async fn takes_bulk_write(&self) -> bool {
        let nothing = DeleteManyModel::builder()
            .namespace(self.db.collection::<Document>("upload_intents").namespace())
            .filter(doc! {"_id": "", "user_id": ""})
            .build();
        match self.db.client().bulk_write([nothing]).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "MongoDB refused bulkWrite: a transaction's writes go a command each");
                false
            }
        }
    }

    /// [`Self::send`] as a command per collection in turn.
    async fn send_each(&self, s: &mut ClientSession, writes: Writes) -> MetaResult<u64> {
        let mut deleted = 0;
        let mut ops = writes.ops.into_iter().peekable();
        while let Some(w) = ops.next() {
            match w {
                Write::Insert { ns, doc, own_file } => {
                    let mut docs = vec![doc];
                    while let Some(Write::Insert { doc, .. }) =
                        ops.next_if(|n| same_run(n, &ns, own_file))
                    {
                        docs.push(doc);
                    }
                    let result = self
                        .collection(&ns)
                        .insert_many(docs)
                        .session(&mut *s)
                        .await;
                    if let Err(e) = result {
                        let e = classify(e);
                        return Err(if own_file { e.met_own_file() } else { e });
                    }
                }
                Write::Update { ns, filter, update } => {
                    self.collection(&ns)
                        .update_one(filter, update)
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                }
                Write::Delete { ns, filter } => {
                    let gone = self
                        .collection(&ns)
                        .delete_many(filter)
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                    deleted += gone.deleted_count;
                }
            }
        }
        Ok(deleted)
    }

    fn collection(&self, ns: &Namespace) -> Collection<Document> {
        self.db.client().database(&ns.db).collection(&ns.coll)
    }
}

impl Writes {
    /// Whether two inserts in a row go into one collection.
    fn inserts_many(&self) -> bool {
        self.ops.windows(2).any(|w| match &w[0] {
            Write::Insert { ns, own_file, .. } => same_run(&w[1], ns, *own_file),
            _ => false,
        })
    }
}

/// A `bulkWrite` sent in several commands reports a later command's
/// failure (a conflict, a lost link) inside an error of the bulk write with
/// no write's in it: that failure is the one to classify.
fn unwrapped(e: Error) -> Error {
    let inner = match e.kind.as_ref() {
        ErrorKind::BulkWrite(b)
            if b.write_errors.is_empty() && b.write_concern_errors.is_empty() =>
        {
            std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Error>().cloned())
        }
        _ => None,
    };
    inner.unwrap_or(e)
}

/// Whether `e` refuses `bulkWrite` itself: the driver's check of the
/// server's version, or the server not knowing the command.
fn refused(e: &Error) -> bool {
    const COMMAND_NOT_FOUND: i32 = 59;
    const COMMAND_NOT_SUPPORTED: i32 = 115;
    match e.kind.as_ref() {
        ErrorKind::IncompatibleServer { .. } => true,
        ErrorKind::Command(c) => matches!(c.code, COMMAND_NOT_FOUND | COMMAND_NOT_SUPPORTED),
        _ => false,
    }
}

/// Whether `w` is an insert into `ns` of the same kind: sent with the run.
fn same_run(w: &Write, ns: &Namespace, own_file: bool) -> bool {
    matches!(w, Write::Insert { ns: n, own_file: o, .. } if n == ns && *o == own_file)
}
