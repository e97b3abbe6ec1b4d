//! Transactions on MongoDB: begin (ending stranded sessions first, pinning
//! a fence slot's session), commit with retries of an unknown result, and
//! the fence check every write adds to its filter.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bson::{Document, doc};
use mongodb::{
    Client, ClientSession, Database,
    error::{TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT},
};
use serde::{Deserialize, Serialize};

use super::errors::classify;
use crate::meta::{Fence, MetaError, MetaResult};

/// Attempts at `commitTransaction` when its result is unknown.
pub(super) const COMMIT_ATTEMPTS: u32 = 3;

/// First and longest pause between tries at ending stranded sessions.
const REAP_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Sessions of pinned fence slots (see [`Fence::pinned`]): one per slot,
/// reused by every transaction under it, and the token under which this
/// process last recorded the session as the slot's holder in `txn_holders`.
#[derive(Default)]
pub(super) struct Pinned {
    idle: HashMap<String, ClientSession>,
    recorded: HashMap<String, (Document, i64)>,
}

/// Who last ran transactions under a pinned fence slot.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct TxnHolder {
    #[serde(rename = "_id")]
    slot: String,
    lsid: Document,
    token: i64,
}

/// Maps an error of `commitTransaction`. A transient error means the
/// server aborted the transaction (retry it whole); anything else means it
/// may have committed.
pub(super) fn classify_commit(e: mongodb::error::Error) -> MetaError {
    // Only the transient label says the transaction did not commit; any other
    // failure of the commit (a lost answer, a write concern error, a commit
    // interrupted after it applied) may hide one that did.
    if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return classify(e);
    }
    MetaError::OutcomeUnknown(e.to_string())
}

/// Whether the transaction failed over a broken link (so it may still be
/// open on the server, or even committed).
pub(super) fn link_failed(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::Unavailable(_) | MetaError::Transient(_) | MetaError::OutcomeUnknown(_)
    )
}

/// Adds a fencing condition (stored token below ours, or none yet) to
/// `filter`, and stores our token with `update`.
pub(super) fn add_fence(
    filter: &mut Document,
    update: &mut Document,
    map: &str,
    fence: Option<&Fence>,
) {
    if let Some(f) = fence {
        let field = format!("{map}.{}", f.slot);
        // At or below ours, or none: a field's own condition, not a
        // top-level `$or`, so that a store that plans by field (SecantusDB)
        // still finds the document by its `_id` rather than scanning.
        filter.insert(&field, doc! {"$not": {"$gt": f.token}});
        if !update.contains_key("$set") {
            update.insert("$set", Document::new());
        }
        if let Ok(set) = update.get_document_mut("$set") {
            set.insert(field, f.token);
        }
    }
}

/// [`add_fence`] for several fences (of different slots): every one is
/// checked, every one stored.
pub(super) fn add_fences(
    filter: &mut Document,
    update: &mut Document,
    map: &str,
    fences: &[&Fence],
) {
    debug_assert!(
        fences
            .iter()
            .enumerate()
            .all(|(i, f)| fences[..i].iter().all(|g| g.slot != f.slot)),
        "one fence per slot"
    );
    for f in fences {
        add_fence(filter, update, map, Some(f));
    }
}

/// Where every transaction of the store begins and ends: the client, the
/// pinned slots' sessions, and the sessions a broken link stranded. Cheap
/// to clone.
#[derive(Clone)]
pub(super) struct Sessions {
    client: Client,
    db: Database,
    pinned: Arc<Mutex<Pinned>>,
    /// Sessions whose transaction may still be open on the server: it failed
    /// over a broken link, so its abort may never have arrived. Left alone,
    /// it holds the documents it wrote (a user's, an intent) until the server
    /// reaps it (60 s by default), and every writer to them meets a write
    /// conflict meanwhile — this process's writers and every other
    /// instance's. A background task ends them as soon as the server answers
    /// (and the next transaction tries first). The sessions themselves are
    /// held until then: dropped, they would go back to the driver's pool and
    /// be handed to another request before the kill.
    stranded: Arc<Mutex<Vec<ClientSession>>>,
    /// Whether that background task runs.
    reaping: Arc<AtomicBool>,
}

impl Sessions {
    pub(super) fn new(client: Client, db: Database) -> Self {
        Self {
            client,
            db,
            pinned: Arc::default(),
            stranded: Arc::default(),
            reaping: Arc::default(),
        }
    }

    /// Starts a transaction; under a pinned fence, on the slot's session.
    pub(super) async fn begin(&self, fence: Option<&Fence>) -> MetaResult<ClientSession> {
        self.end_stranded().await;
        let pinned = fence.filter(|f| f.pinned);
        let idle = pinned.and_then(|f| self.pinned.lock().unwrap().idle.remove(&f.slot));
        let mut s = match idle {
            Some(s) => s,
            None => self.client.start_session().await.map_err(classify)?,
        };
        if let Some(f) = pinned {
            self.take_slot(&s, f).await?;
        }
        s.start_transaction().await.map_err(classify)?;
        Ok(s)
    }

    /// Records `s` as the holder of `f`'s slot, once per token, and aborts
    /// what an earlier holder (a lower token, another session) may have left
    /// open: a process killed mid-transaction would otherwise block the
    /// documents it wrote until the server reaps the transaction (60 s by
    /// default), and every queued operation behind it would wait as long.
    pub(super) async fn take_slot(&self, s: &ClientSession, f: &Fence) -> MetaResult<()> {
        let lsid = s.id().clone();
        let mine = (lsid.clone(), f.token);
        if self.pinned.lock().unwrap().recorded.get(&f.slot) == Some(&mine) {
            return Ok(());
        }
        let before = self
            .db
            .collection::<TxnHolder>("txn_holders")
            .find_one_and_update(
                doc! {"_id": &f.slot, "token": {"$lte": f.token}},
                doc! {"$set": {"lsid": &lsid, "token": f.token}},
            )
            .upsert(true)
            .await;
        match before.map_err(classify) {
            Ok(Some(earlier)) if earlier.lsid != lsid => {
                let kill = doc! {"killSessions": [&earlier.lsid]};
                match self.client.database("admin").run_command(kill).await {
                    Ok(_) => tracing::info!(
                        slot = f.slot,
                        earlier_token = earlier.token,
                        "aborted whatever the slot's earlier holder left open"
                    ),
                    Err(e) => tracing::warn!(
                        slot = f.slot,
                        error = %e,
                        "could not abort the slot's earlier holder's session"
                    ),
                }
            }
            Ok(_) => {}
            // A newer holder took the slot: our fence check will refuse us.
            Err(MetaError::Duplicate) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.pinned
            .lock()
            .unwrap()
            .recorded
            .insert(f.slot.clone(), mine);
        Ok(())
    }

    /// Ends (`killSessions`) the sessions a broken link may have left with
    /// an open transaction; keeps them for the next try if the server does
    /// not answer.
    pub(super) async fn end_stranded(&self) {
        let sessions = std::mem::take(&mut *self.stranded.lock().unwrap());
        if sessions.is_empty() {
            return;
        }
        let lsids: Vec<Document> = sessions.iter().map(|s| s.id().clone()).collect();
        let kill = doc! {"killSessions": lsids};
        match self.client.database("admin").run_command(kill).await {
            // Only now may they go back to the pool.
            Ok(_) => tracing::info!(n = sessions.len(), "ended sessions a broken link left open"),
            Err(e) => {
                tracing::debug!(error = %e, "could not end stranded sessions yet");
                self.stranded.lock().unwrap().extend(sessions);
            }
        }
    }

    /// Keeps ending the stranded sessions in the background, backing off,
    /// until none is left: once a link heals, what they hold is freed without
    /// waiting for this process's next transaction — other instances' writers
    /// (and the sweeper's) meet it too.
    fn reap_stranded(&self) {
        if self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let mut pause = REAP_PAUSE.0;
            loop {
                tokio::time::sleep(pause).await;
                store.end_stranded().await;
                if store.stranded.lock().unwrap().is_empty() {
                    store.reaping.store(false, Ordering::Release);
                    // A session stranded between the check and the store.
                    if store.stranded.lock().unwrap().is_empty()
                        || store.reaping.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                }
                pause = (pause * 2).min(REAP_PAUSE.1);
            }
        });
    }

    /// Ends the transaction by [`Self::end`]; a pinned slot's session goes
    /// back to its slot, unless a broken link stranded it.
    pub(super) async fn finish<T>(
        &self,
        mut s: ClientSession,
        fence: Option<&Fence>,
        result: MetaResult<T>,
    ) -> MetaResult<T> {
        let outcome = self.end(&mut s, result).await;
        if let Err(e) = &outcome
            && link_failed(e)
        {
            self.stranded.lock().unwrap().push(s);
            self.reap_stranded();
            return outcome;
        }
        if let Some(f) = fence.filter(|f| f.pinned) {
            self.pinned.lock().unwrap().idle.insert(f.slot.clone(), s);
        }
        outcome
    }

    /// Commits when `result` is Ok (retrying a commit whose outcome is
    /// unknown), aborts otherwise.
    pub(super) async fn end<T>(
        &self,
        s: &mut ClientSession,
        result: MetaResult<T>,
    ) -> MetaResult<T> {
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                // The driver ignores the abort's own errors: over a broken
                // link it may not arrive (see `stranded`).
                let _ = s.abort_transaction().await;
                return Err(e);
            }
        };
        crate::crash_point("before_txn_commit");
        let mut attempt = 1;
        loop {
            match s.commit_transaction().await {
                Ok(()) => return Ok(value),
                Err(e)
                    if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                        && attempt < COMMIT_ATTEMPTS =>
                {
                    attempt += 1;
                    tracing::debug!(attempt, "commit result unknown; retrying the commit");
                }
                // After an attempt whose result was unknown, a later "the
                // transaction is gone" proves nothing: the first may have
                // committed, and the server may not remember it.
                Err(e) if attempt > 1 => return Err(MetaError::OutcomeUnknown(e.to_string())),
                Err(e) => return Err(classify_commit(e)),
            }
        }
    }
}

/// The keys of `filter` that are operators (`$or`, `$and`, `$expr`): with
/// one, SecantusDB does not look the document up by its `_id` but scans.
#[cfg(test)]
pub(super) fn top_level_operators(filter: &Document) -> Vec<&str> {
    filter
        .keys()
        .filter(|k| k.starts_with('$'))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(slot: &str, token: i64) -> Fence {
        Fence {
            slot: slot.into(),
            token,
            pinned: false,
        }
    }

    #[test]
    fn fenced_filters_have_no_top_level_operator() {
        let (small, large) = (fence("small", 7), fence("large", 9));
        let mut filter = doc! {"_id": "u", "deleting_since": null};
        let mut update = doc! {"$inc": {"used_bytes": 1}};
        add_fences(&mut filter, &mut update, "upload_fence", &[&small, &large]);
        assert_eq!(top_level_operators(&filter), Vec::<&str>::new());
        assert_eq!(
            filter.get_document("upload_fence.small").unwrap(),
            &doc! {"$not": {"$gt": 7_i64}}
        );
        assert_eq!(
            filter.get_document("upload_fence.large").unwrap(),
            &doc! {"$not": {"$gt": 9_i64}}
        );
        let set = update.get_document("$set").unwrap();
        assert_eq!(set.get_i64("upload_fence.small").unwrap(), 7);
        assert_eq!(set.get_i64("upload_fence.large").unwrap(), 9);
    }
}
