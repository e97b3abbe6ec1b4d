//! Commands: the writes to a container (a session or an agent), each
//! self-contained so that it can travel through a queue. Like `ids`, this
//! is the domain's vocabulary: it imports nothing from the crate, and every
//! layer (ports and adapters included) may use it.

use serde::{Deserialize, Serialize};

/// What a file can be attached to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Container {
    Session(String),
    Agent(String),
}

impl Container {
    pub fn id(&self) -> &str {
        match self {
            Self::Session(id) | Self::Agent(id) => id,
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
        owner_id: String,
        container: Container,
        file_id: String,
        attached: bool,
    },
    Link {
        owner_id: String,
        agent_id: String,
        kind: LinkKind,
        link_id: String,
        connected: bool,
    },
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
