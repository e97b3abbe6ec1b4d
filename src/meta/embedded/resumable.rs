//! Resumable uploads in the embedded store.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::EmbeddedStore;
use crate::{
    meta::{MetaError, MetaResult, ResumableRecord, ResumableRepo},
    vocab::FileId,
};

fn resumable_key(id: &FileId) -> String {
    format!("resumables/{id}")
}

#[async_trait]
impl ResumableRepo for EmbeddedStore {
    async fn insert_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        let upload = upload.clone();
        self.transaction(move |tx| tx.insert(&resumable_key(&upload.id), &upload))
            .await
    }

    async fn resumable(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        let key = resumable_key(id);
        self.transaction(move |tx| tx.get::<ResumableRecord>(&key))
            .await
    }

    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected_offset: i64,
    ) -> MetaResult<bool> {
        let upload = upload.clone();
        let advanced = self
            .transaction(move |tx| {
                let key = resumable_key(&upload.id);
                match tx.get::<ResumableRecord>(&key)? {
                    Some(now) if now.offset == expected_offset => {
                        tx.put(&key, &upload)?;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            })
            .await;
        match advanced {
            // Another PATCH committed the same record first.
            Err(MetaError::WriteConflict) => Ok(false),
            r => r,
        }
    }

    async fn delete_resumable(&self, id: &FileId) -> MetaResult<()> {
        let key = resumable_key(id);
        self.transaction(move |tx| {
            tx.delete(&key);
            Ok(())
        })
        .await
    }

    async fn delete_resumable_if_expires(
        &self,
        id: &FileId,
        expires_at: DateTime<Utc>,
    ) -> MetaResult<bool> {
        let key = resumable_key(id);
        let deleted = self
            .transaction(move |tx| match tx.get::<ResumableRecord>(&key)? {
                Some(r) if r.expires_at == expires_at => {
                    tx.delete(&key);
                    Ok(true)
                }
                _ => Ok(false),
            })
            .await;
        match deleted {
            // A PATCH wrote it at the same moment: it renewed it.
            Err(MetaError::WriteConflict) => Ok(false),
            r => r,
        }
    }

    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>> {
        self.transaction(move |tx| {
            let mut out = Vec::new();
            for k in tx.keys("resumables/", None, usize::MAX)? {
                if let Some(r) = tx.get::<ResumableRecord>(&k)?
                    && r.expires_at < before
                {
                    out.push(r);
                }
            }
            out.sort_by_key(|r: &ResumableRecord| r.expires_at);
            out.truncate(limit);
            Ok(out)
        })
        .await
    }
}
