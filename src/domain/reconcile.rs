//! `filedock reconcile`: audits the bucket against the metadata. Objects with
//! no file record and no upload in flight are strays; file records whose
//! object is missing are reported. Strays are deleted only when asked.
//!
//! It runs beside live uploads, so the order of the reads matters. Objects
//! are listed first: an upload writes its intent before its first byte, so
//! every listed object's upload either still has its intent or has already
//! committed (the commit deletes the intent and inserts the record in one
//! transaction) or been abandoned. Before each delete the intent, the
//! record and the pending orphans are read again, in that order: an object
//! passes from intent to record (one transaction), from intent to orphan
//! (the orphan is written first) and from record to orphan (a delete: one
//! transaction), so each read sees what the one before it missed. An object
//! a pending orphan names is the sweeper's (a clean-up that failed and is
//! retried), not a stray; nor is one gone by the time these reads found
//! nobody for it (a refused upload's undo deletes the blob, then the
//! intent, between the listing and the reads). Objects younger than the
//! sweeper's grace period are never touched.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use serde::Serialize;

use crate::{
    blob::{BlobStore, ListedBlob},
    meta::{CleanupRepo, FileRecord, FileRepo},
    vocab::{BlobKey, FileId},
};

#[derive(Debug, Default, Serialize)]
pub struct ReconcileReport {
    pub objects: usize,
    pub files: usize,
    /// Objects with neither a file record nor an upload intent.
    pub strays: Vec<String>,
    /// File ids whose object is missing.
    pub missing: Vec<FileId>,
    /// Strays whose key filedock never writes (not `files/{user}/{file}`):
    /// reported, never deleted.
    pub foreign: Vec<String>,
    /// Strays left alone because they are younger than the grace period.
    pub too_young: usize,
    /// Objects with neither record nor intent that a pending orphan names:
    /// the sweeper deletes them (a clean-up that failed is retried).
    pub pending_orphans: usize,
    pub deleted: usize,
    /// The strays deleted (with `--delete`), by key.
    pub deleted_keys: Vec<String>,
}

/// The audit and the ports it reads.
pub struct Reconciler {
    pub(crate) files: Arc<dyn FileRepo>,
    /// Uploads in flight (their intents).
    pub(crate) cleanup: Arc<dyn CleanupRepo>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    /// Objects younger than this are never deleted (the sweeper's grace).
    pub(crate) intent_grace: Duration,
}

impl Reconciler {
    /// Audits the bucket against the metadata; deletes strays older than the
    /// grace period if `delete_strays`.
    pub async fn reconcile(&self, delete_strays: bool) -> anyhow::Result<ReconcileReport> {
        let blobs = self.blobs.as_ref();
        let objects: Vec<ListedBlob> = blobs.list(BlobKey::FILES).await?;
        let mut files: HashMap<String, FileRecord> = HashMap::new();
        let mut after: Option<FileId> = None;
        loop {
            let page = self.files.all_files(after.as_ref(), 1000).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            files.extend(page.into_iter().map(|f| (f.key.to_string(), f)));
        }
        let mut report = ReconcileReport {
            objects: objects.len(),
            files: files.len(),
            ..Default::default()
        };
        let grace = chrono::Duration::from_std(self.intent_grace)?;
        let young_after = crate::meta::now() - grace;
        for object in &objects {
            if files.contains_key(&object.key) {
                continue;
            }
            match self.owner(&object.key).await? {
                Owner::Upload | Owner::File | Owner::Gone => continue,
                Owner::Sweeper => {
                    report.pending_orphans += 1;
                    continue;
                }
                Owner::None => {}
            }
            report.strays.push(object.key.clone());
            if !delete_strays {
                continue;
            }
            match BlobKey::parse(&object.key) {
                _ if object.modified > young_after => report.too_young += 1,
                Some(key) => {
                    blobs.delete(&key).await?;
                    report.deleted += 1;
                    report.deleted_keys.push(object.key.clone());
                }
                None => report.foreign.push(object.key.clone()),
            }
        }
        let listed: HashSet<&str> = objects.iter().map(|o| o.key.as_str()).collect();
        for (key, f) in &files {
            // A file committed after the listing has its object now.
            if !listed.contains(key.as_str()) && blobs.head(&f.key).await?.is_none() {
                report.missing.push(f.id);
            }
        }
        report.strays.sort();
        report.missing.sort();
        Ok(report)
    }

    /// Who answers for the object at `key` now, read in the order the
    /// module's comment gives (intent, record, orphan), and whether it is
    /// still there when none does.
    async fn owner(&self, key: &str) -> anyhow::Result<Owner> {
        // Anything but `files/{user}/{file}` is not filedock's upload.
        let Some(blob @ BlobKey::File { user, file }) = BlobKey::parse(key) else {
            return Ok(Owner::None);
        };
        if self.cleanup.intent(&user, &file).await?.is_some() {
            return Ok(Owner::Upload);
        }
        if self.files.file(&user, &file).await?.is_some() {
            return Ok(Owner::File);
        }
        if self.cleanup.pending_orphan(&blob).await? {
            return Ok(Owner::Sweeper);
        }
        // Listed before the reads: a clean-up may have deleted it since
        // (a refused upload's undo drops the blob, then the intent).
        Ok(match self.blobs.head(&blob).await? {
            Some(_) => Owner::None,
            None => Owner::Gone,
        })
    }
}

/// Who answers for a listed object.
enum Owner {
    /// An upload in flight (its intent).
    Upload,
    /// A committed file (its record).
    File,
    /// The sweeper (a pending orphan).
    Sweeper,
    /// Nobody, and it is gone: deleted since the listing.
    Gone,
    /// Nobody: a stray.
    None,
}
