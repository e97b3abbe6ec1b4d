//! Commands: the writes to a container (a session or an agent), each
//! self-contained so that it can travel through a queue, and what each one
//! takes: its lock (also its queue routing key), its fence slot, the
//! resource a client reads to see it.

use serde::{Deserialize, Serialize};

use super::{
    ids::{AgentId, FileId, LinkId, SessionId, UserId},
    keys::LockKey,
};

/// What a file can be attached to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Container {
    Session(SessionId),
    Agent(AgentId),
}

impl Container {
    /// The container's id, as its key and its documents write it.
    pub fn id(&self) -> String {
        match self {
            Self::Session(id) => id.to_string(),
            Self::Agent(id) => id.to_string(),
        }
    }

    /// The collection (and embedded key prefix) the container lives in.
    pub fn collection(&self) -> &'static str {
        match self {
            Self::Session(_) => "sessions",
            Self::Agent(_) => "agents",
        }
    }
}

/// A write to a container, self-contained so that it can travel through a queue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Operation {
    Attach {
        owner_id: UserId,
        container: Container,
        file_id: FileId,
        attached: bool,
    },
    Link {
        owner_id: UserId,
        agent_id: AgentId,
        kind: LinkKind,
        link_id: LinkId,
        connected: bool,
    },
    /// Deletes the container: its file links and (an agent's) connections
    /// go with it; each file it names loses its back-reference.
    Delete {
        owner_id: UserId,
        container: Container,
    },
}

impl Operation {
    /// The lock this write takes on the direct path; also its queue routing key.
    pub fn lock_key(&self) -> LockKey {
        match self {
            // A delete takes the lock attaches take: the two never
            // interleave, so no attach leaves a back-reference to a
            // container deleted under it.
            Self::Attach { container, .. } | Self::Delete { container, .. } => match container {
                Container::Session(id) => LockKey::session_files(id),
                Container::Agent(id) => LockKey::agent_files(id),
            },
            Self::Link { agent_id, .. } => LockKey::agent_config(agent_id),
        }
    }

    /// The resource a client reads to see whether this write applied.
    pub fn resource_path(&self) -> String {
        match self {
            Self::Attach { container, .. } | Self::Delete { container, .. } => match container {
                Container::Session(id) => format!("/v1/sessions/{id}"),
                Container::Agent(id) => format!("/v1/agents/{id}"),
            },
            Self::Link { agent_id: id, .. } => format!("/v1/agents/{id}"),
        }
    }

    /// The fencing-token slot on the container this write checks.
    pub fn fence_slot(&self) -> &'static str {
        match self {
            Self::Attach { .. } | Self::Delete { .. } => "files",
            Self::Link { .. } => "config",
        }
    }

    /// The owner of what it writes to.
    pub fn owner_id(&self) -> &UserId {
        match self {
            Self::Attach { owner_id, .. }
            | Self::Link { owner_id, .. }
            | Self::Delete { owner_id, .. } => owner_id,
        }
    }

    /// The array this write adds a member to, and the member as stored;
    /// `None` for a detach or a disconnect, which never grow a container.
    pub fn added_member(&self) -> Option<(&'static str, String)> {
        match self {
            Self::Attach {
                file_id,
                attached: true,
                ..
            } => Some(("file_ids", file_id.to_string())),
            Self::Link {
                kind,
                link_id,
                connected: true,
                ..
            } => Some((kind.field(), link_id.as_str().to_owned())),
            _ => None,
        }
    }

    /// The name its transactions are counted under.
    pub fn metric_op(&self) -> &'static str {
        match self {
            Self::Attach {
                container: Container::Session(_),
                ..
            } => "session_files",
            Self::Attach {
                container: Container::Agent(_),
                ..
            } => "agent_files",
            Self::Link { .. } => "agent_config",
            Self::Delete {
                container: Container::Session(_),
                ..
            } => "delete_session",
            Self::Delete {
                container: Container::Agent(_),
                ..
            } => "delete_agent",
        }
    }
}

/// An agent's connection lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    Mcp,
    Toolset,
}

impl LinkKind {
    pub fn field(self) -> &'static str {
        match self {
            Self::Mcp => "mcp_ids",
            Self::Toolset => "toolset_ids",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_as_json() {
        let op = Operation::Link {
            owner_id: UserId::new(),
            agent_id: AgentId::new(),
            kind: LinkKind::Mcp,
            link_id: LinkId::parse("github").unwrap(),
            connected: true,
        };
        let json = serde_json::to_string(&op).unwrap();
        assert_eq!(serde_json::from_str::<Operation>(&json).unwrap(), op);
    }
}
