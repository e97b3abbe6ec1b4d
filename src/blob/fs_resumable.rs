//! `ResumableBlobs` on local files: one staging file per upload under the
//! temp dir, each part (and the tail) written at its offset and synced, the
//! file renamed into place when complete. A staging file is named after its
//! upload (`tus-{file id}{random}`), so that the sweeper can tell whether a
//! live upload still owns it.

use std::{io::SeekFrom, path::PathBuf, sync::Arc};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{FsBlobStore, io_err, sync_dir};
use crate::{
    blob::{
        BlobError, BlobStore,
        budget::MemoryBudget,
        resumable::{ResumableBlobs, Staged},
    },
    vocab::{BlobKey, FileId, WriteHandle},
};

/// What a staging file's name starts with (the rest is its handle).
const STAGING_PREFIX: &str = "tus-";
/// The length of a UUID in its simple (hex, no hyphen) form.
const SIMPLE_UUID_LEN: usize = 32;

/// The upload a handle was made for (see [`ResumableBlobs::start`] below).
fn upload_of(handle: &str) -> Option<FileId> {
    let id = handle.get(..SIMPLE_UUID_LEN)?;
    let id = uuid::Uuid::try_parse(id).ok()?;
    (handle.len() == 2 * SIMPLE_UUID_LEN)
        .then(|| FileId::parse(&id.hyphenated().to_string()))
        .flatten()
}

/// Parts are a bookkeeping unit here (the bytes go straight to the staging
/// file); this size only sets how often a PATCH syncs.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts written at once (each at its own offset of the staging file).
const PART_CONCURRENCY: usize = 4;

impl FsBlobStore {
    fn staging(&self, handle: &WriteHandle) -> Result<PathBuf, BlobError> {
        let handle = handle.as_str();
        if handle.is_empty() || !handle.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(BlobError::Other(format!(
                "invalid upload handle {handle:?}"
            )));
        }
        Ok(self.tmp.join(format!("tus-{handle}")))
    }

    async fn write_at(
        &self,
        handle: &WriteHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), BlobError> {
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .open(self.staging(handle)?)
            .await
            .map_err(io_err)?;
        file.seek(SeekFrom::Start(offset)).await.map_err(io_err)?;
        file.write_all(bytes).await.map_err(io_err)?;
        file.sync_data().await.map_err(io_err)
    }
}

/// A part's tag: where it ends, so that `complete` knows the length.
fn tag(offset: u64, len: usize) -> String {
    (offset + len as u64).to_string()
}

#[async_trait]
impl ResumableBlobs for FsBlobStore {
    fn part_size(&self) -> usize {
        PART_SIZE
    }

    fn part_concurrency(&self) -> usize {
        PART_CONCURRENCY
    }

    fn budget(&self) -> Arc<MemoryBudget> {
        self.budget.clone()
    }

    async fn start(&self, key: &BlobKey, _: Option<u64>) -> Result<WriteHandle, BlobError> {
        // The upload's id, then a random part: the sweeper reads the first.
        let upload = key.file_id().to_string().replace('-', "");
        let random = uuid::Uuid::new_v4().simple();
        let handle = WriteHandle::new(format!("{upload}{random}"));
        tokio::fs::File::create(self.staging(&handle)?)
            .await
            .map_err(io_err)?;
        sync_dir(&self.tmp).await?;
        Ok(handle)
    }

    async fn put_part(
        &self,
        _key: &BlobKey,
        handle: &WriteHandle,
        _number: i32,
        offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError> {
        self.write_at(handle, offset, &part).await?;
        Ok(tag(offset, part.len()))
    }

    async fn put_tail(
        &self,
        _key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError> {
        self.write_at(handle, start, &tail).await
    }

    async fn get_tail(
        &self,
        _key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError> {
        let mut file = tokio::fs::File::open(self.staging(handle)?)
            .await
            .map_err(io_err)?;
        file.seek(SeekFrom::Start(start)).await.map_err(io_err)?;
        let mut tail = vec![0; (end - start) as usize];
        file.read_exact(&mut tail).await.map_err(io_err)?;
        Ok(tail.into())
    }

    async fn delete_tail(
        &self,
        _: &BlobKey,
        _: &WriteHandle,
        _: u64,
        _: u64,
    ) -> Result<(), BlobError> {
        // The tail lives in the staging file; the next part overwrites it.
        Ok(())
    }

    async fn complete(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
        let tagged = match tags.last() {
            Some(t) => t
                .parse::<u64>()
                .map_err(|_| BlobError::Other(format!("bad part tag {t:?}")))?,
            None => 0,
        };
        if tagged != len {
            return Err(BlobError::Other(format!(
                "the parts end at {tagged}, not at {len}"
            )));
        }
        let staging = self.staging(handle)?;
        let file = match tokio::fs::OpenOptions::new()
            .write(true)
            .open(&staging)
            .await
        {
            Ok(f) => f,
            // Renamed into place before (the first answer was lost).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return match self.head(key).await? {
                    Some(n) if n == len => Ok(()),
                    _ => Err(io_err(e)),
                };
            }
            Err(e) => return Err(io_err(e)),
        };
        // A PATCH refused after it wrote (a checksum mismatch) may have left
        // bytes past the end.
        file.set_len(len).await.map_err(io_err)?;
        file.sync_all().await.map_err(io_err)?;
        let dest = self.path(key)?;
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(io_err)?;
        }
        tokio::fs::rename(&staging, &dest).await.map_err(io_err)?;
        // The rename is durable only once both directories are.
        if let Some(parent) = dest.parent() {
            sync_dir(parent).await?;
        }
        sync_dir(&self.tmp).await
    }

    async fn clear_staging(&self, _: &BlobKey, _: &WriteHandle) -> Result<(), BlobError> {
        // The tail lives in the staging file, which the completion renamed.
        Ok(())
    }

    async fn abort(&self, _key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        match tokio::fs::remove_file(self.staging(handle)?).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(e)),
            _ => Ok(()),
        }
    }

    async fn staged(&self, before: DateTime<Utc>) -> Result<Vec<Staged>, BlobError> {
        let tmp = self.tmp.clone();
        let listed = tokio::task::spawn_blocking(move || {
            let mut listed = Vec::new();
            for entry in std::fs::read_dir(&tmp).map_err(io_err)? {
                let entry = entry.map_err(io_err)?;
                let modified = match entry.metadata().and_then(|m| m.modified()) {
                    Ok(t) => DateTime::<Utc>::from(t),
                    // Gone while listed (renamed into place, removed).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err(e)),
                };
                if modified >= before {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                listed.push(match name.strip_prefix(STAGING_PREFIX) {
                    Some(handle) => Staged::Write {
                        upload: upload_of(handle),
                        handle: WriteHandle::new(handle),
                    },
                    None => Staged::Temp(name),
                });
            }
            Ok(listed)
        });
        listed.await.map_err(|e| BlobError::Other(e.to_string()))?
    }

    async fn remove_staged(&self, staged: &Staged) -> Result<(), BlobError> {
        let path = match staged {
            Staged::Write { handle, .. } => self.staging(handle)?,
            Staged::Temp(name) if !name.contains(['/', '\\']) && !name.starts_with('.') => {
                self.tmp.join(name)
            }
            Staged::Temp(name) => {
                return Err(BlobError::Other(format!("not a temporary file: {name:?}")));
            }
            // Tails live in the staging file here.
            Staged::Tail(_) => return Ok(()),
        };
        match tokio::fs::remove_file(path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(e)),
            _ => Ok(()),
        }
    }
}
