//! A Sentinel-watched primary: the connection follows whichever node the
//! sentinels name primary. It asks them (and checks the node's `ROLE`)
//! when it has no primary yet; forgets the one it has when it answers
//! `READONLY` (demoted) or cannot be reached, so the next call asks again;
//! and a watcher asks the sentinels every second where the primary is,
//! forgetting the one in use as soon as they name another (a demoted
//! primary was seen accepting writes for ~11 s after a failover, and one
//! cut off from the sentinels may never refuse a write).

use std::{
    sync::{Arc, Mutex, RwLock, Weak},
    time::{Duration, Instant},
};

use redis::{
    Client, ConnectionInfo, RedisError, RedisResult,
    aio::{ConnectionManager, MultiplexedConnection},
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};
use tokio::sync::watch;

use super::{
    fault::{Fault, fault_of},
    timeouts::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT, connection_config},
};

/// How long finding the primary may take, waiting for another caller's
/// lookup included.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// After a failed lookup, how long callers are answered with its failure
/// instead of each asking again in turn.
const FAILED_FOR: Duration = Duration::from_millis(500);
/// How often the watcher asks the sentinels where the primary is.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The primary now, and how it is reached.
#[derive(Clone)]
struct Current {
    /// Bumped each time the primary is forgotten: a call forgets only the
    /// primary it used.
    generation: u64,
    /// `host:port`, as the sentinels name it.
    addr: String,
    client: Client,
    conn: ConnectionManager,
}

pub struct Primary {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The sentinels, for the watcher's own connections.
    nodes: Vec<ConnectionInfo>,
    master: String,
    current: RwLock<Option<Current>>,
    /// When the last lookup failed, and how.
    failed: Mutex<Option<(Instant, String)>>,
    /// The generation of the primary forgotten last; watched by the
    /// subscriptions that must move to the new primary.
    forgotten: watch::Sender<u64>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Primary {
    fn drop(&mut self) {
        if let Some(task) = self.watcher.lock().unwrap().take() {
            task.abort();
        }
    }
}

impl Primary {
    /// The sentinels at `urls` (comma-separated), for the master named
    /// `master`; the first URL's credentials and database are the
    /// primary's (the sentinels get the credentials, never a database).
    /// Lazy: nothing is asked until a call needs it.
    pub fn new(urls: &str, master: &str) -> anyhow::Result<Arc<Self>> {
        let given: Vec<ConnectionInfo> = urls
            .split(',')
            .map(|u| redis::IntoConnectionInfo::into_connection_info(u.trim()))
            .collect::<RedisResult<_>>()?;
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(given[0].redis_settings().clone());
        let nodes: Vec<ConnectionInfo> = given
            .into_iter()
            .map(|info| {
                let settings = info.redis_settings().clone().set_db(0);
                info.set_redis_settings(settings)
            })
            .collect();
        let client = SentinelClient::build(
            nodes.clone(),
            master.to_owned(),
            Some(node),
            SentinelServerType::Master,
        )?;
        let primary = Arc::new(Self {
            sentinels: tokio::sync::Mutex::new(client),
            nodes,
            master: master.to_owned(),
            current: RwLock::new(None),
            failed: Mutex::new(None),
            forgotten: watch::Sender::new(0),
            watcher: Mutex::new(None),
        });
        let task = tokio::spawn(watch_the_sentinels(Arc::downgrade(&primary)));
        *primary.watcher.lock().unwrap() = Some(task);
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

    /// Whether the primary of `generation` has not been forgotten.
    pub fn is_current(&self, generation: u64) -> bool {
        *self.forgotten.borrow() == generation
    }

    async fn current(&self) -> RedisResult<Current> {
        if let Some(current) = self.current.read().unwrap().clone() {
            return Ok(current);
        }
        tokio::time::timeout(ASK_TIMEOUT, self.look_up())
            .await
            .map_err(|_| timed_out())?
    }

    /// Asks the sentinels, one caller at a time; a failure is shared for
    /// [`FAILED_FOR`] with the callers queued behind it.
    async fn look_up(&self) -> RedisResult<Current> {
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have found it meanwhile, or just failed to.
        if let Some(current) = self.current.read().unwrap().clone() {
            return Ok(current);
        }
        if let Some((at, why)) = self.failed.lock().unwrap().clone()
            && at.elapsed() < FAILED_FOR
        {
            return Err(not_found(why));
        }
        let generation = *self.forgotten.borrow();
        let client = match sentinels.async_get_client().await {
            Ok(client) => client,
            Err(e) => {
                *self.failed.lock().unwrap() = Some((Instant::now(), e.to_string()));
                return Err(e);
            }
        };
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), connection_config())?;
        let current = Current {
            generation,
            addr: client.get_connection_info().addr().to_string(),
            client,
            conn,
        };
        let mut slot = self.current.write().unwrap();
        // Forgotten meanwhile (the watcher saw a switch): the answer may
        // be the old primary; the next call asks again.
        if *self.forgotten.borrow() != generation {
            return Err(not_found("the primary moved during the lookup".into()));
        }
        *slot = Some(current.clone());
        *self.failed.lock().unwrap() = None;
        Ok(current)
    }

    /// Forgets the primary of `generation` (if it is still the one), so
    /// that the next call asks the sentinels. (A lookup answered with the
    /// old primary just before a switch is caught by the watcher's next look.)
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

    /// `answer`, of a call on the primary of `generation`; an error
    /// forgets that primary as [`Self::after_error`] says.
    pub async fn watched<T>(
        &self,
        generation: u64,
        answer: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        let answer = answer.await;
        if let Err(e) = &answer {
            self.after_error(generation, e);
        }
        answer
    }

    /// Where the sentinels say the primary is: the first that answers.
    /// `Ok(None)`: it knows no master of that name.
    pub async fn known(&self) -> RedisResult<Option<String>> {
        self.known_through(&mut Vec::new()).await
    }

    /// [`Self::known`] through `conns` (one per sentinel, kept between
    /// calls: the watcher asks every second).
    async fn known_through(
        &self,
        conns: &mut Vec<Option<MultiplexedConnection>>,
    ) -> RedisResult<Option<String>> {
        conns.resize(self.nodes.len(), None);
        let mut last = Err(timed_out());
        for (node, conn) in self.nodes.iter().zip(conns.iter_mut()) {
            last = ask_sentinel(node, conn, &self.master).await;
            if last.is_ok() {
                break;
            }
            // A connection that failed is made again next time.
            *conn = None;
        }
        last
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` of one sentinel, through `conn`
/// (connected first if need be), bounded in time.
async fn ask_sentinel(
    node: &ConnectionInfo,
    conn: &mut Option<MultiplexedConnection>,
    master: &str,
) -> RedisResult<Option<String>> {
    let ask = async {
        if conn.is_none() {
            let client = Client::open(node.clone())?;
            *conn = Some(client.get_multiplexed_async_connection().await?);
        }
        let conn = conn.as_mut().expect("connected just above");
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async(conn)
            .await?;
        Ok(addr.map(|(host, port)| format!("{host}:{port}")))
    };
    tokio::time::timeout(CONNECT_TIMEOUT + RESPONSE_TIMEOUT, ask)
        .await
        .map_err(|_| timed_out())?
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

fn not_found(why: String) -> RedisError {
    RedisError::from((
        redis::ErrorKind::MasterNameNotFoundBySentinel,
        "no primary found",
        why,
    ))
}

/// Every [`WATCH_EVERY`], asks the sentinels where the primary is; when
/// they name another than the one in use, forgets it (the subscriptions
/// move with it).
async fn watch_the_sentinels(primary: Weak<Primary>) {
    let mut conns = Vec::new();
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(primary) = primary.upgrade() else {
            return;
        };
        let Some((generation, addr)) = primary
            .current
            .read()
            .unwrap()
            .as_ref()
            .map(|c| (c.generation, c.addr.clone()))
        else {
            continue;
        };
        if let Ok(Some(named)) = primary.known_through(&mut conns).await
            && named != addr
        {
            tracing::info!(
                master = primary.master,
                "the sentinels name another primary; following it"
            );
            primary.forget(generation);
        }
    }
}
