//! The embedded store's keys, watched, for the domain's unit tests of
//! authentication: a lookup by hash can stall after it has read (a pause,
//! a slow link), and the reads of one key by id are counted.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::{
    meta::{
        ApiKeyRecord, KeyMint, KeyRepo, MetaResult, TokenRecord, UserRecord,
        embedded::EmbeddedStore,
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

pub(crate) struct WatchedKeys {
    store: Arc<EmbeddedStore>,
    /// How long a lookup by hash stalls once it has read.
    stall: Duration,
    /// Told when a lookup by hash has read.
    pub read: Notify,
    key_reads: AtomicUsize,
}

impl WatchedKeys {
    /// `store`'s keys, a lookup by hash stalling `stall` after its read.
    pub fn new(store: Arc<EmbeddedStore>, stall: Duration) -> Self {
        Self {
            store,
            stall,
            read: Notify::new(),
            key_reads: AtomicUsize::new(0),
        }
    }

    /// How many reads of one key by id were made.
    pub fn key_reads(&self) -> usize {
        self.key_reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl KeyRepo for WatchedKeys {
    async fn insert_key(&self, key: &ApiKeyRecord, mint: KeyMint<'_>) -> MetaResult<()> {
        self.store.insert_key(key, mint).await
    }
    async fn key_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>> {
        let read = self.store.key_by_hash(hash).await;
        self.read.notify_one();
        tokio::time::sleep(self.stall).await;
        read
    }
    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
        self.key_reads.fetch_add(1, Ordering::SeqCst);
        self.store.key(user, id).await
    }
    async fn keys(
        &self,
        user: &UserId,
        after: Option<&KeyId>,
        limit: usize,
    ) -> MetaResult<Vec<ApiKeyRecord>> {
        self.store.keys(user, after, limit).await
    }
    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
        self.store.delete_key(user, id).await
    }
    async fn insert_token(&self, token: &TokenRecord, max_live: usize) -> MetaResult<()> {
        self.store.insert_token(token, max_live).await
    }
    async fn token_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(TokenRecord, UserRecord)>> {
        self.store.token_by_hash(hash).await
    }
    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
        self.store.delete_expired_tokens(before).await
    }
}
