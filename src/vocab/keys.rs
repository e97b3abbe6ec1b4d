//! The names the ports keep things under: lock keys. Like the ids they are
//! built from, they are vocabulary every layer may use.

/// A lock's name and level. Ids sit in `{…}` so that every key of one
/// resource maps to one Redis Cluster slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    key: String,
    level: &'static str,
}

impl LockKey {
    /// `user_file_upload_lock:{user}:{small|medium|large}`: uploads and deletes.
    pub fn user_upload(user: &impl std::fmt::Display, category: &str) -> Self {
        Self {
            key: format!("user_file_upload_lock:{{{user}}}:{category}"),
            level: "user",
        }
    }

    /// `user_file_upload_lock:{user}:commit`: held only around a transaction
    /// that writes the user document (an upload's commit, a delete), taken
    /// after the category lock. Every category's commits write that one
    /// document, so they are serialized here rather than left to conflict.
    pub fn user_commit(user: &impl std::fmt::Display) -> Self {
        Self {
            key: format!("user_file_upload_lock:{{{user}}}:commit"),
            level: "user",
        }
    }

    /// `session_file_add_lock:{session}`.
    pub fn session_files(session: &str) -> Self {
        Self {
            key: format!("session_file_add_lock:{{{session}}}"),
            level: "session",
        }
    }

    /// `agent_file_add_lock:{agent}`.
    pub fn agent_files(agent: &str) -> Self {
        Self {
            key: format!("agent_file_add_lock:{{{agent}}}"),
            level: "agent",
        }
    }

    /// `agent_config_lock:{agent}`: MCP and toolset connections.
    pub fn agent_config(agent: &str) -> Self {
        Self {
            key: format!("agent_config_lock:{{{agent}}}"),
            level: "agent_config",
        }
    }

    /// `filedock_queue_lease:{b}`: the one consumer of queue bucket `b`.
    pub fn queue_bucket(b: u32) -> Self {
        Self {
            key: format!("filedock_queue_lease:{{{b}}}"),
            level: "queue_bucket",
        }
    }

    /// `filedock_resumable_lock:{upload}`: one PATCH (or termination, or
    /// expiry) at a time on a resumable upload.
    pub fn resumable(upload: &str) -> Self {
        Self {
            key: format!("filedock_resumable_lock:{{{upload}}}"),
            level: "resumable",
        }
    }

    /// `filedock_sweeper_lock:{sweeper}`: one sweeper at a time.
    pub fn sweeper() -> Self {
        Self {
            key: "filedock_sweeper_lock:{sweeper}".into(),
            level: "sweeper",
        }
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The lock level, for metrics.
    pub fn level(&self) -> &'static str {
        self.level
    }
}
