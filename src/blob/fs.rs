//! `BlobStore` on the local file system: each write goes to a temp file,
//! is synced, then renamed into place, so readers never see half a blob.

use std::{
    io::{self, SeekFrom},
    path::{Path, PathBuf},
};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::{BlobError, BlobStore, BodyError, ByteRange, ByteStream, ListedBlob};
use crate::vocab::BlobKey;

#[path = "fs_resumable.rs"]
mod resumable;

pub struct FsBlobStore {
    root: PathBuf,
    tmp: PathBuf,
}

impl FsBlobStore {
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let root = dir.join("blobs");
        let tmp = dir.join("blobs.tmp");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&tmp)?;
        Ok(Self { root, tmp })
    }

    /// Where `key`'s object lives: its key (made of ids, so no `..`) under the root.
    fn path(&self, key: &BlobKey) -> Result<PathBuf, BlobError> {
        Ok(self.root.join(key.to_string()))
    }
}

/// Syncs a directory, so that the names created or renamed in it survive a power cut.
async fn sync_dir(dir: &Path) -> Result<(), BlobError> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
        .await
        .map_err(|e| BlobError::Other(e.to_string()))?
        .map_err(io_err)
}

fn io_err(e: io::Error) -> BlobError {
    match e.kind() {
        io::ErrorKind::NotFound => BlobError::NotFound,
        _ => BlobError::Other(e.to_string()),
    }
}

#[async_trait]
impl BlobStore for FsBlobStore {
    fn bucket(&self) -> &str {
        "local"
    }

    async fn put(&self, key: &BlobKey, mut body: ByteStream<'_>) -> Result<u64, BlobError> {
        let dest = self.path(key)?;
        let tmp = self.tmp.join(uuid::Uuid::new_v4().simple().to_string());
        let result = async {
            let mut file = tokio::fs::File::create(&tmp).await.map_err(io_err)?;
            let mut written = 0u64;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(BlobError::Body)?;
                file.write_all(&chunk).await.map_err(io_err)?;
                written += chunk.len() as u64;
            }
            file.sync_all().await.map_err(io_err)?;
            if let Some(parent) = dest.parent() {
                tokio::fs::create_dir_all(parent).await.map_err(io_err)?;
            }
            tokio::fs::rename(&tmp, &dest).await.map_err(io_err)?;
            // A rename is durable only once its directory is: without this
            // a power cut can lose an acknowledged file.
            if let Some(parent) = dest.parent() {
                sync_dir(parent).await?;
            }
            Ok(written)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }

    async fn get(
        &self,
        key: &BlobKey,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, BlobError> {
        let mut file = tokio::fs::File::open(self.path(key)?)
            .await
            .map_err(io_err)?;
        Ok(match range {
            None => ReaderStream::new(file).map_err(BodyError::Read).boxed(),
            Some(r) => {
                file.seek(SeekFrom::Start(r.start)).await.map_err(io_err)?;
                ReaderStream::new(file.take(r.len()))
                    .map_err(BodyError::Read)
                    .boxed()
            }
        })
    }

    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        match tokio::fs::remove_file(self.path(key)?).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(e)),
            _ => Ok(()),
        }
    }

    async fn head(&self, key: &BlobKey) -> Result<Option<u64>, BlobError> {
        match tokio::fs::metadata(self.path(key)?).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, BlobError> {
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut listed = Vec::new();
            let mut dirs = vec![root.clone()];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).map_err(io_err)? {
                    let entry = entry.map_err(io_err)?;
                    let path = entry.path();
                    if path.is_dir() {
                        dirs.push(path);
                    } else if let Ok(rel) = path.strip_prefix(&root) {
                        let key = rel
                            .to_string_lossy()
                            .replace(std::path::MAIN_SEPARATOR, "/");
                        if !key.starts_with(&prefix) {
                            continue;
                        }
                        match entry.metadata().and_then(|m| m.modified()) {
                            Ok(t) => listed.push(ListedBlob {
                                key,
                                modified: t.into(),
                            }),
                            // Deleted while the walk went on: not there.
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_err(e)),
                        }
                    }
                }
            }
            listed.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(listed)
        })
        .await
        .map_err(|e| BlobError::Other(e.to_string()))?
    }

    async fn ping(&self) -> Result<(), BlobError> {
        tokio::fs::metadata(&self.root)
            .await
            .map(|_| ())
            .map_err(|e| BlobError::Unavailable(e.to_string()))
    }
}
