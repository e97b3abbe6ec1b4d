//! The fault suite's history: every request it sent and the answer it got
//! (Jepsen's method), and the state read back at the end. The checker
//! (`checker.rs`) holds the one against the other.

use std::{collections::BTreeMap, fmt, time::Instant};

use crate::support::model::Told;

/// What a client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: it happened.
    Ok,
    /// 4xx or 503: it did not happen (the code says why).
    Failed(String),
    /// 504 `outcome_unknown`, or no answer at all: it may have happened.
    Unknown(String),
    /// 500: a bug. Whatever it did, the run fails.
    Internal(String),
}

impl Answer {
    pub fn told(&self) -> Told {
        match self {
            Self::Ok => Told::Ok,
            Self::Failed(_) => Told::Failed,
            Self::Unknown(_) | Self::Internal(_) => Told::Maybe,
        }
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Ok => None,
            Self::Failed(c) | Self::Unknown(c) | Self::Internal(c) => Some(c),
        }
    }
}

/// Where a file can be attached.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Container {
    Session(String),
    Agent(String),
}

impl Container {
    pub fn path(&self) -> String {
        match self {
            Self::Session(id) => format!("/v1/sessions/{id}"),
            Self::Agent(id) => format!("/v1/agents/{id}"),
        }
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session(id) => write!(f, "session {id}"),
            Self::Agent(id) => write!(f, "agent {id}"),
        }
    }
}

/// What an agent connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkKind {
    Mcp,
    Toolset,
}

impl LinkKind {
    /// The path segment (`/v1/agents/{id}/{segment}/{link}`).
    pub fn segment(self) -> &'static str {
        match self {
            Self::Mcp => "mcps",
            Self::Toolset => "toolsets",
        }
    }
}

/// One request of the workload. A new kind of write joins here, in the
/// workload (`workload.rs`) and in the checker's `effects`.
#[derive(Clone, Debug)]
pub enum Op {
    /// `name` is unique per upload (its resends share it), so an upload
    /// whose answer was lost can be found by it.
    Upload {
        user: usize,
        name: String,
        sha256: String,
        size: u64,
        /// The `Idempotency-Key` it was sent with, if any.
        key: Option<String>,
        /// 0, then 1, 2… for resends with the same key.
        attempt: u32,
        /// A resumable (tus) upload: all its PATCHes and HEADs as one write.
        resumable: bool,
    },
    Delete {
        user: usize,
        file_id: String,
    },
    /// `name` is unique per rename, so the rename a file's name came from is known.
    Rename {
        user: usize,
        file_id: String,
        name: String,
    },
    Attach {
        user: usize,
        container: Container,
        file_id: String,
    },
    Detach {
        user: usize,
        container: Container,
        file_id: String,
    },
    /// Connect (PUT) or disconnect (DELETE) an MCP server or a toolset.
    Link {
        user: usize,
        agent: String,
        kind: LinkKind,
        link: String,
        connect: bool,
    },
}

impl Op {
    pub fn user(&self) -> usize {
        match self {
            Self::Upload { user, .. }
            | Self::Delete { user, .. }
            | Self::Rename { user, .. }
            | Self::Attach { user, .. }
            | Self::Detach { user, .. }
            | Self::Link { user, .. } => *user,
        }
    }

    /// The kind, for the tallies.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Upload {
                resumable: true, ..
            } => "tus",
            Self::Upload { attempt: 0, .. } => "upload",
            Self::Upload { .. } => "resend",
            Self::Delete { .. } => "delete",
            Self::Rename { .. } => "rename",
            Self::Attach { .. } => "attach",
            Self::Detach { .. } => "detach",
            Self::Link { connect: true, .. } => "connect",
            Self::Link { connect: false, .. } => "disconnect",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Event {
    pub op: Op,
    pub invoked: Instant,
    pub completed: Instant,
    pub answer: Answer,
    /// The id an acknowledged upload got.
    pub file_id: Option<String>,
}

/// A file as read back.
#[derive(Clone, Debug)]
pub struct FinalFile {
    pub name: String,
    pub size: i64,
    /// The SHA-256 its record holds, and that of the bytes downloaded
    /// (`None` if the download failed).
    pub sha256: String,
    pub downloaded: Option<String>,
    /// The containers its record says it is in (so a delete can detach it).
    pub sessions: Vec<String>,
    pub agents: Vec<String>,
}

/// An agent as read back.
#[derive(Clone, Debug, Default)]
pub struct FinalAgent {
    pub files: Vec<String>,
    pub mcps: Vec<String>,
    pub toolsets: Vec<String>,
}

/// One user's state read back after healing and the final sweep.
#[derive(Clone, Debug, Default)]
pub struct FinalUser {
    pub id: String,
    /// The files the store lists for the user.
    pub files: BTreeMap<String, FinalFile>,
    /// The files `GET /v1/files` lists, every page.
    pub listed: Vec<String>,
    /// The user document: `used_bytes` and `file_ids`.
    pub used_bytes: i64,
    pub file_ids: Vec<String>,
    /// `GET /v1/me`'s usage: `used_bytes`, `file_count`.
    pub me: (i64, i64),
    pub sessions: BTreeMap<String, Vec<String>>,
    pub agents: BTreeMap<String, FinalAgent>,
    /// Files of the user's history no longer listed: the status of
    /// `GET /v1/files/{id}` and of its content.
    pub gone: BTreeMap<String, (u16, u16)>,
}

/// Everything read back.
#[derive(Clone, Debug, Default)]
pub struct FinalState {
    pub users: Vec<FinalUser>,
    /// Every permission: (file id, user id, role).
    pub permissions: Vec<(String, String, String)>,
    /// Every idempotency record: (user id, key, file id).
    pub idempotency: Vec<(String, String, String)>,
    /// The object key of every orphan record, whatever its status.
    pub orphans: std::collections::BTreeSet<String>,
    /// Objects without a record, records without an object, intents left.
    pub strays: usize,
    pub missing: usize,
    pub intents: usize,
    /// What resumable uploads left after their expiry and a sweep: states,
    /// staging objects (tails), and multipart uploads on the S3 server's
    /// disk (`None`: its directory is not known).
    pub resumables: usize,
    pub staging: usize,
    pub multipart: Option<usize>,
}
