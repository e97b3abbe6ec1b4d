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

use tokio_util::sync::CancellationToken;

/// This process's holders that listen for release requests, by lock key.
#[derive(Clone, Default)]
pub struct ReleaseBoard {
    inner: Arc<Board>,
}

#[derive(Default)]
struct Board {
    by_key: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next: AtomicU64,
}

impl ReleaseBoard {
    /// Listens for release requests on `key` until the listener is dropped.
    pub fn listen(&self, key: &str) -> ReleaseListener {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.inner
            .by_key
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default()
            .push((id, token.clone()));
        ReleaseListener {
            board: self.clone(),
            key: key.to_owned(),
            id,
            token,
        }
    }

    /// Tells every local listener on `key` that another request wants it.
    pub fn signal(&self, key: &str) {
        if let Some(listeners) = self.inner.by_key.lock().unwrap().get(key) {
            for (_, token) in listeners {
                token.cancel();
            }
        }
    }
}

/// A holder's ear for release requests on its key; stops listening when dropped.
pub struct ReleaseListener {
    board: ReleaseBoard,
    key: String,
    id: u64,
    token: CancellationToken,
}

impl ReleaseListener {
    /// Fires once another request asked for the lock.
    pub fn requested(&self) -> CancellationToken {
        self.token.clone()
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

    #[test]
    fn a_signal_reaches_the_listeners_of_its_key_only() {
        let board = ReleaseBoard::default();
        let (a, b) = (board.listen("k1"), board.listen("k2"));
        board.signal("k1");
        assert!(a.requested().is_cancelled());
        assert!(!b.requested().is_cancelled());
        drop(a);
        assert!(!board.inner.by_key.lock().unwrap().contains_key("k1"));
        // A listener that starts after a signal does not see it.
        let c = board.listen("k1");
        assert!(!c.requested().is_cancelled());
    }
}
