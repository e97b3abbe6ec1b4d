//! The vocabulary every layer speaks: identifiers and untrusted strings,
//! validated at the edge (`ids`), the names the ports keep things under
//! (`keys`), and the writes to a container (`commands`). It imports nothing
//! else from the crate, and every layer may import it (`scripts/layers.sh`).

pub mod commands;
pub mod ids;
pub mod keys;
pub mod scopes;

pub use self::{
    commands::{Container, LinkKind, Operation},
    ids::{
        AgentId, ApiKeyHash, FileId, Filename, IdempotencyKey, KeyId, LinkId, MediaType, OpId,
        OrphanId, SessionId, SizeCategory, UserId,
    },
    keys::{BlobKey, LockKey, WriteHandle},
    scopes::Scope,
};
