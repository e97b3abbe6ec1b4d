//! A Sentinel-watched primary: the connection follows whichever node the
//! sentinels name primary. It asks them (and checks the node's `ROLE`)
//! when it has no primary yet; forgets the one it has when it answers
//! `READONLY` (demoted) or cannot be reached, so the next call asks again;
//! and listens for `+switch-master` on a sentinel, so that it leaves a
//! demoted primary that still accepts writes (seen for ~11 s after a
//! failover) as soon as the sentinels decide.

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::StreamExt;
use redis::{
    Client, ConnectionInfo, RedisError, RedisResult,
    aio::ConnectionManager,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};
use tokio::sync::watch;

use super::{
    fault::{Fault, fault_of},
    timeouts::connection_config,
};

/// How long asking the sentinels for the primary may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the `+switch-master` listener waits before it subscribes again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(500);

/// The primary now, and how it is reached.
#[derive(Clone)]
struct Current {
    /// Bumped each time the primary is forgotten: a call forgets only the
    /// primary it used.
    generation: u64,
    client: Client,
    conn: ConnectionManager,
}

pub struct Primary {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: String,
    current: RwLock<Option<Current>>,
    /// The generation of the primary forgotten last; watched by the
    /// subscriptions that must move to the new primary.
    forgotten: watch::Sender<u64>,
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Primary {
    fn drop(&mut self) {
        if let Some(task) = self.listener.lock().unwrap().take() {
            task.abort();
        }
    }
}

impl Primary {
    /// The sentinels at `urls` (comma-separated), for the master named
    /// `master`; the first URL's credentials and database are the
    /// primary's too. Lazy: nothing is asked until a call needs it.
    pub fn new(urls: &str, master: &str) -> anyhow::Result<Arc<Self>> {
        let sentinels: Vec<ConnectionInfo> = urls
            .split(',')
            .map(|u| redis::IntoConnectionInfo::into_connection_info(u.trim()))
            .collect::<RedisResult<_>>()?;
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(sentinels[0].redis_settings().clone());
        let client = SentinelClient::build(
            sentinels,
            master.to_owned(),
            Some(node),
            SentinelServerType::Master,
        )?;
        let primary = Arc::new(Self {
            sentinels: tokio::sync::Mutex::new(client),
            master: master.to_owned(),
            current: RwLock::new(None),
            forgotten: watch::Sender::new(0),
            listener: std::sync::Mutex::new(None),
        });
        let task = tokio::spawn(listen_for_switches(Arc::downgrade(&primary)));
        *primary.listener.lock().unwrap() = Some(task);
        Ok(primary)
    }

    /// The primary's connection (asking the sentinels if there is none)
    /// and its generation.
    pub async fn conn(&self) -> RedisResult<(u64, ConnectionManager)> {
        self.current().await.map(|c| (c.generation, c.conn))
    }

    /// The primary's client, for connections of a caller's own.
    pub async fn client(&self) -> RedisResult<(u64, Client)> {
        self.current().await.map(|c| (c.generation, c.client))
    }

    /// Signals each time a primary is forgotten.
    pub fn forgotten(&self) -> watch::Receiver<u64> {
        self.forgotten.subscribe()
    }

    async fn current(&self) -> RedisResult<Current> {
        if let Some(current) = self.current.read().unwrap().clone() {
            return Ok(current);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have found it meanwhile.
        if let Some(current) = self.current.read().unwrap().clone() {
            return Ok(current);
        }
        let client = tokio::time::timeout(ASK_TIMEOUT, sentinels.async_get_client())
            .await
            .map_err(|_| timed_out())??;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), connection_config())?;
        let current = Current {
            generation: *self.forgotten.borrow(),
            client,
            conn,
        };
        *self.current.write().unwrap() = Some(current.clone());
        Ok(current)
    }

    /// Forgets the primary of `generation` (if it is still the one), so
    /// that the next call asks the sentinels.
    pub fn forget(&self, generation: u64) {
        let mut current = self.current.write().unwrap();
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
            self.forgotten.send_replace(generation + 1);
        }
    }

    /// After a call on the primary of `generation` failed with `e`: a
    /// primary that answers `READONLY` was demoted, one that cannot be
    /// reached may be gone; either is forgotten.
    pub fn after_error(&self, generation: u64, e: &RedisError) {
        let demoted = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if demoted || (fault_of(e) == Fault::Outage && (e.is_io_error() || e.is_timeout())) {
            self.forget(generation);
        }
    }

    /// The sentinels' `SENTINEL GET-MASTER-ADDR-BY-NAME`: `Ok(None)` if
    /// none knows the master (a wrong name), an error if none answers.
    pub async fn known(&self) -> RedisResult<Option<String>> {
        let sentinel = self
            .sentinels
            .lock()
            .await
            .async_get_sentinel_client()
            .await?;
        let mut conn = sentinel.get_multiplexed_async_connection().await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        Ok(addr.map(|(host, port)| format!("{host}:{port}")))
    }
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// Listens on one sentinel for `+switch-master` of this master (and goes
/// to another when it drops): the primary moved, the one in use is
/// forgotten at once.
async fn listen_for_switches(primary: std::sync::Weak<Primary>) {
    loop {
        let Some(strong) = primary.upgrade() else {
            return;
        };
        let sentinel = strong
            .sentinels
            .lock()
            .await
            .async_get_sentinel_client()
            .await;
        let master = strong.master.clone();
        drop(strong);
        if let Ok(sentinel) = sentinel
            && let Ok(mut pubsub) = sentinel.get_async_pubsub().await
            && pubsub.subscribe("+switch-master").await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let payload: String = msg.get_payload().unwrap_or_default();
                // "<master> <old ip> <old port> <new ip> <new port>"
                if payload.split(' ').next() != Some(master.as_str()) {
                    continue;
                }
                let Some(primary) = primary.upgrade() else {
                    return;
                };
                let generation = primary
                    .current
                    .read()
                    .unwrap()
                    .as_ref()
                    .map(|c| c.generation);
                if let Some(generation) = generation {
                    tracing::info!(master, "Sentinel switched the primary; following it");
                    primary.forget(generation);
                }
            }
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}
