//! Webhooks' delivery state in the embedded store: a mark per endpoint and
//! partition at `webhook_marks/{endpoint}:{partition}`, and each dead
//! letter at `webhook_dead/{id}`, so that the letters in id order are one
//! key range; beside each, `webhook_dead_by_owner/{owner}/{id}` and
//! `webhook_dead_by_time/{event time_ms:015}/{id}`, so that a user's
//! deletion and the events' retention find theirs as one key range too.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{EmbeddedStore, txn::Txn, user_key};
use crate::{
    meta::{DeadLetter, MetaResult, UserRecord, WebhookMark, WebhookRepo},
    vocab::UserId,
};

const DEAD: &str = "webhook_dead/";
const BY_OWNER: &str = "webhook_dead_by_owner/";
const BY_TIME: &str = "webhook_dead_by_time/";

/// A partition's mark, and the greatest lease token that wrote it (a
/// holder with a smaller one writes nothing).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    mark: WebhookMark,
    fence: u64,
}

fn mark_key(endpoint: &str, partition: u32) -> String {
    format!("webhook_marks/{endpoint}:{partition}")
}

fn dead_key(id: &str) -> String {
    format!("{DEAD}{id}")
}

fn time_part(time: DateTime<Utc>) -> String {
    format!("{:015}", time.timestamp_millis().max(0))
}

/// The letter's keys: its own and its two index entries.
fn keys_of(letter: &DeadLetter) -> [String; 3] {
    let (id, event) = (&letter.id, &letter.event);
    [
        dead_key(id),
        format!("{BY_OWNER}{}/{id}", event.owner_id),
        format!("{BY_TIME}{}/{id}", time_part(event.time)),
    ]
}

/// Puts the index entries of every letter that lacks them (written before
/// they existed); how many.
pub(super) fn index_dead_letters(tx: &mut Txn) -> MetaResult<usize> {
    let mut indexed = 0;
    for key in tx.keys(DEAD, None, usize::MAX)? {
        let Some(letter) = tx.get::<DeadLetter>(&key)? else {
            continue;
        };
        let [_, by_owner, by_time] = keys_of(&letter);
        if tx.get::<String>(&by_owner)?.is_none() {
            tx.put(&by_owner, &letter.id)?;
            tx.put(&by_time, &letter.id)?;
            indexed += 1;
        }
    }
    Ok(indexed)
}

/// Removes the letters an index entry under `index` names (each with its
/// keys), up to `limit`, while `keep_going` says so of the entry's rest.
fn remove_by(
    tx: &mut Txn,
    index: &str,
    limit: usize,
    keep_going: impl Fn(&str) -> bool,
) -> MetaResult<usize> {
    let mut gone = 0;
    for k in tx.keys(index, None, limit)? {
        let rest = &k[index.len()..];
        if !keep_going(rest) {
            break;
        }
        let id = rest.rsplit_once('/').map_or(rest, |(_, id)| id);
        let letter = tx.get::<DeadLetter>(&dead_key(id))?;
        remove(tx, &k, letter.as_ref());
        gone += 1;
    }
    Ok(gone)
}

/// Removes `letter` with its keys, or, when it is not there, the index
/// entry `k` that named it.
fn remove(tx: &mut Txn, k: &str, letter: Option<&DeadLetter>) {
    match letter {
        Some(letter) => keys_of(letter).iter().for_each(|k| tx.delete(k)),
        None => tx.delete(k),
    }
}

/// Removes up to `limit` of `owner`'s dead letters (their deletion), but
/// that of `user.deleted` (see [`DeadLetter::outlives_its_owner`]); how
/// many. (The owner's whole range is read: a user's letters are few.)
pub(super) fn purge_dead_letters(tx: &mut Txn, owner: &UserId, limit: usize) -> MetaResult<usize> {
    let index = format!("{BY_OWNER}{owner}/");
    let mut gone = 0;
    for k in tx.keys(&index, None, usize::MAX)? {
        if gone == limit {
            break;
        }
        let letter = tx.get::<DeadLetter>(&dead_key(&k[index.len()..]))?;
        if letter.as_ref().is_some_and(DeadLetter::outlives_its_owner) {
            continue;
        }
        remove(tx, &k, letter.as_ref());
        gone += 1;
    }
    Ok(gone)
}

/// Removes up to `limit` dead letters whose event was written before
/// `before` (the events' retention); how many.
pub(super) fn expire_dead_letters(
    tx: &mut Txn,
    before: DateTime<Utc>,
    limit: usize,
) -> MetaResult<usize> {
    let before = time_part(before);
    remove_by(tx, BY_TIME, limit, |rest| {
        rest.get(..before.len())
            .is_some_and(|t| t < before.as_str())
    })
}

#[async_trait]
impl WebhookRepo for EmbeddedStore {
    async fn webhook_mark(&self, endpoint: &str, partition: u32) -> MetaResult<WebhookMark> {
        let key = mark_key(endpoint, partition);
        self.transaction(move |tx| Ok(tx.get::<Stored>(&key)?.unwrap_or_default().mark))
            .await
    }

    async fn raise_webhook_mark(
        &self,
        endpoint: &str,
        partition: u32,
        fence: u64,
        mark: &WebhookMark,
    ) -> MetaResult<bool> {
        let key = mark_key(endpoint, partition);
        let mark = mark.clone();
        self.transaction(move |tx| {
            let stored: Stored = tx.get(&key)?.unwrap_or_default();
            if stored.fence > fence {
                return Ok(false);
            }
            let position = stored.mark.position.max(mark.position);
            let written = Stored {
                mark: WebhookMark {
                    position,
                    owners: mark.owners.clone(),
                },
                fence,
            };
            // A holder that raced ours to the key conflicts at the commit:
            // the caller's retry reads its token then.
            if written != stored {
                tx.put(&key, &written)?;
            }
            Ok(true)
        })
        .await
    }

    async fn put_dead_letter(&self, letter: &DeadLetter) -> MetaResult<bool> {
        let letter = letter.clone();
        self.transaction(move |tx| {
            if !letter.outlives_its_owner() {
                // Written back unchanged: a commit checks what it wrote, so
                // the deletion's mark and this letter are ordered.
                let key = user_key(&letter.event.owner_id);
                match tx.get::<UserRecord>(&key)? {
                    Some(user) if user.deleting_since.is_none() => tx.put(&key, &user)?,
                    _ => return Ok(false),
                }
            }
            let [own, by_owner, by_time] = keys_of(&letter);
            tx.put(&own, &letter)?;
            tx.put(&by_owner, &letter.id)?;
            tx.put(&by_time, &letter.id)?;
            Ok(true)
        })
        .await
    }

    async fn dead_letters(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<DeadLetter>> {
        let after = after.map(str::to_owned);
        self.transaction(move |tx| {
            let keys = tx.keys(DEAD, after.as_deref(), limit)?;
            let mut out = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(letter) = tx.get(&k)? {
                    out.push(letter);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn dead_letter(&self, id: &str) -> MetaResult<Option<DeadLetter>> {
        let key = dead_key(id);
        self.transaction(move |tx| tx.get(&key)).await
    }

    async fn remove_dead_letter(&self, id: &str) -> MetaResult<bool> {
        let key = dead_key(id);
        self.transaction(move |tx| {
            let Some(letter) = tx.get::<DeadLetter>(&key)? else {
                return Ok(false);
            };
            keys_of(&letter).iter().for_each(|k| tx.delete(k));
            Ok(true)
        })
        .await
    }

    async fn count_dead_letters(&self) -> MetaResult<u64> {
        // Every key is read: an admin's figure, and letters are few (each is
        // an event given up on).
        self.transaction(move |tx| Ok(tx.keys(DEAD, None, usize::MAX)?.len() as u64))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        meta::{ApiKeyRecord, DeletionRepo, EventRecord, EventType, UserRepo, now},
        vocab::{ApiKeyHash, UserId},
    };

    /// A user of `store`, whose letters it keeps.
    async fn owner(store: &EmbeddedStore) -> UserId {
        let user = UserRecord::new("owner".into());
        let key = ApiKeyRecord {
            id: Default::default(),
            user_id: user.id,
            name: "default".into(),
            hash: ApiKeyHash::from_hex(format!("hash-{}", user.id)),
            created_at: now(),
        };
        store.insert_user(&user, &key).await.unwrap();
        user.id
    }

    /// A letter of a user who is gone, or whose deletion began, is not
    /// kept: their deletion's purge may have passed already.
    #[tokio::test]
    async fn a_letter_of_a_user_deleted_or_being_deleted_is_not_kept() {
        let (store, dir) = open();
        let (ann, bob) = (owner(&store).await, owner(&store).await);
        assert!(store.put_dead_letter(&letter("e", ann, 1)).await.unwrap());
        store.begin_user_deletion(&bob).await.unwrap();
        assert!(!store.put_dead_letter(&letter("e", bob, 1)).await.unwrap());
        let gone = UserId::new();
        assert!(!store.put_dead_letter(&letter("e", gone, 1)).await.unwrap());
        // But `user.deleted`, kept as the event is.
        let mut last = letter("e", bob, 2);
        last.event.kind = EventType::UserDeleted.as_str().to_owned();
        assert!(store.put_dead_letter(&last).await.unwrap());
        let kept = store.dead_letters(None, 10).await.unwrap();
        let mut want = vec![letter("e", ann, 1).id, last.id.clone()];
        want.sort();
        assert_eq!(ids_of(&kept), want);
        // Their deletion's purge leaves it too.
        let purge = move |tx: &mut Txn| purge_dead_letters(tx, &bob, 10);
        assert_eq!(store.transaction(purge).await.unwrap(), 0);
        assert!(store.dead_letter(&last.id).await.unwrap().is_some());
        std::fs::remove_dir_all(dir).ok();
    }

    fn open() -> (EmbeddedStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("filedock-hooks-{}", uuid::Uuid::new_v4()));
        (EmbeddedStore::open(&dir).unwrap(), dir)
    }

    fn letter(endpoint: &str, owner: UserId, seq: i64) -> DeadLetter {
        let event = EventRecord {
            id: EventRecord::id_for(&owner, seq),
            owner_id: owner,
            seq,
            kind: EventType::FileCreated.as_str().to_owned(),
            subject: "f".into(),
            time: now(),
            data: Default::default(),
            feed: Some(seq),
        };
        DeadLetter {
            id: DeadLetter::id_for(endpoint, &event),
            endpoint: endpoint.into(),
            url: "https://example.test/hook".into(),
            event,
            attempts: 3,
            last_error: "503".into(),
            dead_at: now(),
        }
    }

    fn ids_of(page: &[DeadLetter]) -> Vec<String> {
        page.iter().map(|l| l.id.clone()).collect()
    }

    fn at(position: i64, owners: &[(&str, i64)]) -> WebhookMark {
        WebhookMark {
            position,
            owners: owners.iter().map(|(o, n)| ((*o).to_owned(), *n)).collect(),
        }
    }

    /// A holder whose lease passed on writes nothing, and the position
    /// only rises; the owners are the last holder's.
    #[tokio::test]
    async fn the_mark_rises_under_the_greatest_fence_only() {
        let (store, dir) = open();
        assert_eq!(store.webhook_mark("e", 0).await.unwrap(), at(0, &[]));
        assert!(
            store
                .raise_webhook_mark("e", 0, 5, &at(10, &[("a", 3)]))
                .await
                .unwrap()
        );
        assert!(
            store
                .raise_webhook_mark("e", 0, 5, &at(7, &[("b", 1)]))
                .await
                .unwrap()
        );
        assert_eq!(
            store.webhook_mark("e", 0).await.unwrap(),
            at(10, &[("b", 1)]),
            "the position never lowered"
        );
        assert!(
            !store
                .raise_webhook_mark("e", 0, 3, &at(20, &[]))
                .await
                .unwrap()
        );
        assert_eq!(
            store.webhook_mark("e", 0).await.unwrap(),
            at(10, &[("b", 1)]),
            "nothing written"
        );
        assert!(
            store
                .raise_webhook_mark("e", 0, 6, &at(12, &[]))
                .await
                .unwrap()
        );
        assert!(
            !store
                .raise_webhook_mark("e", 0, 5, &at(30, &[]))
                .await
                .unwrap()
        );
        assert_eq!(store.webhook_mark("e", 0).await.unwrap(), at(12, &[]));
        assert_eq!(
            store.webhook_mark("e", 1).await.unwrap(),
            at(0, &[]),
            "per partition"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    /// Letters page in id order.
    #[tokio::test]
    async fn dead_letters_page_in_id_order() {
        let (store, dir) = open();
        let owner = owner(&store).await;
        let letters = [
            letter("e", owner, 3),
            letter("e", owner, 2),
            letter("d", owner, 9),
        ];
        for l in &letters {
            store.put_dead_letter(l).await.unwrap();
        }
        // Put again (replaced): still one.
        store.put_dead_letter(&letters[0]).await.unwrap();
        assert_eq!(store.count_dead_letters().await.unwrap(), 3);
        let mut ids: Vec<_> = letters.iter().map(|l| l.id.clone()).collect();
        ids.sort();
        let first = store.dead_letters(None, 2).await.unwrap();
        assert_eq!(ids_of(&first), ids[..2].to_vec());
        let rest = store.dead_letters(Some(ids[1].as_str()), 2).await.unwrap();
        assert_eq!(ids_of(&rest), ids[2..].to_vec());
        let stored = store.dead_letter(&letters[1].id).await.unwrap();
        assert_eq!(stored.as_ref(), Some(&letters[1]));
        assert!(store.remove_dead_letter(&letters[1].id).await.unwrap());
        assert!(!store.remove_dead_letter(&letters[1].id).await.unwrap());
        assert_eq!(store.dead_letter(&letters[1].id).await.unwrap(), None);
        assert_eq!(store.count_dead_letters().await.unwrap(), 2);
        std::fs::remove_dir_all(dir).ok();
    }

    /// A user's deletion and the retention find their letters by the index
    /// ranges; a letter kept before those existed is indexed at start-up.
    #[tokio::test]
    async fn letters_go_by_owner_and_by_time_older_ones_once_indexed() {
        let (store, dir) = open();
        let (ann, bob) = (owner(&store).await, owner(&store).await);
        let mut old = letter("e", bob, 9);
        old.event.time = now() - chrono::Duration::hours(2);
        for l in [
            letter("e", ann, 1),
            letter("e", ann, 2),
            letter("e", bob, 1),
        ] {
            store.put_dead_letter(&l).await.unwrap();
        }
        // As an older version kept it: the letter alone.
        let raw = old.clone();
        store
            .transaction(move |tx| tx.put(&dead_key(&raw.id), &raw))
            .await
            .unwrap();
        let gone = store
            .transaction(move |tx| purge_dead_letters(tx, &ann, 10))
            .await
            .unwrap();
        assert_eq!(gone, 2);
        let cut = now() - chrono::Duration::hours(1);
        let expire = move |tx: &mut Txn| expire_dead_letters(tx, cut, 10);
        assert_eq!(
            store.transaction(expire).await.unwrap(),
            0,
            "not indexed yet"
        );
        let indexed = store.transaction(index_dead_letters).await.unwrap();
        assert_eq!(indexed, 1, "only the old one lacked its entries");
        assert_eq!(store.transaction(expire).await.unwrap(), 1);
        let left = store.dead_letters(None, 10).await.unwrap();
        assert_eq!(ids_of(&left), vec![letter("e", bob, 1).id]);
        std::fs::remove_dir_all(dir).ok();
    }
}
