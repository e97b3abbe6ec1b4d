//! Users in the embedded store.

use async_trait::async_trait;

use super::{EmbeddedStore, user_key};
use crate::meta::{MetaResult, UserRecord, UserRepo};

#[async_trait]
impl UserRepo for EmbeddedStore {
    async fn insert_user(&self, user: &UserRecord) -> MetaResult<()> {
        let user = user.clone();
        self.transaction(move |tx| {
            tx.insert(&format!("api_keys/{}", user.api_key_hash), &user.id)?;
            tx.insert(&user_key(&user.id), &user)
        })
        .await
    }

    async fn user(&self, id: &str) -> MetaResult<Option<UserRecord>> {
        let key = user_key(id);
        self.transaction(move |tx| tx.get(&key)).await
    }

    async fn user_by_key_hash(&self, hash: &str) -> MetaResult<Option<UserRecord>> {
        let key = format!("api_keys/{hash}");
        self.transaction(move |tx| match tx.get::<String>(&key)? {
            Some(id) => tx.get(&user_key(&id)),
            None => Ok(None),
        })
        .await
    }
}
