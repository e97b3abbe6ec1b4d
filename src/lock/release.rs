//! Lock-release requests (as tusd's): a request that finds a lock held can
//! ask its holder, on whichever instance it runs, to finish what it can
//! and let go, instead of waiting for a holder that may be stuck on a
//! client that went silent. The manager carries the request (Redis: a
//! `PUBLISH` on the key's `:release` channel; in process: directly); each
//! process keeps a [`ReleaseBoard`] of its holders that listen for one.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{sync::watch, time::Instant};

/// When the newest release request for a holder came (`None`: none yet).
pub type Asked = watch::Receiver<Option<Instant>>;
/// The board's end of a holder's [`Asked`].
type Ask = watch::Sender<Option<Instant>>;

/// This process's holders that listen for release requests, by lock key.
#[derive(Clone, Default)]
pub struct ReleaseBoard {
    inner: Arc<Board>,
}

#[derive(Default)]
struct Board {
    by_key: Mutex<HashMap<String, Vec<(u64, Ask)>>>,
    next: AtomicU64,
}

impl ReleaseBoard {
    /// Listens for release requests on `key` until the listener is dropped.
    pub fn listen(&self, key: &str) -> ReleaseListener {
        self.listen_keeping(key, ())
    }

    /// [`Self::listen`], keeping `keep` (what makes the requests heard:
    /// a subscription) as long as the listener.
    pub fn listen_keeping(&self, key: &str, keep: impl Send + Sync + 'static) -> ReleaseListener {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let (asked, requests) = watch::channel(None);
        self.inner
            .by_key
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default()
            .push((id, asked));
        ReleaseListener {
            board: self.clone(),
            key: key.to_owned(),
            id,
            requests,
            _keep: Box::new(keep),
        }
    }

    /// Tells every local listener on `key` that another request wants it.
    pub fn signal(&self, key: &str) {
        if let Some(listeners) = self.inner.by_key.lock().unwrap().get(key) {
            let now = Instant::now();
            for (_, asked) in listeners {
                asked.send_replace(Some(now));
            }
        }
    }
}

/// A holder's ear for release requests on its key; stops listening when dropped.
pub struct ReleaseListener {
    board: ReleaseBoard,
    key: String,
    id: u64,
    requests: Asked,
    _keep: Box<dyn Send + Sync>,
}

impl ReleaseListener {
    /// When another request last asked for the lock (a requester that
    /// waits asks again every [`super::RELEASE_ASKED_EVERY`]).
    pub fn requests(&self) -> Asked {
        self.requests.clone()
    }
}

impl Drop for ReleaseListener {
    fn drop(&mut self) {
        let mut by_key = self.board.inner.by_key.lock().unwrap();
        if let Some(listeners) = by_key.get_mut(&self.key) {
            listeners.retain(|(id, _)| *id != self.id);
            if listeners.is_empty() {
                by_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReleaseBoard;

    #[tokio::test]
    async fn a_signal_reaches_the_listeners_of_its_key_only() {
        let board = ReleaseBoard::default();
        let (a, b) = (board.listen("k1"), board.listen("k2"));
        board.signal("k1");
        assert!(a.requests().borrow().is_some());
        assert!(b.requests().borrow().is_none());
        drop(a);
        assert!(!board.inner.by_key.lock().unwrap().contains_key("k1"));
        // A listener that starts after a signal does not see it.
        let c = board.listen("k1");
        assert!(c.requests().borrow().is_none());
    }
}
