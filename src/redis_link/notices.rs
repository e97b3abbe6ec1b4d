//! How a process hears notices published on Redis channels (a lock handed
//! over, a holder asked to let go), whatever the topology:
//!
//! - one node: one connection's pattern subscription (`PSUBSCRIBE`) covers
//!   every channel of the prefix, made once before any wait (with Sentinel,
//!   on the primary, made again on the new one when the primary moves);
//! - a cluster: a notice is published with `SPUBLISH` on the node that owns
//!   its channel's slot, so only a sharded subscription on that node hears
//!   it; a process subscribes (`SSUBSCRIBE`) to a channel only while one of
//!   its requests watches it ([`Notices::watch`]), so the subscriptions
//!   follow the keys waited on, spread over the nodes like the keys are.
//!
//! A notice can be missed (a connection dropped, a failover moved a slot);
//! the handler is then told ([`NoticeHandler::missed`]) so that waiters look
//! again, and each waiter's own re-poll covers the rest.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures::StreamExt;
use redis::{Client, PushInfo, PushKind, Value, cluster_async::ClusterConnection};
use tokio::sync::watch;

use super::sentinel::Primary;

/// How long connecting and subscribing may take.
const SUBSCRIBE_WITHIN: Duration = Duration::from_secs(2);
/// How long a listener waits before it subscribes again after a failure.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(250);
/// How long a cluster channel stays subscribed after its last watcher left
/// (the next waiter on a busy key finds it still subscribed).
const LINGER: Duration = Duration::from_secs(1);

/// What a process does with the notices it hears.
pub trait NoticeHandler: Send + Sync + 'static {
    /// A notice `payload` on `channel`.
    fn notice(&self, channel: &str, payload: &[u8]);
    /// Notices may have been missed: whoever waits for one should look again.
    fn missed(&self);
}

/// Where a link's notices come from (see the module).
pub struct Notices {
    kind: Kind,
}

enum Kind {
    /// The pattern subscription's task.
    Node(tokio::task::JoinHandle<()>),
    Cluster(Arc<Shards>, Arc<dyn NoticeHandler>),
}

impl Drop for Notices {
    fn drop(&mut self) {
        match &self.kind {
            Kind::Node(task) => task.abort(),
            Kind::Cluster(shards, handler) => shards.remove_handler(handler),
        }
    }
}

impl Notices {
    /// One node: keeps a pattern subscription to `patterns` open
    /// (reconnecting as needed).
    pub(super) fn on_node(
        client: Client,
        patterns: Vec<String>,
        handler: Arc<dyn NoticeHandler>,
    ) -> Self {
        let source = Source::Node(client);
        Self {
            kind: Kind::Node(tokio::spawn(subscribe_patterns(source, patterns, handler))),
        }
    }

    /// A Sentinel-watched primary: as one node, following the primary.
    pub(super) fn on_primary(
        primary: Arc<Primary>,
        patterns: Vec<String>,
        handler: Arc<dyn NoticeHandler>,
    ) -> Self {
        let source = Source::Primary(primary);
        Self {
            kind: Kind::Node(tokio::spawn(subscribe_patterns(source, patterns, handler))),
        }
    }

    /// A cluster: only watched channels are heard.
    pub(super) fn on_cluster(shards: Arc<Shards>, handler: Arc<dyn NoticeHandler>) -> Self {
        shards.handlers.lock().unwrap().push(handler.clone());
        Self {
            kind: Kind::Cluster(shards, handler),
        }
    }

    /// Makes sure `channel` is heard while the returned [`Watch`] lives.
    /// On one node its pattern already covers it. On a cluster this
    /// subscribes if no other watcher has; a notice published before the
    /// subscription was confirmed was not heard, which [`Watch::fresh`]
    /// tells (the caller then looks once more). A subscription that fails
    /// leaves the caller to its re-polls.
    pub async fn watch(&self, channel: &str) -> Watch {
        match &self.kind {
            Kind::Node(_) => Watch {
                fresh: false,
                held: None,
            },
            Kind::Cluster(shards, _) => shards.watch(channel).await,
        }
    }
}

/// A channel watched (see [`Notices::watch`]); unwatched when dropped.
pub struct Watch {
    /// A subscription was made for this watch: notices before it were missed.
    pub fresh: bool,
    held: Option<(Arc<Shards>, String)>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some((shards, channel)) = self.held.take() {
            shards.unwatch(channel);
        }
    }
}

/// Where a pattern subscription is made.
enum Source {
    Node(Client),
    /// The primary now; when it is forgotten, the subscription moves.
    Primary(Arc<Primary>),
}

async fn subscribe_patterns(
    source: Source,
    patterns: Vec<String>,
    handler: Arc<dyn NoticeHandler>,
) {
    loop {
        // Watched before the primary is asked: a move meanwhile is seen.
        let (client, mut moved) = match &source {
            Source::Node(client) => (Ok(client.clone()), None),
            Source::Primary(primary) => {
                let moved = primary.forgotten();
                (primary.client().await.map(|(_, c)| c), Some(moved))
            }
        };
        // Bounded: a node that does not answer is given up, not waited on.
        let subscribed = tokio::time::timeout(SUBSCRIBE_WITHIN, async {
            let mut pubsub = client?.get_async_pubsub().await?;
            pubsub.psubscribe(&patterns).await.map(|()| pubsub)
        });
        let subscribed = match subscribed.await {
            Ok(subscribed) => subscribed,
            Err(_) => Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            ))),
        };
        match subscribed {
            Ok(mut pubsub) => {
                // Notices published before this subscription were not heard.
                handler.missed();
                {
                    let mut messages = pubsub.on_message();
                    loop {
                        tokio::select! {
                            msg = messages.next() => match msg {
                                Some(msg) => {
                                    handler.notice(msg.get_channel_name(), msg.get_payload_bytes());
                                }
                                None => break,
                            },
                            () = changed(&mut moved) => break,
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "notice subscription failed"),
        }
        handler.missed();
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

/// Resolves when `moved` changes (never without one).
async fn changed(moved: &mut Option<watch::Receiver<u64>>) {
    match moved {
        Some(moved) => {
            if moved.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// A cluster's sharded subscriptions, on a cluster connection of their own
/// (the crate takes a node's unrequested `sunsubscribe` for the answer to
/// the oldest request on that node: it must not be a lock script), whose
/// pushes come to [`Shards::on_push`].
#[derive(Default)]
pub(super) struct Shards {
    conn: std::sync::OnceLock<ClusterConnection>,
    handlers: Mutex<Vec<Arc<dyn NoticeHandler>>>,
    /// Each watched channel: its watchers, and whether it is subscribed
    /// (changed only under its lock, so that a subscription and an
    /// unsubscription of one channel never cross).
    channels: Mutex<HashMap<String, Channel>>,
    /// Channels this process is unsubscribing from.
    leaving: Mutex<std::collections::HashSet<String>>,
}

struct Channel {
    watchers: usize,
    subscribed: Arc<tokio::sync::Mutex<bool>>,
}

impl Shards {
    /// Gives the shards the connection whose pushes they receive.
    pub(super) fn attach(&self, conn: ClusterConnection) {
        let _ = self.conn.set(conn);
    }

    fn conn(&self) -> ClusterConnection {
        self.conn.get().expect("attached at connect").clone()
    }

    fn remove_handler(&self, handler: &Arc<dyn NoticeHandler>) {
        self.handlers
            .lock()
            .unwrap()
            .retain(|h| !Arc::ptr_eq(h, handler));
    }

    fn handlers(&self) -> Vec<Arc<dyn NoticeHandler>> {
        self.handlers.lock().unwrap().clone()
    }

    async fn watch(self: &Arc<Self>, channel: &str) -> Watch {
        let subscribed = {
            let mut channels = self.channels.lock().unwrap();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    watchers: 0,
                    subscribed: Arc::default(),
                });
            entry.watchers += 1;
            entry.subscribed.clone()
        };
        // Made before any wait: a watch dropped mid-way (its request
        // cancelled) still counts its watcher out.
        let mut watch = Watch {
            fresh: false,
            held: Some((self.clone(), channel.to_owned())),
        };
        let mut subscribed = subscribed.lock().await;
        if *subscribed {
            return watch;
        }
        match self.conn().ssubscribe(channel).await {
            Ok(()) => {
                *subscribed = true;
                watch.fresh = true;
            }
            Err(e) => {
                tracing::debug!(error = %e, channel, "sharded subscription failed; re-polling instead");
            }
        }
        watch
    }

    /// One watcher fewer; the last one's leaving unsubscribes after [`LINGER`].
    fn unwatch(self: Arc<Self>, channel: String) {
        {
            let mut channels = self.channels.lock().unwrap();
            let Some(entry) = channels.get_mut(&channel) else {
                return;
            };
            entry.watchers -= 1;
            if entry.watchers > 0 {
                return;
            }
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            tokio::time::sleep(LINGER).await;
            let Some(subscribed) = self.idle(&channel) else {
                return;
            };
            let mut subscribed = subscribed.lock().await;
            if self.idle(&channel).is_none() {
                return;
            }
            // Even if not marked subscribed: a watch cancelled while its
            // `SSUBSCRIBE` was in flight left one the node knows of.
            // Its confirmation is this process's own, not a node's
            // dropping the channel (see `on_push`).
            self.leaving.lock().unwrap().insert(channel.clone());
            if let Err(e) = self.conn().sunsubscribe(&channel).await {
                // The crate resubscribes what it tracks after a
                // reconnection; one stray subscription costs a few bytes.
                tracing::debug!(error = %e, channel, "sharded unsubscription failed");
            }
            self.leaving.lock().unwrap().remove(&channel);
            *subscribed = false;
            let mut channels = self.channels.lock().unwrap();
            if channels.get(&channel).is_some_and(|c| c.watchers == 0) {
                channels.remove(&channel);
            }
        });
    }

    /// The channel's lock if nobody watches it.
    fn idle(&self, channel: &str) -> Option<Arc<tokio::sync::Mutex<bool>>> {
        let channels = self.channels.lock().unwrap();
        let entry = channels.get(channel)?;
        (entry.watchers == 0).then(|| entry.subscribed.clone())
    }

    /// The channel's lock if somebody watches it.
    fn watched(&self, channel: &str) -> Option<Arc<tokio::sync::Mutex<bool>>> {
        let channels = self.channels.lock().unwrap();
        let entry = channels.get(channel)?;
        (entry.watchers > 0).then(|| entry.subscribed.clone())
    }

    /// The channel's lock, watched or lingering.
    fn known(&self, channel: &str) -> Option<Arc<tokio::sync::Mutex<bool>>> {
        let channels = self.channels.lock().unwrap();
        channels.get(channel).map(|entry| entry.subscribed.clone())
    }

    /// A push from any node of the cluster.
    pub(super) fn on_push(self: &Arc<Self>, push: PushInfo) {
        match push.kind {
            PushKind::SMessage => {
                if let [channel, payload, ..] = push.data.as_slice()
                    && let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload))
                {
                    let channel = String::from_utf8_lossy(channel);
                    for handler in self.handlers() {
                        handler.notice(&channel, payload);
                    }
                }
            }
            // A node that lost the channel's slot (a failover, a slot moved)
            // drops its subscribers, and the crate forgets the channel: it
            // is marked unsubscribed and, while watched, subscribed again
            // where the slot is now. (This process's own unsubscriptions
            // are not the node's doing.)
            PushKind::SUnsubscribe => {
                if let Some(channel) = push.data.first().and_then(bytes) {
                    let channel = String::from_utf8_lossy(channel).into_owned();
                    let own = self.leaving.lock().unwrap().contains(&channel);
                    if !own && self.known(&channel).is_some() {
                        tokio::spawn(self.clone().resubscribe(channel));
                    }
                }
            }
            PushKind::Disconnection => self.handlers().iter().for_each(|h| h.missed()),
            _ => {}
        }
    }

    /// Marks `channel` unsubscribed and subscribes it again while it is
    /// watched, until that succeeds; then the watchers look again (a notice
    /// may have come meanwhile).
    async fn resubscribe(self: Arc<Self>, channel: String) {
        loop {
            let Some(subscribed) = self.known(&channel) else {
                return;
            };
            let mut subscribed = subscribed.lock().await;
            *subscribed = false;
            if self.watched(&channel).is_none() {
                return;
            }
            match self.conn().ssubscribe(&channel).await {
                Ok(()) => {
                    *subscribed = true;
                    self.handlers().iter().for_each(|h| h.missed());
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, channel, "sharded resubscription failed; trying again");
                }
            }
            drop(subscribed);
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
        }
    }
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

/// The push sender a cluster connection is built with: its pushes go to
/// `shards` (weakly held: the connection is the shards' own).
pub(super) fn push_sender(
    shards: Weak<Shards>,
) -> impl Fn(PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync + 'static {
    move |push| {
        if let Some(shards) = shards.upgrade() {
            shards.on_push(push);
        }
        Ok(())
    }
}
