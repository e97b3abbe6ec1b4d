//! Users on MongoDB.

use async_trait::async_trait;
use bson::doc;

use super::{MongoStore, errors::classify};
use crate::{
    meta::{MetaResult, UserRecord, UserRepo},
    vocab::{ApiKeyHash, UserId},
};

#[async_trait]
impl UserRepo for MongoStore {
    async fn insert_user(&self, user: &UserRecord) -> MetaResult<()> {
        self.users()
            .insert_one(user)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn user(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        self.users()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn user_by_key_hash(&self, hash: &ApiKeyHash) -> MetaResult<Option<UserRecord>> {
        self.users()
            .find_one(doc! {"api_key_hash": hash})
            .await
            .map_err(classify)
    }
}
