//! The events' bell: rung once a change that wrote events has committed,
//! heard by the readers waiting for their owner's next event (a long
//! poll, `GET /v1/events?wait=`), so that they read the store again only
//! when there may be something new. [`Bells`] serves one process; the
//! Redis one (`coord::bell`) carries a ring to every instance.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::vocab::UserId;

#[async_trait]
pub trait EventBell: Send + Sync {
    /// `owner` has a new event (or may have: an unknown outcome rings too).
    async fn ring(&self, owner: &UserId);

    /// Hears `owner`'s rings from now on: a ring after this call wakes the
    /// listener, however soon it comes.
    async fn listen(&self, owner: &UserId) -> Listener;
}

/// One process's waiting readers, by owner.
#[derive(Clone, Default)]
pub struct Bells {
    owners: Arc<Mutex<HashMap<UserId, watch::Sender<u64>>>>,
}

impl Bells {
    /// Wakes `owner`'s listeners here.
    pub fn ring_here(&self, owner: &UserId) {
        let mut owners = self.owners.lock().unwrap();
        if let Some(tx) = owners.get(owner) {
            tx.send_modify(|n| *n += 1);
            if tx.receiver_count() == 0 {
                owners.remove(owner);
            }
        }
    }

    /// Wakes every listener here (rings may have been missed).
    pub fn ring_all(&self) {
        for tx in self.owners.lock().unwrap().values() {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// A listener for `owner`'s rings here.
    pub fn listener(&self, owner: &UserId) -> Listener {
        let rx = self
            .owners
            .lock()
            .unwrap()
            .entry(*owner)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Listener {
            rx: Some(rx),
            owner: *owner,
            bells: self.clone(),
            _held: None,
        }
    }
}

#[async_trait]
impl EventBell for Bells {
    async fn ring(&self, owner: &UserId) {
        self.ring_here(owner);
    }

    async fn listen(&self, owner: &UserId) -> Listener {
        self.listener(owner)
    }
}

/// Hears one owner's rings (see [`EventBell::listen`]).
pub struct Listener {
    /// Taken out when the listener goes (see `Drop`).
    rx: Option<watch::Receiver<u64>>,
    owner: UserId,
    bells: Bells,
    /// What keeps the rings coming while it lives (a cluster subscription).
    _held: Option<Box<dyn Send + Sync>>,
}

impl Listener {
    /// Keeps `held` as long as the listener.
    pub fn holding(mut self, held: impl Send + Sync + 'static) -> Self {
        self._held = Some(Box::new(held));
        self
    }

    /// Returns at the next ring since the listener was made (or since the
    /// last return).
    pub async fn rung(&mut self) {
        let Some(rx) = self.rx.as_mut() else {
            return;
        };
        if rx.changed().await.is_err() {
            // The sender went (no other listener): nothing rings it now.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut owners = self.bells.owners.lock().unwrap();
        // Let go under the lock, so that of two listeners going at once
        // the second sees the first gone: the last one's entry goes.
        drop(self.rx.take());
        if owners
            .get(&self.owner)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            owners.remove(&self.owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_ring_after_listening_wakes_only_that_owners_listeners() {
        let bells = Bells::default();
        let (ann, bob) = (UserId::new(), UserId::new());
        let mut a = bells.listener(&ann);
        let mut b = bells.listener(&bob);
        bells.ring_here(&ann);
        tokio::time::timeout(Duration::from_secs(1), a.rung())
            .await
            .expect("ann's listener woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), b.rung())
                .await
                .is_err(),
            "bob's not"
        );
        bells.ring_all();
        tokio::time::timeout(Duration::from_secs(1), b.rung())
            .await
            .expect("every listener woken by ring_all");
        drop((a, b));
        assert!(
            bells.owners.lock().unwrap().is_empty(),
            "entries go with their listeners"
        );
    }
}
