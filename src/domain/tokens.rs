//! Short-lived scoped tokens (`POST /v1/tokens`): a bearer secret for a
//! browser or another less trusted client, carrying a subset of its user's
//! rights (some scopes, perhaps one session or agent only) for at most
//! `FILEDOCK_TOKEN_MAX_SECS`. A token is stored as its SHA-256 under the key
//! that minted it: revoking the key revokes its tokens (authentication
//! checks that the key still exists, within the auth cache's lifetime).

use std::{sync::Arc, time::Duration};

use super::{
    DomainError,
    auth::Caller,
    settle::OwnedInserts,
    users::{hash_key, secret_with_prefix},
};
use crate::{
    meta::{ContainerRepo, KeyRepo, TokenRecord},
    vocab::{AgentId, KeyId, Scope, SessionId},
};

pub use super::auth::TOKEN_PREFIX;

/// A token's lifetime when the request names none (capped by the maximum).
pub const DEFAULT_TOKEN_SECS: u64 = 15 * 60;

/// What a mint asks for.
pub struct MintRequest {
    pub scopes: Vec<Scope>,
    pub expires_in: Option<u64>,
    pub session_id: Option<SessionId>,
    pub agent_id: Option<AgentId>,
}

/// A token just minted: its record and its secret (shown once).
pub struct NewToken {
    pub record: TokenRecord,
    pub secret: String,
}

/// Mints tokens; holds the ports that takes.
pub struct TokenService {
    keys: Arc<dyn KeyRepo>,
    containers: Arc<dyn ContainerRepo>,
    max_lifetime: Duration,
    /// `FILEDOCK_MAX_TOKENS_PER_USER`: live tokens one user may hold.
    max_live: usize,
    /// A mint writes the owner's document, under their commit lock.
    inserts: OwnedInserts,
}

impl TokenService {
    pub fn new(
        keys: Arc<dyn KeyRepo>,
        containers: Arc<dyn ContainerRepo>,
        (max_lifetime, max_live): (Duration, usize),
        inserts: OwnedInserts,
    ) -> Self {
        Self {
            keys,
            containers,
            max_lifetime,
            max_live,
            inserts,
        }
    }

    /// Mints a token for `caller`, who must hold a key (a token cannot mint
    /// another: it could only pass on what it has, and would outlive its
    /// own expiry's intent). The session or agent named must be the caller's.
    pub async fn mint(&self, caller: &Caller, req: MintRequest) -> Result<NewToken, DomainError> {
        if caller.grant.is_token() {
            return Err(DomainError::Forbidden(
                "a token cannot mint tokens; use an API key".into(),
            ));
        }
        let mut scopes = req.scopes;
        scopes.sort();
        scopes.dedup();
        if scopes.is_empty() {
            return Err(DomainError::InvalidRequest(
                "scopes must name at least one scope".into(),
            ));
        }
        // The events are the whole account's, not one session's or agent's.
        if scopes.contains(&Scope::EventsRead)
            && (req.session_id.is_some() || req.agent_id.is_some())
        {
            return Err(DomainError::InvalidRequest(
                "events:read cannot be given to a token bound to a session or an agent".into(),
            ));
        }
        let max = self.max_lifetime.as_secs();
        let secs = req.expires_in.unwrap_or(DEFAULT_TOKEN_SECS.min(max));
        if !(1..=max).contains(&secs) {
            return Err(DomainError::InvalidRequest(format!(
                "expires_in must be between 1 and {max} seconds (FILEDOCK_TOKEN_MAX_SECS)"
            )));
        }
        let owner = &caller.user.id;
        if let Some(s) = &req.session_id {
            self.containers
                .session(owner, s)
                .await?
                .ok_or(DomainError::NotFound)?;
        }
        if let Some(a) = &req.agent_id {
            self.containers
                .agent(owner, a)
                .await?
                .ok_or(DomainError::NotFound)?;
        }
        let secret = secret_with_prefix(TOKEN_PREFIX);
        let now = crate::meta::now();
        let record = TokenRecord {
            id: KeyId::new(),
            hash: hash_key(&secret),
            user_id: *owner,
            key_id: caller.key_id,
            scopes,
            session_id: req.session_id,
            agent_id: req.agent_id,
            created_at: now,
            expires_at: now + chrono::Duration::seconds(secs as i64),
        };
        // Sent again with the same record while its outcome is unknown: a
        // token answered as failed is never one that was stored. Refused if
        // the caller's key was revoked meanwhile (another instance may still
        // remember it): the check is in the transaction that inserts.
        let what = ("insert_token", None);
        (self.inserts)
            .insert(owner, what, || {
                self.keys.insert_token(&record, self.max_live)
            })
            .await?;
        Ok(NewToken { record, secret })
    }
}
