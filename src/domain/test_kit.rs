//! The services on the embedded adapters (redb, local files, in-process
//! locks) in a directory of their own: what the domain's unit tests run on.

use std::{path::PathBuf, sync::Arc};

use bytes::Bytes;
use futures::StreamExt;

use secrecy::ExposeSecret;

use super::{
    links::LinkSigner,
    resumable::ResumableService,
    upload::{Admission, Committer, Idempotency, PrecommitHook, UploadService},
    users,
};
use crate::{
    blob::{BodyError, ByteStream, fs::FsBlobStore, resumable::ResumableBlobs},
    config::Settings,
    lock::{Locks, memory::MemoryLocks},
    meta::{
        CleanupRepo, FileRecord, FileRepo, ResumableRepo, UserRecord, embedded::EmbeddedStore,
        retry::Transactions,
    },
    metrics::Metrics,
    vocab::BlobKey,
};

/// The services and the adapters underneath them.
pub(crate) struct Kit {
    pub meta: Arc<EmbeddedStore>,
    pub blobs: Arc<FsBlobStore>,
    pub locks: Arc<Locks>,
    pub committer: Arc<Committer>,
    pub uploads: UploadService,
    pub resumables: ResumableService,
    /// The lock backend underneath `locks`.
    pub memory_locks: Arc<MemoryLocks>,
    admission: Arc<Admission>,
    settings: Settings,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Kit {
    /// The services on `settings` changed by `tune`, in a fresh directory.
    pub async fn new(tune: impl FnOnce(&mut Settings)) -> Self {
        let dir = std::env::temp_dir().join(format!("filedock-kit-{}", uuid::Uuid::new_v4()));
        let mut settings = Settings::embedded(&dir);
        tune(&mut settings);
        let meta = Arc::new(EmbeddedStore::open(&dir).unwrap());
        let blobs = Arc::new(FsBlobStore::open(&dir).unwrap());
        let metrics = Arc::new(Metrics::default());
        let memory_locks = Arc::new(MemoryLocks::new());
        let locks = Arc::new(Locks::new(
            memory_locks.clone(),
            settings.lock.clone(),
            false,
            metrics.clone(),
        ));
        let txns = Transactions::new(settings.txn_retry, metrics.clone());
        // The pre-commit hook, when the settings name one: its read URLs
        // on a link secret of the kit's own, on an address nobody reads.
        let hook = settings.precommit.as_ref().map(|p| {
            let signer = crate::hooks::Signer::from_secret(p.secret.expose_secret()).unwrap();
            let caller = crate::hooks::Caller::new(signer, p.timeout).unwrap();
            let links = Arc::new(LinkSigner::new(None).unwrap());
            let base = "http://127.0.0.1:9".to_owned();
            Arc::new(PrecommitHook::new(
                p,
                caller,
                (links, base),
                blobs.clone(),
                metrics.clone(),
            ))
        });
        let committer = Arc::new(
            Committer::new(
                meta.clone(),
                meta.clone(),
                blobs.clone(),
                locks.clone(),
                txns,
                metrics.clone(),
                &settings,
            )
            .with_hook(hook),
        );
        let admission = Arc::new(Admission::new(
            meta.clone(),
            meta.clone(),
            metrics.clone(),
            &settings,
        ));
        let uploads = UploadService::new(
            admission.clone(),
            committer.clone(),
            blobs.clone(),
            Idempotency::new(meta.clone()),
            metrics,
            &settings,
        );
        let resumables = ResumableService::new(
            committer.clone(),
            admission.clone(),
            meta.clone(),
            meta.clone(),
            meta.clone(),
            blobs.clone(),
            blobs.clone(),
            locks.clone(),
            &settings,
        );
        Self {
            meta,
            blobs,
            locks,
            committer,
            uploads,
            resumables,
            memory_locks,
            admission,
            settings,
            _dir: TempDir(dir),
        }
    }

    /// The resumable-upload service with its state in `repo` (a wrapper of the kit's store).
    pub fn resumables_on(&self, repo: Arc<dyn ResumableRepo>) -> ResumableService {
        self.resumables_with(repo, self.blobs.clone())
    }

    /// As [`Self::resumables_on`], its parts and tails written to `parts`
    /// (a wrapper of the kit's blobs).
    pub fn resumables_with(
        &self,
        repo: Arc<dyn ResumableRepo>,
        parts: Arc<dyn ResumableBlobs>,
    ) -> ResumableService {
        ResumableService::new(
            self.committer.clone(),
            self.admission.clone(),
            repo,
            self.meta.clone(),
            self.meta.clone(),
            self.blobs.clone(),
            parts,
            self.locks.clone(),
            &self.settings,
        )
    }

    /// The data directory.
    pub fn dir(&self) -> &std::path::Path {
        &self._dir.0
    }

    pub async fn user(&self, name: &str) -> UserRecord {
        users::create_user(self.meta.as_ref(), name)
            .await
            .unwrap()
            .0
    }

    /// The user as the store has it now.
    pub async fn stored(&self, user: &UserRecord) -> UserRecord {
        use crate::meta::UserRepo;
        self.meta.user(&user.id).await.unwrap().unwrap()
    }

    pub async fn files(&self, user: &UserRecord) -> Vec<FileRecord> {
        self.meta.list_files(&user.id, None, 100).await.unwrap()
    }

    pub async fn intents(&self) -> usize {
        let later = crate::meta::now() + chrono::Duration::days(3650);
        self.meta.intents(later, 100).await.unwrap().len()
    }

    /// The user's objects in the blob store.
    pub async fn objects(&self, user: &UserRecord) -> Vec<String> {
        use crate::blob::BlobStore;
        self.blobs
            .list_keys(&format!("{}{}/", BlobKey::FILES, user.id))
            .await
            .unwrap()
    }

    pub async fn read(&self, key: &BlobKey) -> Vec<u8> {
        use crate::blob::BlobStore;
        let mut body = self.blobs.get(key, None).await.unwrap();
        let mut all = Vec::new();
        while let Some(chunk) = body.next().await {
            all.extend_from_slice(&chunk.unwrap());
        }
        all
    }
}

/// A body of these chunks.
pub(crate) fn body(chunks: &[&'static [u8]]) -> ByteStream<'static> {
    let chunks: Vec<Result<Bytes, BodyError>> =
        chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
    futures::stream::iter(chunks).boxed()
}

/// A body that sends `first` and then nothing, ever (a client that went
/// quiet).
pub(crate) fn stalled(first: &'static [u8]) -> ByteStream<'static> {
    let first = futures::stream::iter([Ok(Bytes::from_static(first))]);
    first.chain(futures::stream::pending()).boxed()
}

/// The SHA-256 of `bytes`, hex.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
