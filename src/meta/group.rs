//! The plan of a group commit (see [`super::FileRepo::commit_uploads`]),
//! the same for both adapters: which uploads commit, which are replays and
//! which are past the quota, decided upload by upload in arrival order.

use std::collections::HashMap;

use super::{
    error::{MetaError, MetaResult},
    records::now,
    upload_records::{CommitOutcome, CommitUpload, Fence, IdempotencyRecord},
};
use crate::vocab::FileId;

/// What a group commit writes, and each upload's outcome.
pub struct GroupPlan<'a> {
    /// One per upload of the group, in its order.
    pub outcomes: Vec<MetaResult<CommitOutcome>>,
    /// The uploads that commit, in order.
    pub committing: Vec<&'a CommitUpload>,
    /// Their idempotency records (`_id`, first result), to insert.
    pub keys: Vec<IdempotencyRecord>,
    /// What they add to the user's `used_bytes`.
    pub bytes: i64,
    /// The resumable uploads among them whose reservations they release
    /// (see [`Held`]), and what those come to.
    pub freed: Vec<FileId>,
    pub freed_bytes: i64,
    pub freed_open: i64,
    /// The resumable uploads among them: their states are marked committed
    /// in the same transaction.
    pub resumable: Vec<FileId>,
}

/// What a resumable upload holds of its user's counters (its record's
/// `reserved` and `open`), released when its file commits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub reserved: i64,
    pub open: bool,
}

/// The idempotency record ids the group's uploads carry.
pub fn idempotency_ids(group: &[CommitUpload]) -> Vec<String> {
    group
        .iter()
        .filter_map(|c| {
            let k = c.idempotency.as_ref()?;
            Some(IdempotencyRecord::id_for(&c.file.owner_id, &k.key))
        })
        .collect()
}

/// Decides each upload of `group` in order, given what the user's bytes
/// count against the quota (stored and reserved), the user's own quota
/// (which overrides the uploads' default), the idempotency records already
/// stored (by id) and what the group's resumable uploads hold (none for one
/// whose state moved on: refused): an upload's own reservation makes room for it.
pub fn plan<'a>(
    group: &'a [CommitUpload],
    counted_bytes: i64,
    user_quota: Option<i64>,
    mut recorded: HashMap<String, IdempotencyRecord>,
    held: &HashMap<FileId, Held>,
) -> GroupPlan<'a> {
    let mut p = GroupPlan {
        outcomes: Vec::with_capacity(group.len()),
        committing: Vec::with_capacity(group.len()),
        keys: Vec::new(),
        bytes: 0,
        freed: Vec::new(),
        freed_bytes: 0,
        freed_open: 0,
        resumable: Vec::new(),
    };
    for c in group {
        let key = c.idempotency.as_ref();
        let key_id = key.map(|k| IdempotencyRecord::id_for(&c.file.owner_id, &k.key));
        if let Some(first) = key_id.as_ref().and_then(|id| recorded.get(id)) {
            p.outcomes
                .push(Ok(CommitOutcome::Replayed(Box::new(first.clone()))));
            continue;
        }
        // Two requests' commits of one upload: one records it.
        if c.resumable && p.resumable.contains(&c.file.id) {
            p.outcomes.push(Err(MetaError::Moved));
            continue;
        }
        let own = match (c.resumable, held.get(&c.file.id)) {
            (true, Some(own)) => *own,
            // Its state moved on since its request read it: another
            // request wrote it (see `StateAdvance`).
            (true, None) if c.state.is_some() => {
                p.outcomes.push(Err(MetaError::Moved));
                continue;
            }
            _ => Held::default(),
        };
        let after = counted_bytes + p.bytes - p.freed_bytes - own.reserved + c.file.size;
        if effective_quota(user_quota, c.quota_bytes).is_some_and(|q| after.max(0) as u64 > q) {
            p.outcomes.push(Err(MetaError::QuotaExceeded));
            continue;
        }
        p.bytes += c.file.size;
        if c.resumable {
            p.resumable.push(c.file.id);
        }
        if own != Held::default() {
            p.freed.push(c.file.id);
            p.freed_bytes += own.reserved;
            p.freed_open += i64::from(own.open);
        }
        if let (Some(id), Some(k)) = (key_id, key) {
            let record = IdempotencyRecord {
                id: id.clone(),
                file: c.file.clone(),
                fingerprint: k.fingerprint.clone(),
                created_at: now(),
            };
            recorded.insert(id, record.clone());
            p.keys.push(record);
        }
        p.committing.push(c);
        p.outcomes.push(Ok(CommitOutcome::Committed));
    }
    p
}

/// The quota that holds: the user's own, else the default the commit carries.
pub fn effective_quota(user_quota: Option<i64>, default: Option<u64>) -> Option<u64> {
    user_quota.map(|q| q.max(0) as u64).or(default)
}

/// The group's fences, one per slot. Two tokens of one slot in a group
/// would let one upload commit under another's token: refused.
pub fn fences(group: &[CommitUpload]) -> MetaResult<Vec<&Fence>> {
    let mut by_slot: Vec<&Fence> = Vec::new();
    for f in group.iter().filter_map(|c| c.fence.as_ref()) {
        match by_slot.iter().find(|g| g.slot == f.slot) {
            Some(g) if g.token != f.token => {
                return Err(MetaError::Other(format!(
                    "two tokens of fence slot {} in one group",
                    f.slot
                )));
            }
            Some(_) => {}
            None => by_slot.push(f),
        }
    }
    Ok(by_slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        meta::{FileRecord, IdempotencyClaim},
        vocab::{BlobKey, FileId, IdempotencyKey, SizeCategory, UserId},
    };

    /// The one user every upload of these groups is by.
    fn owner() -> UserId {
        UserId::parse("0190f2a0-0000-7000-8000-000000000001").unwrap()
    }

    fn upload(size: i64, key: Option<&str>) -> CommitUpload {
        let id = FileId::new();
        CommitUpload {
            file: FileRecord {
                id,
                owner_id: owner(),
                filename: "f".into(),
                content_type: "text/plain".into(),
                size,
                sha256: String::new(),
                category: SizeCategory::Small,
                bucket: "b".into(),
                key: BlobKey::file(owner(), id),
                created_at: super::super::now(),
                sessions: vec![],
                agents: vec![],
            },
            fence: None,
            quota_bytes: Some(100),
            idempotency: key.map(|k| IdempotencyClaim {
                key: IdempotencyKey::parse(k).unwrap(),
                fingerprint: String::new(),
            }),
            resumable: false,
            state: None,
        }
    }

    fn shape(p: &GroupPlan<'_>) -> Vec<&'static str> {
        p.outcomes
            .iter()
            .map(|o| match o {
                Ok(CommitOutcome::Committed) => "commit",
                Ok(CommitOutcome::Replayed(_)) => "replay",
                Err(MetaError::QuotaExceeded) => "quota",
                Err(_) => "other",
            })
            .collect()
    }

    /// Two requests' commits of one resumable upload in one group (the
    /// lock backend down, or a lease lost): one commits it, the other is
    /// told it moved on, and its reservation is given back once.
    #[test]
    fn two_commits_of_one_resumable_upload_in_a_group_commit_it_once() {
        let mut first = upload(10, None);
        first.resumable = true;
        let group = [first.clone(), first];
        let own = Held {
            reserved: 10,
            open: true,
        };
        let held = HashMap::from([(group[0].file.id, own)]);
        let p = plan(&group, 10, None, HashMap::new(), &held);
        assert_eq!(shape(&p), ["commit", "other"]);
        assert!(matches!(p.outcomes[1], Err(MetaError::Moved)));
        assert_eq!(
            (p.committing.len(), p.freed_bytes, p.freed_open),
            (1, 10, 1)
        );
    }

    #[test]
    fn the_quota_is_decided_in_order_and_a_later_smaller_upload_may_fit() {
        let group = [
            upload(40, None),
            upload(40, None),
            upload(30, None),
            upload(10, None),
        ];
        let p = plan(&group, 10, None, HashMap::new(), &HashMap::new());
        assert_eq!(shape(&p), ["commit", "commit", "quota", "commit"]);
        assert_eq!(p.bytes, 90);
        assert_eq!(p.committing.len(), 3);
    }

    #[test]
    fn the_users_own_quota_holds_over_the_default_the_uploads_carry() {
        let group = [upload(40, None), upload(40, None)];
        // The default (100) would take both; the user's own (60) takes one.
        let p = plan(&group, 10, Some(60), HashMap::new(), &HashMap::new());
        assert_eq!(shape(&p), ["commit", "quota"]);
        // Below the usage: none.
        let p = plan(&group, 10, Some(5), HashMap::new(), &HashMap::new());
        assert_eq!(shape(&p), ["quota", "quota"]);
        assert_eq!(effective_quota(None, Some(100)), Some(100));
        assert_eq!(effective_quota(Some(0), Some(100)), Some(0));
        assert_eq!(effective_quota(None, None), None);
    }

    #[test]
    fn a_key_recorded_before_or_earlier_in_the_group_is_a_replay() {
        let group = [
            upload(1, Some("a")),
            upload(1, Some("a")),
            upload(1, Some("b")),
        ];
        let b_id = IdempotencyRecord::id_for(&owner(), &IdempotencyKey::parse("b").unwrap());
        let first_b = IdempotencyRecord {
            id: b_id.clone(),
            file: group[0].file.clone(),
            fingerprint: String::new(),
            created_at: crate::meta::now(),
        };
        let before = HashMap::from([(b_id, first_b)]);
        let p = plan(&group, 0, None, before, &HashMap::new());
        assert_eq!(shape(&p), ["commit", "replay", "replay"]);
        let Ok(CommitOutcome::Replayed(first)) = &p.outcomes[1] else {
            unreachable!()
        };
        assert_eq!(
            first.file.id, group[0].file.id,
            "the replay answers the first"
        );
        assert_eq!(p.keys.len(), 1, "one record, for the upload that commits");
    }

    #[test]
    fn a_resumable_uploads_own_reservation_makes_room_for_it_and_is_freed() {
        // 100 quota: 50 stored, 40 reserved by the resumable upload below.
        let mut group = [upload(40, None), upload(20, None), upload(10, None)];
        group[0].resumable = true;
        let held = HashMap::from([(
            group[0].file.id,
            Held {
                reserved: 40,
                open: true,
            },
        )]);
        let p = plan(&group, 90, None, HashMap::new(), &held);
        // 50 + 40 (its own reservation) = 90; then 20 would be 110; 10 fits.
        assert_eq!(shape(&p), ["commit", "quota", "commit"]);
        assert_eq!((p.bytes, p.freed_bytes, p.freed_open), (50, 40, 1));
        assert_eq!(p.freed, [group[0].file.id]);
    }

    #[test]
    fn the_users_own_quota_holds_against_stored_and_reserved_bytes() {
        // The default (1000) would take all; the user's own (100) is held
        // to 50 stored + 40 reserved, of which the first upload's own 40.
        let mut group = [upload(40, None), upload(20, None), upload(10, None)];
        for c in &mut group {
            c.quota_bytes = Some(1000);
        }
        group[0].resumable = true;
        let held = HashMap::from([(
            group[0].file.id,
            Held {
                reserved: 40,
                open: true,
            },
        )]);
        let p = plan(&group, 90, Some(100), HashMap::new(), &held);
        assert_eq!(shape(&p), ["commit", "quota", "commit"]);
        // Without its reservation freed, the first would not fit either.
        let p = plan(&group, 90, Some(100), HashMap::new(), &HashMap::new());
        assert_eq!(shape(&p), ["quota", "quota", "commit"]);
    }

    #[test]
    fn two_tokens_of_one_slot_are_refused() {
        let fence = |token| {
            Some(Fence {
                slot: "small".into(),
                token,
                pinned: false,
            })
        };
        let mut group = [upload(1, None), upload(1, None)];
        group[0].fence = fence(5);
        group[1].fence = fence(5);
        assert_eq!(fences(&group).unwrap().len(), 1);
        group[1].fence = fence(6);
        assert!(fences(&group).is_err());
    }
}
