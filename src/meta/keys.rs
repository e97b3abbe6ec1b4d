//! API keys: the `KeyRepo` port and its record. A user holds any number of
//! keys; each is stored as the SHA-256 of its secret, under its own id, so
//! that one can be listed and revoked without the others.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    error::MetaResult,
    records::{UserRecord, bson_time},
};
use crate::vocab::{AgentId, ApiKeyHash, KeyId, Scope, SessionId, UserId};

/// The name of the key a user is created with, and of a key carried over
/// from a store where a user had only one.
pub const FIRST_KEY_NAME: &str = "default";

/// `api_keys`: one key of a user.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ApiKeyRecord {
    #[serde(rename = "_id")]
    pub id: KeyId,
    pub user_id: UserId,
    /// What the user calls it (`default` for the key made with the user).
    pub name: String,
    /// SHA-256 (hex) of the secret; the secret itself is never stored.
    pub hash: ApiKeyHash,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
}

/// `api_tokens`: a short-lived token, minted by one of its user's keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenRecord {
    #[serde(rename = "_id")]
    pub id: KeyId,
    /// SHA-256 (hex) of the secret; the secret itself is never stored.
    pub hash: ApiKeyHash,
    pub user_id: UserId,
    /// The key that minted it: revoking the key revokes the token.
    pub key_id: KeyId,
    pub scopes: Vec<Scope>,
    /// The one session it may touch, if bound to one.
    #[serde(default)]
    pub session_id: Option<SessionId>,
    /// The one agent it may touch, if bound to one.
    #[serde(default)]
    pub agent_id: Option<AgentId>,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "bson_time")]
    pub expires_at: DateTime<Utc>,
}

/// How long a revoked key's id is kept (see [`KeyRepo::insert_key`]):
/// far longer than any resend of an insert lasts (the settle window).
pub const REVOKED_KEPT: chrono::Duration = chrono::Duration::hours(1);

/// What the insert of a key checks in its transaction, besides its user.
#[derive(Clone, Copy, Debug)]
pub struct KeyMint<'a> {
    /// The key that asks for it (`None`: the admin): `MinterRevoked` if it
    /// no longer exists. The insert writes it, so that its revocation
    /// committing meanwhile conflicts with the insert instead of missing it.
    pub by: Option<&'a KeyId>,
    /// The most keys the user may hold: `TooManyKeys` past it.
    pub max: usize,
}

/// Keys and the users they belong to.
#[async_trait]
pub trait KeyRepo: Send + Sync {
    /// Adds a key to its user, in one transaction with a write of the user
    /// document (so that it cannot slip past the user's deletion, and
    /// concurrent inserts count one another); `UserDeleting` if the user is
    /// gone or being deleted, `MinterRevoked` or `TooManyKeys` as
    /// [`KeyMint`] says, `Duplicate` if a key with its id is stored or was
    /// revoked within [`REVOKED_KEPT`] (a resend of an insert that applied:
    /// it is never stored again once revoked).
    async fn insert_key(&self, key: &ApiKeyRecord, mint: KeyMint<'_>) -> MetaResult<()>;

    /// The key whose secret hashes to `hash`, and its user (without the
    /// user's file list).
    async fn key_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>>;

    /// The key `id`, if it is `user`'s.
    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>>;

    /// The user's keys, oldest first: at most `limit`, after the key
    /// `after` if given.
    async fn keys(
        &self,
        user: &UserId,
        after: Option<&KeyId>,
        limit: usize,
    ) -> MetaResult<Vec<ApiKeyRecord>>;

    /// Deletes the user's key `id` and the tokens it minted; `false` if
    /// they have no such key.
    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool>;

    /// Adds a token, in one transaction with a write of its user's document
    /// and of the key that mints it, as [`KeyRepo::insert_key`] does:
    /// `MinterRevoked` if that key is gone, `TooManyTokens` if the user
    /// would hold more than `max_live` tokens that have not expired.
    async fn insert_token(&self, token: &TokenRecord, max_live: usize) -> MetaResult<()>;

    /// The token whose secret hashes to `hash` and its user (without the
    /// file list), if the key that minted it still exists (expired or not:
    /// the caller checks the expiry).
    async fn token_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(TokenRecord, UserRecord)>>;

    /// Deletes the tokens that expired before `before`, and the ids of keys
    /// revoked [`REVOKED_KEPT`] before it; how many tokens.
    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64>;
}
