//! [`Announced`] keys: a key's minting and revocation write events, and
//! ring the bell as the files' do.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::announced::{Announced, unknown};
use crate::{
    meta::{ApiKeyRecord, KeyMint, KeyRepo, MetaResult, TokenRecord, UserRecord},
    vocab::{ApiKeyHash, KeyId, UserId},
};

#[async_trait]
impl KeyRepo for Announced<dyn KeyRepo> {
    async fn insert_key(&self, key: &ApiKeyRecord, mint: KeyMint<'_>) -> MetaResult<()> {
        let r = self.inner.insert_key(key, mint).await;
        let written = u64::from(r.is_ok());
        self.announce(&key.user_id, written, unknown(&r)).await;
        r
    }

    async fn key_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>> {
        self.inner.key_by_hash(hash).await
    }

    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
        self.inner.key(user, id).await
    }

    async fn keys(
        &self,
        user: &UserId,
        after: Option<&KeyId>,
        limit: usize,
    ) -> MetaResult<Vec<ApiKeyRecord>> {
        self.inner.keys(user, after, limit).await
    }

    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
        let r = self.inner.delete_key(user, id).await;
        let written = u64::from(matches!(r, Ok(true)));
        self.announce(user, written, unknown(&r)).await;
        r
    }

    async fn insert_token(&self, token: &TokenRecord, max_live: usize) -> MetaResult<()> {
        self.inner.insert_token(token, max_live).await
    }

    async fn token_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(TokenRecord, UserRecord)>> {
        self.inner.token_by_hash(hash).await
    }

    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
        self.inner.delete_expired_tokens(before).await
    }
}
