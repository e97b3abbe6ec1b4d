//! The scopes of a short-lived token: what it may do, named
//! `{resource}:{read|write}` as OAuth scopes are. A key has every right;
//! a token only those it was minted with.

use serde::{Deserialize, Serialize};

/// One right a token may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// List, read and download files; make signed links to them.
    #[serde(rename = "files:read")]
    FilesRead,
    /// Upload (plain and resumable), rename and delete files.
    #[serde(rename = "files:write")]
    FilesWrite,
    /// List and read sessions.
    #[serde(rename = "sessions:read")]
    SessionsRead,
    /// Create and delete sessions, attach and detach their files.
    #[serde(rename = "sessions:write")]
    SessionsWrite,
    /// List and read agents.
    #[serde(rename = "agents:read")]
    AgentsRead,
    /// Create and delete agents, attach files, connect MCPs and toolsets.
    #[serde(rename = "agents:write")]
    AgentsWrite,
    /// Read the caller's events (`GET /v1/events`); not for a token bound
    /// to one session or agent (the events are the whole account's).
    #[serde(rename = "events:read")]
    EventsRead,
}

impl Scope {
    /// Every scope, in the order the documentation lists them.
    pub const ALL: [Scope; 7] = [
        Scope::FilesRead,
        Scope::FilesWrite,
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::AgentsRead,
        Scope::AgentsWrite,
        Scope::EventsRead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::FilesRead => "files:read",
            Scope::FilesWrite => "files:write",
            Scope::SessionsRead => "sessions:read",
            Scope::SessionsWrite => "sessions:write",
            Scope::AgentsRead => "agents:read",
            Scope::AgentsWrite => "agents:write",
            Scope::EventsRead => "events:read",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown scope {raw:?}; scopes are {}", known.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_round_trip_through_their_names() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Ok(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!(Scope::parse("files:*").is_err());
    }
}
