//! What stops a PATCH's body before its client ends it: another request's
//! ask to let go of the upload (honoured once the body has been silent a
//! while: a live client keeps its upload), or, on any ask, its user being
//! deleted (honoured at once: a client trickling a byte every few seconds
//! would otherwise hold the deletion up for ever).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use tokio::time::Instant;

use super::RELEASE_IDLE;
use crate::{
    blob::{BodyError, ByteStream, budget::LetGo},
    lock::Asked,
};

/// What a PATCH's body reads as once another request asked for the upload.
const RELEASED: &str = "another request on this upload asked this PATCH to stop";
/// What it reads as once its user's deletion asked for it.
const USER_DELETED: &str = "this upload's user is being deleted";

/// How recent the newest release request must be for a PATCH to honour
/// it: a requester that still waits asks again every
/// [`crate::lock::RELEASE_ASKED_EVERY`]; one that gave up (a HEAD after its wait) no
/// longer counts, so it cannot cut the PATCH later.
const RELEASE_FRESH: Duration = Duration::from_secs(1);

/// Whether the PATCH's user is being deleted (or gone), as the store has
/// it now: the record the request authenticated with predates the mark.
pub(super) type UserLeaving = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Why the server, not the client, cut a PATCH's body.
#[derive(Default)]
pub(super) struct Stopped {
    /// Another request asked for the upload: what arrived is stored.
    released: AtomicBool,
    /// The user's deletion asked for it: nothing of it is kept.
    user_leaving: AtomicBool,
}

impl Stopped {
    pub(super) fn released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(super) fn user_leaving(&self) -> bool {
        self.user_leaving.load(Ordering::SeqCst)
    }
}

/// `body` until a release request is fresh while the body has been silent
/// for [`RELEASE_IDLE`] (measured from when this PATCH last waited for it,
/// not from a stall of its own), or until any fresh release request finds
/// the user being deleted; then a cut, and `stopped` says which. A body
/// still flowing is read on, unless its user is leaving.
pub(super) fn until_released(
    body: ByteStream<'static>,
    asked: Option<Asked>,
    leaving: UserLeaving,
    stopped: Arc<Stopped>,
) -> ByteStream<'static> {
    let Some(asked) = asked else { return body };
    // The user's check runs beside the body, not in the race with each
    // chunk: a body that flows fast would otherwise drop every check (its
    // store read) for its next chunk, and never be stopped. Its own
    // receiver: it marks the asks it has seen.
    let (found, gone) = tokio::sync::watch::channel(false);
    let mut deletion = asked.clone();
    let watcher = tokio::spawn(async move {
        asked_while_leaving(&mut deletion, &leaving).await;
        let _ = found.send(true);
    });
    let watcher = AbortOnDrop(watcher.abort_handle());
    let start = (body, asked, gone, watcher, false);
    futures::stream::unfold(start, move |(mut body, mut asked, gone, watcher, cut)| {
        let stopped = stopped.clone();
        async move {
            if cut {
                return None;
            }
            let waiting_since = Instant::now();
            let mut user_check = gone.clone();
            let why = tokio::select! {
                biased;
                Ok(_) = user_check.wait_for(|found| *found) => {
                    stopped.user_leaving.store(true, Ordering::SeqCst);
                    USER_DELETED
                }
                chunk = body.next() => {
                    return chunk.map(|c| (c, (body, asked, gone, watcher, false)));
                }
                () = asked_while_silent(&mut asked, waiting_since) => {
                    stopped.released.store(true, Ordering::SeqCst);
                    RELEASED
                }
            };
            let cut = Err(BodyError::Read(std::io::Error::other(why)));
            Some((cut, (body, asked, gone, watcher, true)))
        }
    })
    .boxed()
}

/// Ends the user's check when the body it watches is dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Once a fresh release request finds the user being deleted. Each ask is
/// checked once (one read of the user); the deletion asks again every
/// [`crate::lock::RELEASE_ASKED_EVERY`] while it waits.
async fn asked_while_leaving(asked: &mut Asked, leaving: &UserLeaving) {
    loop {
        if asked.changed().await.is_err() {
            return std::future::pending().await;
        }
        let last = *asked.borrow_and_update();
        if last.is_some_and(|at| at.elapsed() <= RELEASE_FRESH) && leaving().await {
            return;
        }
    }
}

/// Once a fresh release request stands and the body has been silent since
/// `waiting_since` for [`RELEASE_IDLE`].
async fn asked_while_silent(asked: &mut Asked, waiting_since: Instant) {
    asked_by(asked, waiting_since + RELEASE_IDLE).await;
}

/// Resolves once a fresh release request stands at or after `silent_at`.
async fn asked_by(asked: &mut Asked, silent_at: Instant) {
    loop {
        let last = *asked.borrow_and_update();
        let now = Instant::now();
        match last {
            Some(at) if now.duration_since(at) <= RELEASE_FRESH => {
                if now >= silent_at {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(silent_at) => {}
                    _ = asked.changed() => {}
                }
            }
            _ => {
                if asked.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// A wait for upload memory stops as soon as a fresh release request
/// stands: nothing is read from the body while it waits, so it need not be
/// silent first.
pub(super) fn let_go(asked: &Asked) -> LetGo {
    let asked = asked.clone();
    Arc::new(move || {
        let mut asked = asked.clone();
        async move { asked_by(&mut asked, Instant::now()).await }.boxed()
    })
}
