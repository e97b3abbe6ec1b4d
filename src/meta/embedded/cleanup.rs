//! Upload intents and orphans in the embedded store.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::EmbeddedStore;
use crate::{
    meta::{
        CleanupRepo, IntentRecord, MetaCounts, MetaError, MetaResult, OrphanRecord, OrphanStatus,
        now,
    },
    vocab::{BlobKey, FileId, OrphanId, UserId},
};

/// Intent `file_id`, if it is `owner`'s (another user's is not found, as
/// MongoDB's filter on both finds none).
fn owned_intent(
    tx: &mut super::txn::Txn,
    owner: &UserId,
    file_id: &FileId,
) -> MetaResult<Option<IntentRecord>> {
    let found = tx.get::<IntentRecord>(&format!("intents/{file_id}"))?;
    Ok(found.filter(|i| &i.user_id == owner))
}

#[async_trait]
impl CleanupRepo for EmbeddedStore {
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        let intent = intent.clone();
        self.transaction(move |tx| tx.insert(&format!("intents/{}", intent.id), &intent))
            .await
    }

    async fn put_intents(&self, intents: &[IntentRecord]) -> MetaResult<()> {
        let intents = intents.to_vec();
        self.transaction(move |tx| {
            for intent in &intents {
                tx.insert(&format!("intents/{}", intent.id), intent)?;
            }
            Ok(())
        })
        .await
    }

    async fn delete_intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<()> {
        let (owner, file_id) = (*owner, *file_id);
        self.transaction(move |tx| {
            if owned_intent(tx, &owner, &file_id)?.is_some() {
                tx.delete(&format!("intents/{file_id}"));
            }
            Ok(())
        })
        .await
    }

    async fn intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<Option<IntentRecord>> {
        let (owner, file_id) = (*owner, *file_id);
        self.transaction(move |tx| owned_intent(tx, &owner, &file_id))
            .await
    }

    async fn intent_by_id_alone(&self, file_id: &FileId) -> MetaResult<Option<IntentRecord>> {
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

    async fn touch_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        until: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<IntentRecord>> {
        let (owner, file_id) = (*owner, *file_id);
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| {
            let Some(mut intent) = owned_intent(tx, &owner, &file_id)? else {
                return Ok(None);
            };
            intent.refreshed_at = Some(now());
            if until.is_some() {
                intent.alive_until = until;
            }
            tx.put(&key, &intent)?;
            Ok(Some(intent))
        })
        .await
    }

    async fn abandon_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        stale_before: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<OrphanRecord>> {
        let (owner, file_id) = (*owner, *file_id);
        let key = format!("intents/{file_id}");
        self.transaction(move |tx| {
            let Some(intent) = owned_intent(tx, &owner, &file_id)? else {
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

    async fn record_orphan(&self, orphan: &OrphanRecord) -> MetaResult<()> {
        let orphan = orphan.clone();
        self.transaction(move |tx| tx.put(&format!("orphans/{}", orphan.id), &orphan))
            .await
    }

    async fn mark_orphan(
        &self,
        id: &OrphanId,
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

    async fn pending_orphan(&self, key: &BlobKey) -> MetaResult<bool> {
        let pending = self
            .orphans(Some(OrphanStatus::Pending), usize::MAX)
            .await?;
        Ok(pending.iter().any(|o| &o.key == key))
    }
}
