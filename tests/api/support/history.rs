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

    pub fn kind(&self) -> Holder {
        match self {
            Self::Session(_) => Holder::Session,
            Self::Agent(_) => Holder::Agent,
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Self::Session(id) | Self::Agent(id) => id,
        }
    }
}

/// What kind of container a create makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    Session,
    Agent,
}

impl Holder {
    /// The collection's path (`/v1/sessions`, `/v1/agents`).
    pub fn path(self) -> &'static str {
        match self {
            Self::Session => "/v1/sessions",
            Self::Agent => "/v1/agents",
        }
    }

    pub fn with(self, id: String) -> Container {
        match self {
            Self::Session => Container::Session(id),
            Self::Agent => Container::Agent(id),
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
        /// Sent with another credential of the user's than their first key:
        /// the name of a key or a token the workload minted.
        via: Option<String>,
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
    /// `POST /v1/sessions` or `/v1/agents` (the suite's first containers
    /// among them); `id` is the one its answer named (`None`: unknown).
    Create {
        user: usize,
        kind: Holder,
        id: Option<String>,
    },
    /// `DELETE /v1/sessions/{id}` or `/v1/agents/{id}`: the container goes,
    /// with its links, and every file loses its back-reference to it.
    DeleteContainer {
        user: usize,
        container: Container,
    },
    /// Connect (PUT) or disconnect (DELETE) an MCP server or a toolset.
    Link {
        user: usize,
        agent: String,
        kind: LinkKind,
        link: String,
        connect: bool,
    },
    /// `POST /v1/admin/users/{id}/keys` or `/v1/me/keys` of a key named
    /// `name` (unique), the latter with the key `parent` (a name; `None`:
    /// the admin's or the user's first key).
    MintKey {
        user: usize,
        name: String,
        parent: Option<String>,
    },
    /// `DELETE /v1/me/keys/{id}` or the admin's: the key and its tokens go.
    RevokeKey {
        user: usize,
        name: String,
    },
    /// `POST /v1/tokens` with the key `parent` (a name; `None`: the user's
    /// first key); `name` is the suite's for it.
    MintToken {
        user: usize,
        name: String,
        parent: Option<String>,
    },
    /// `PATCH /v1/admin/users/{id} {"quota_bytes"}` (`None`: the default).
    SetQuota {
        user: usize,
        quota: Option<u64>,
    },
    /// `DELETE /v1/admin/users/{id}`: nothing of the user is left at the end.
    DeleteUser {
        user: usize,
    },
    /// `POST /v1/files/{file_id}/links` with the minted key or token `via`
    /// (a name); `url` is the link a 201 answered (`signed_links.rs`).
    MakeLink {
        user: usize,
        file_id: String,
        via: String,
        url: Option<String>,
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
            | Self::Create { user, .. }
            | Self::DeleteContainer { user, .. }
            | Self::Link { user, .. }
            | Self::MintKey { user, .. }
            | Self::RevokeKey { user, .. }
            | Self::MintToken { user, .. }
            | Self::SetQuota { user, .. }
            | Self::DeleteUser { user }
            | Self::MakeLink { user, .. } => *user,
        }
    }

    /// The container it names, if any (a create's only if its answer named it).
    pub fn container(&self) -> Option<Container> {
        match self {
            Self::Attach { container, .. }
            | Self::Detach { container, .. }
            | Self::DeleteContainer { container, .. } => Some(container.clone()),
            Self::Create { kind, id, .. } => Some(kind.with(id.clone()?)),
            Self::Link { agent, .. } => Some(Container::Agent(agent.clone())),
            _ => None,
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
            Self::Create {
                kind: Holder::Session,
                ..
            } => "create_session",
            Self::Create {
                kind: Holder::Agent,
                ..
            } => "create_agent",
            Self::DeleteContainer {
                container: Container::Session(_),
                ..
            } => "delete_session",
            Self::DeleteContainer {
                container: Container::Agent(_),
                ..
            } => "delete_agent",
            Self::Link { connect: true, .. } => "connect",
            Self::Link { connect: false, .. } => "disconnect",
            Self::MintKey { .. } => "mint_key",
            Self::RevokeKey { .. } => "revoke_key",
            Self::MintToken { .. } => "mint_token",
            Self::SetQuota { .. } => "set_quota",
            Self::DeleteUser { .. } => "delete_user",
            Self::MakeLink { .. } => "make_link",
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

#[cfg(test)]
impl Event {
    /// `op`, answered `answer` as soon as it was sent (the checkers' tests).
    pub fn at_once(op: Op, answer: Answer) -> Self {
        let now = Instant::now();
        Self {
            op,
            invoked: now,
            completed: now,
            answer,
            file_id: None,
        }
    }
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

/// An event as read back (`GET /v1/events`): what `event_checks.rs` holds
/// against the history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FinalEvent {
    pub seq: i64,
    /// Its `type`: `file.created`, `file.renamed`, `file.deleted`, or a
    /// session's or agent's (`container_event_checks.rs`).
    pub kind: String,
    /// The file's id, or the session's or agent's.
    pub subject: String,
    pub owner: String,
    /// What its `data` says of the file as the change left it.
    pub filename: Option<String>,
    pub size: Option<i64>,
    pub sha256: Option<String>,
    /// What a session's or agent's event says was put in or taken out:
    /// its `file_id`, `mcp_id` or `toolset_id`.
    pub member: Option<String>,
    /// A key's event's `name` (`key_event_checks.rs`).
    pub name: Option<String>,
}

#[cfg(test)]
impl FinalEvent {
    /// Event `seq` of `owner`, of type `kind` about `subject`, saying no more
    /// (the checkers' tests).
    pub fn of(seq: i64, kind: &str, subject: &str, owner: &str) -> Self {
        Self {
            seq,
            kind: kind.to_owned(),
            subject: subject.to_owned(),
            owner: owner.to_owned(),
            ..Self::default()
        }
    }
}

/// One user's state read back after healing and the final sweep.
#[derive(Clone, Debug, Default)]
pub struct FinalUser {
    pub id: String,
    /// The files the store lists for the user.
    pub files: BTreeMap<String, FinalFile>,
    /// The files `GET /v1/files` lists, every page.
    pub listed: Vec<String>,
    /// The user document: `used_bytes` and `file_count`.
    pub used_bytes: i64,
    pub file_count: i64,
    /// `GET /v1/me`'s usage: `used_bytes`, `file_count`.
    pub me: (i64, i64),
    /// The user's open uploads as counted: the user document's
    /// `(reserved_bytes, open_uploads)`, and `/v1/me`'s.
    pub counted: (i64, i64),
    pub me_counted: (i64, i64),
    /// What the resumable uploads left hold of them: the sum of their
    /// `reserved`, and how many are `open` (0 and 0 when none is left).
    pub held: (i64, i64),
    pub sessions: BTreeMap<String, Vec<String>>,
    pub agents: BTreeMap<String, FinalAgent>,
    /// The ids `GET /v1/sessions` and `GET /v1/agents` list, every page.
    pub listed_containers: Vec<Container>,
    /// Containers of the user's history the store no longer holds: the
    /// status of `GET /v1/sessions/{id}` (or `/v1/agents/{id}`).
    pub gone_containers: BTreeMap<Container, u16>,
    /// Files of the user's history no longer listed: the status of
    /// `GET /v1/files/{id}` and of its content.
    pub gone: BTreeMap<String, (u16, u16)>,
    /// The user's events (`GET /v1/events`, every page, in the order read),
    /// and what was off about the pages (a status, a cursor).
    pub events: Vec<FinalEvent>,
    pub events_off: Vec<String>,
}

impl FinalUser {
    /// Every reservation given back once: unless the user's counters (on
    /// its document and in `/v1/me`) are what the uploads left hold, what
    /// they are.
    pub fn counters_off(&self) -> Option<String> {
        let (c, m, h) = (self.counted, self.me_counted, self.held);
        (c != h || m != h).then(|| {
            let user = &self.id;
            format!("{user}: (reserved_bytes, open_uploads) {c:?}, /v1/me {m:?}, but the uploads left hold {h:?}")
        })
    }
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
    /// Of those, the ones without a part: a `CreateMultipartUpload` whose
    /// answer was lost makes one nobody names (S3's lifecycle rule removes it).
    pub multipart_empty: usize,
}
