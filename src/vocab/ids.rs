//! Newtypes for identifiers and untrusted strings, validated at the edge.

use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;
use uuid::Uuid;

/// An id made of a UUID, written in its canonical hyphenated form in every
/// format (JSON, BSON, keys, URLs), so that stored ids stay strings.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = std::borrow::Cow::<'de, str>::deserialize(d)?;
                Self::parse(&raw).ok_or_else(|| {
                    serde::de::Error::custom(format!(concat!("not a ", stringify!($name), ": {:?}"), raw))
                })
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(raw: &str) -> Result<Self, String> {
                Self::parse(raw).ok_or_else(|| format!(concat!("not a ", stringify!($name), ": {:?}"), raw))
            }
        }

        impl $name {
            /// A new, time-ordered id (UUID v7), so ids sort by creation.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The nil id, which [`Self::new`] never gives.
            pub fn nil() -> Self {
                Self(Uuid::nil())
            }

            /// Accepts only the canonical form (hyphenated, lower-case hex), so
            /// that one resource has one URL; anything else is not an id.
            pub fn parse(raw: &str) -> Option<Self> {
                let id = Uuid::parse_str(raw).ok()?;
                (id.hyphenated().to_string() == raw).then_some(Self(id))
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }
    };
}

uuid_id!(
    /// A user's id.
    UserId
);
uuid_id!(
    /// A file's id; also names its blob (`files/{user}/{file}`).
    FileId
);

uuid_id!(
    /// A chat session's id.
    SessionId
);
uuid_id!(
    /// An agent's id.
    AgentId
);
uuid_id!(
    /// An orphan's id (a blob that still has to go).
    OrphanId
);
uuid_id!(
    /// A queued operation's id: what makes a redelivered operation apply once.
    OpId
);
uuid_id!(
    /// An API key's id (what lists show and a revocation names; never the secret).
    KeyId
);

/// The SHA-256 (hex) of an API key: how a user is found by their key (the
/// key itself is never stored).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiKeyHash(String);

impl ApiKeyHash {
    /// The hash as computed from a presented key.
    pub fn from_hex(hex: String) -> Self {
        Self(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An `Idempotency-Key` as a client sent it: 1 to 255 visible ASCII
/// characters, per user.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_BYTES: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, String> {
        if !raw.is_empty()
            && raw.len() <= Self::MAX_BYTES
            && raw.bytes().all(|b| b.is_ascii_graphic())
        {
            Ok(Self(raw.to_owned()))
        } else {
            Err(format!(
                "Idempotency-Key must be 1 to {} visible ASCII characters",
                Self::MAX_BYTES
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The id of an MCP server or toolset connected to an agent (the client's
/// own identifier): 1 to 128 of `A-Z a-z 0-9 . _ : -`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LinkId(String);

impl LinkId {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let ok = (1..=128).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err("ids of MCP servers and toolsets are 1 to 128 of A-Z a-z 0-9 . _ : -".into())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Which per-user upload lock an upload takes, from its declared length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeCategory {
    Small,
    Medium,
    Large,
}

impl SizeCategory {
    pub const SMALL_MAX: u64 = 10 * 1024 * 1024;
    pub const MEDIUM_MAX: u64 = 100 * 1024 * 1024;

    /// small ≤ 10 MiB < medium ≤ 100 MiB < large; an undeclared length is large,
    /// so a stream of unknown size never holds up small uploads.
    pub fn from_declared_len(len: Option<u64>) -> Self {
        match len {
            Some(n) if n <= Self::SMALL_MAX => Self::Small,
            Some(n) if n <= Self::MEDIUM_MAX => Self::Medium,
            _ => Self::Large,
        }
    }

    /// The category a file was stored under (as `as_str` wrote it);
    /// `None` for anything else, which no filedock wrote.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "small" => Some(Self::Small),
            "medium" => Some(Self::Medium),
            "large" => Some(Self::Large),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
        }
    }
}

impl fmt::Display for SizeCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A file name as a user gave it, safe to store and to echo in headers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Filename(String);

impl Filename {
    pub const MAX_BYTES: usize = 255;

    /// Rejects what could confuse a file system, a terminal or a reader:
    /// empty names, `.`/`..`, path separators, names over 255 bytes, and
    /// what [`clean_name`] refuses. The checks are of the name as stored
    /// (NFC-normalised), which can be longer than the one sent: 85 × U+0958
    /// is 255 bytes, and 510 once normalised.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let too_long = || format!("filename is longer than {} bytes", Self::MAX_BYTES);
        // Before normalising too: no work on a name that is too long as sent.
        if raw.len() > Self::MAX_BYTES {
            return Err(too_long());
        }
        let name = clean_name(raw, "filename")?;
        if name.is_empty() || name.trim().is_empty() {
            return Err("filename is empty".into());
        }
        if name.len() > Self::MAX_BYTES {
            return Err(too_long());
        }
        if name == "." || name == ".." || name.contains(['/', '\\']) {
            return Err("filename must not contain a path".into());
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A media type as a client declared it (`type/subtype`, perhaps with
/// parameters): tokens of visible ASCII, at most 255 bytes, stored and
/// echoed back as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaType(String);

impl MediaType {
    pub const MAX_BYTES: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() > Self::MAX_BYTES {
            return Err(format!(
                "Content-Type is longer than {} bytes",
                Self::MAX_BYTES
            ));
        }
        let essence = raw.split(';').next().unwrap_or_default().trim();
        let token = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        let well_formed = essence
            .split_once('/')
            .is_some_and(|(ty, sub)| token(ty) && token(sub))
            && raw
                .bytes()
                .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic());
        if !well_formed {
            return Err(format!("Content-Type {raw:?} is not a media type"));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The one character rule for every name a person gives (files, users,
/// agents): no control characters, no bidirectional controls and no
/// invisible format characters (they make a name read as something else);
/// the name comes back NFC-normalised, so that one name has one spelling.
pub fn clean_name(raw: &str, what: &str) -> Result<String, String> {
    let name: String = raw.nfc().collect();
    if let Some(c) = name
        .chars()
        .find(|&c| c.is_control() || is_bidi_control(c) || is_invisible(c))
    {
        return Err(format!(
            "{what} contains the control or invisible character U+{:04X}",
            c as u32
        ));
    }
    Ok(name)
}

fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// Format characters that show nothing: soft hyphen, zero-width ones, word
/// joiners, the byte-order mark, and the line and paragraph separators.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{2060}'..='\u{2064}'
            | '\u{FEFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_split_at_10_and_100_mib() {
        use SizeCategory::*;
        assert_eq!(SizeCategory::from_declared_len(Some(0)), Small);
        assert_eq!(SizeCategory::from_declared_len(Some(10 << 20)), Small);
        assert_eq!(
            SizeCategory::from_declared_len(Some((10 << 20) + 1)),
            Medium
        );
        assert_eq!(SizeCategory::from_declared_len(Some(100 << 20)), Medium);
        assert_eq!(
            SizeCategory::from_declared_len(Some((100 << 20) + 1)),
            Large
        );
        assert_eq!(SizeCategory::from_declared_len(None), Large);
    }

    #[test]
    fn filenames_are_checked() {
        assert!(Filename::parse("report (final) 😀.pdf").is_ok());
        assert!(Filename::parse("résumé.txt").is_ok());
        for bad in [
            "",
            " ",
            "..",
            "../etc/passwd",
            "a\\b",
            "a\0b",
            "a\nb",
            "evil\u{202E}fdp.exe",
        ] {
            assert!(Filename::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Filename::parse(&"x".repeat(256)).is_err());
        // 255 bytes as sent, 510 once normalised (U+0958 decomposes under NFC).
        let grows = "\u{0958}".repeat(85);
        assert_eq!(grows.len(), 255);
        assert!(Filename::parse(&grows).is_err(), "510 bytes stored");
        assert!(Filename::parse(&"\u{0958}".repeat(42)).is_ok());
    }

    #[test]
    fn ids_parse_only_canonical_uuids() {
        let id = FileId::new();
        assert_eq!(FileId::parse(&id.to_string()), Some(id));
        assert_eq!(FileId::parse("../../etc"), None);
        assert_eq!(FileId::parse(&id.to_string().replace('-', "")), None);
        assert_eq!(
            FileId::parse(&id.to_string().to_uppercase()),
            None,
            "one id, one spelling"
        );
        assert_eq!(FileId::parse(&format!("{{{id}}}")), None);
    }

    #[test]
    fn ids_are_strings_in_every_format() {
        let id = UserId::new();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<UserId>(&json).unwrap(), id);
        // BSON's raw serializer is not human-readable: a plain UUID would be binary.
        let doc =
            bson::to_raw_document_buf(&bson::doc! {"id": bson::to_bson(&id).unwrap()}).unwrap();
        assert_eq!(doc.get_str("id").unwrap(), id.to_string());
        #[derive(Serialize)]
        struct Rec {
            id: UserId,
        }
        let raw = bson::to_raw_document_buf(&Rec { id }).unwrap();
        assert_eq!(raw.get_str("id").unwrap(), id.to_string());
        assert!(serde_json::from_str::<UserId>("\"not-an-id\"").is_err());
    }
}
