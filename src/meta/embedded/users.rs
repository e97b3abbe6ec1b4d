//! Users in the embedded store.

use async_trait::async_trait;

use super::{EmbeddedStore, user_key};
use crate::{
    meta::{MetaResult, UserRecord, UserRepo},
    vocab::{ApiKeyHash, UserId},
};

#[async_trait]
impl UserRepo for EmbeddedStore {
    async fn insert_user(&self, user: &UserRecord) -> MetaResult<()> {
        let user = user.clone();
        self.transaction(move |tx| {
            tx.insert(
                &format!("api_keys/{}", user.api_key_hash.as_str()),
                &user.id,
            )?;
            tx.insert(&user_key(&user.id), &user)
        })
        .await
    }

    async fn user(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        let key = user_key(id);
        self.transaction(move |tx| tx.get(&key)).await
    }

    async fn user_by_key_hash(&self, hash: &ApiKeyHash) -> MetaResult<Option<UserRecord>> {
        let key = format!("api_keys/{}", hash.as_str());
        self.transaction(move |tx| match tx.get::<UserId>(&key)? {
            Some(id) => tx.get(&user_key(&id)),
            None => Ok(None),
        })
        .await
    }
}
