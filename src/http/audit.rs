//! The audit trail of account changes: each key created or revoked, token
//! minted, quota changed and deletion begun is logged (target
//! `filedock::audit`) with its actor and the request id, never a secret,
//! and counted in `filedock_audit_events_total{action}`.

use std::sync::Arc;

use super::error::current_request_id;
use crate::{
    meta::TokenRecord,
    metrics::{ActionLabel, Metrics},
    vocab::{KeyId, UserId},
};

/// Where audited changes are logged and counted.
#[derive(Clone)]
pub struct Audit {
    metrics: Arc<Metrics>,
}

impl Audit {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }

    /// Logs and counts one change: `actor` did `action` to `user`'s
    /// account; `detail` names what (a key id, a quota), never a secret.
    fn record(&self, action: &'static str, actor: &str, user: &UserId, detail: &str) {
        tracing::info!(
            target: "filedock::audit",
            action,
            actor,
            user_id = %user,
            detail,
            request_id = %current_request_id(),
            "audit"
        );
        self.metrics
            .audit_events
            .get_or_create(&ActionLabel {
                action: action.into(),
            })
            .inc();
    }

    pub fn key_created(&self, actor: &str, user: &UserId, key: &KeyId) {
        self.record("key_created", actor, user, &format!("key_id={key}"));
    }

    /// A token minted: its id, minting key, scopes, binding and expiry.
    pub fn token_minted(&self, actor: &str, user: &UserId, t: &TokenRecord) {
        let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
        let mut detail = format!(
            "token_id={} key_id={} scopes={} expires_at={}",
            t.id,
            t.key_id,
            scopes.join(","),
            t.expires_at.to_rfc3339()
        );
        if let Some(s) = t.session_id {
            detail.push_str(&format!(" session_id={s}"));
        }
        if let Some(a) = t.agent_id {
            detail.push_str(&format!(" agent_id={a}"));
        }
        self.record("token_minted", actor, user, &detail);
    }

    /// A user's own quota set (`None`: back to the default).
    pub fn quota_changed(&self, actor: &str, user: &UserId, quota: Option<u64>) {
        let detail = match quota {
            Some(q) => format!("quota_bytes={q}"),
            None => "quota_bytes=default".to_owned(),
        };
        self.record("quota_changed", actor, user, &detail);
    }

    /// A session or an agent deleted (`what`: `session` or `agent`).
    pub fn container_deleted(&self, actor: &str, user: &UserId, what: &str, id: &str) {
        let action = match what {
            "session" => "session_deleted",
            _ => "agent_deleted",
        };
        self.record(action, actor, user, &format!("{what}_id={id}"));
    }

    /// A user's deletion begun (by the admin).
    pub fn user_deletion_begun(&self, actor: &str, user: &UserId) {
        self.record("user_deletion_begun", actor, user, "");
    }

    pub fn key_revoked(&self, actor: &str, user: &UserId, key: &KeyId) {
        self.record("key_revoked", actor, user, &format!("key_id={key}"));
    }
}
