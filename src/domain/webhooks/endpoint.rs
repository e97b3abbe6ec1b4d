//! Where events go and in what shape: the endpoints, the partitions of
//! owners, and the body a receiver gets.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{meta::EventRecord, vocab::UserId};

/// The partitions of owners (each leased by one instance at a time).
pub const PARTITIONS: u32 = 16;

/// The partition of `owner`'s events.
pub fn partition_of(owner: &UserId) -> u32 {
    crc32fast::hash(owner.to_string().as_bytes()) % PARTITIONS
}

/// One URL events go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// A hash of the URL: where its delivery state is kept.
    pub id: String,
    pub url: String,
}

impl Endpoint {
    pub fn new(url: &str) -> Self {
        let hash = Sha256::digest(url.as_bytes());
        Self {
            id: hex::encode(&hash[..8]),
            url: url.to_owned(),
        }
    }
}

/// The body a receiver gets for `event`: its type, time and data, with
/// its owner and number in the data.
pub fn body_of(event: &EventRecord) -> Vec<u8> {
    let mut data = event.data.clone();
    data.insert("owner_id".into(), json!(event.owner_id));
    data.insert("seq".into(), Value::from(event.seq));
    let body = json!({"type": event.kind, "timestamp": event.time, "data": data});
    serde_json::to_vec(&body).expect("JSON values serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_spread_over_every_partition() {
        let mut seen = [0u32; PARTITIONS as usize];
        for _ in 0..4000 {
            seen[partition_of(&UserId::new()) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
    }

    #[test]
    fn the_body_carries_the_owner_and_number() {
        let owner = UserId::new();
        let event =
            crate::meta::EventDraft::user_deleted(&owner).numbered(owner, 7, chrono::Utc::now());
        let body: Value = serde_json::from_slice(&body_of(&event)).unwrap();
        assert_eq!(body["type"], "user.deleted");
        assert_eq!(body["data"]["seq"], 7);
        assert_eq!(body["data"]["owner_id"], owner.to_string());
        assert!(body["timestamp"].is_string());
    }
}
