//! The names the ports keep things under: object keys ([`BlobKey`]), a
//! blob store's handle on a write in progress ([`WriteHandle`]) and lock
//! keys ([`LockKey`]). Like the ids they are built from, they are vocabulary
//! every layer may use.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ids::{FileId, UserId};

/// Where an object lives in the blob store: every key filedock writes is
/// built here, and a stored key is read back here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobKey {
    /// A file's bytes: `files/{user}/{file}` (keys spread by id, no listing
    /// on a hot path).
    File { user: UserId, file: FileId },
    /// Bytes `start..end` of a resumable upload to a file's key, staged
    /// beside it until the next PATCH continues them (S3):
    /// `tus/files/{user}/{file}/tail-{start}-{end}`.
    Tail {
        user: UserId,
        file: FileId,
        start: u64,
        end: u64,
    },
}

impl BlobKey {
    /// Every file's key starts with this (audits list it).
    pub const FILES: &'static str = "files/";

    pub fn file(user: UserId, file: FileId) -> Self {
        Self::File { user, file }
    }

    /// The tail `start..end` of the resumable upload to this file's key.
    pub fn tail(&self, start: u64, end: u64) -> Self {
        let (user, file) = (self.user(), self.file_id());
        Self::Tail {
            user,
            file,
            start,
            end,
        }
    }

    /// The prefix under which the tails of the resumable upload to this
    /// file's key are staged: `tus/files/{user}/{file}/`.
    pub fn staging_prefix(&self) -> String {
        format!("tus/{}/", Self::file(self.user(), self.file_id()))
    }

    pub fn user(&self) -> UserId {
        match self {
            Self::File { user, .. } | Self::Tail { user, .. } => *user,
        }
    }

    pub fn file_id(&self) -> FileId {
        match self {
            Self::File { file, .. } | Self::Tail { file, .. } => *file,
        }
    }

    /// A key as [`Display`](fmt::Display) writes it; `None` for anything
    /// filedock does not write.
    pub fn parse(raw: &str) -> Option<Self> {
        let file_key = |rest: &str| {
            let (user, file) = rest.strip_prefix(Self::FILES)?.split_once('/')?;
            Some((UserId::parse(user)?, FileId::parse(file)?))
        };
        if let Some(staged) = raw.strip_prefix("tus/") {
            let (file, tail) = staged.rsplit_once("/tail-")?;
            let (user, file) = file_key(file)?;
            let (start, end) = tail.split_once('-')?;
            let (start, end) = (start.parse().ok()?, end.parse().ok()?);
            return Some(Self::Tail {
                user,
                file,
                start,
                end,
            });
        }
        let (user, file) = file_key(raw)?;
        Some(Self::File { user, file })
    }
}

impl fmt::Display for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { user, file } => write!(f, "{}{user}/{file}", Self::FILES),
            Self::Tail {
                user,
                file,
                start,
                end,
            } => write!(f, "tus/{}{user}/{file}/tail-{start}-{end}", Self::FILES),
        }
    }
}

impl Serialize for BlobKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BlobKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Self::parse(&raw)
            .ok_or_else(|| serde::de::Error::custom(format!("not a blob key: {raw:?}")))
    }
}

/// A blob store's handle on a write that spans requests (the S3 multipart
/// upload id; the local store's staging file), as the store made it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WriteHandle(String);

impl WriteHandle {
    pub fn new(handle: impl Into<String>) -> Self {
        Self(handle.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WriteHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A lock's name and level. Ids sit in `{…}` so that every key of one
/// resource maps to one Redis Cluster slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    key: String,
    level: &'static str,
}

impl LockKey {
    /// `user_file_upload_lock:{user}:{small|medium|large}`: uploads and deletes.
    pub fn user_upload(user: &(impl fmt::Display + ?Sized), category: impl fmt::Display) -> Self {
        Self {
            key: format!("user_file_upload_lock:{{{user}}}:{category}"),
            level: "user",
        }
    }

    /// `user_file_upload_lock:{user}:commit`: held only around a transaction
    /// that writes the user document (an upload's commit, a delete), taken
    /// after the category lock. Every category's commits write that one
    /// document, so they are serialized here rather than left to conflict.
    pub fn user_commit(user: &(impl fmt::Display + ?Sized)) -> Self {
        Self {
            key: format!("user_file_upload_lock:{{{user}}}:commit"),
            level: "user",
        }
    }

    /// `session_file_add_lock:{session}`.
    pub fn session_files(session: &(impl fmt::Display + ?Sized)) -> Self {
        Self {
            key: format!("session_file_add_lock:{{{session}}}"),
            level: "session",
        }
    }

    /// `agent_file_add_lock:{agent}`.
    pub fn agent_files(agent: &(impl fmt::Display + ?Sized)) -> Self {
        Self {
            key: format!("agent_file_add_lock:{{{agent}}}"),
            level: "agent",
        }
    }

    /// `agent_config_lock:{agent}`: MCP and toolset connections.
    pub fn agent_config(agent: &(impl fmt::Display + ?Sized)) -> Self {
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

    /// `filedock_webhook_lease:{endpoint:p}`: the one deliverer of
    /// partition `p` of the owners' events to webhook `endpoint`.
    pub fn webhook_partition(endpoint: &str, p: u32) -> Self {
        Self {
            key: format!("filedock_webhook_lease:{{{endpoint}:{p}}}"),
            level: "webhook_partition",
        }
    }

    /// `filedock_resumable_lock:{upload}`: one PATCH (or termination, or
    /// expiry) at a time on a resumable upload.
    pub fn resumable(upload: &FileId) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_keys_read_back_as_written() {
        let (user, file) = (UserId::new(), FileId::new());
        let key = BlobKey::file(user, file);
        assert_eq!(key.to_string(), format!("files/{user}/{file}"));
        let tail = key.tail(8, 13);
        assert_eq!(
            tail.to_string(),
            format!("tus/files/{user}/{file}/tail-8-13")
        );
        assert!(tail.to_string().starts_with(&key.staging_prefix()));
        for k in [key, tail] {
            assert_eq!(BlobKey::parse(&k.to_string()), Some(k));
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(serde_json::from_str::<BlobKey>(&json).unwrap(), k);
        }
        for bad in [
            "files/x/y",
            "other/a/b",
            "files/",
            &format!("files/{user}/{file}/z"),
        ] {
            assert_eq!(BlobKey::parse(bad), None, "{bad}");
        }
    }
}
