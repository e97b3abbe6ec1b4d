//! How the Redis adapters (locks, the queue, release requests) reach Redis:
//! [`RedisLink`] hands out their connections and notices, so the topology
//! (one node, or a Redis Cluster: `FILEDOCK_REDIS_MODE`) is known here
//! only; and what a Redis error means for them ([`fault`]).

mod counted;
mod dedicated;
mod fault;
mod notices;
mod probe;
mod sentinel;
mod timeouts;

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use redis::{
    AsyncConnectionConfig, Client, Cmd, Pipeline, ProtocolVersion, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager},
    cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig},
    cluster_async::ClusterConnection,
};

pub use counted::Counted;
pub use dedicated::Dedicated;
pub use fault::{Fault, fault_of};
pub use notices::{NoticeHandler, Notices, Watch};
pub use timeouts::connection_config;

use crate::config::{RedisMode, Settings};
use notices::Shards;
use sentinel::Primary;
use timeouts::{CONNECT_TIMEOUT, OVERALL_TIMEOUT, RESPONSE_TIMEOUT};

/// The connection every caller shares, its commands counted.
pub type RedisConn = Counted<Shared>;
/// A connection of one caller's own, its commands counted.
pub type DedicatedConn = Counted<Dedicated>;

/// The connection every caller shares: multiplexed, reconnecting, lazy; on
/// a cluster, routed by key to the node that owns its slot (following MOVED
/// and ASK, and a failed-over master, by itself).
#[derive(Clone)]
pub enum Shared {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
    /// The primary the sentinels name, followed across failovers.
    Sentinel(Arc<Primary>),
}

impl ConnectionLike for Shared {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(primary) => Box::pin(async move {
                let (generation, mut conn) = primary.conn().await?;
                primary
                    .watched(generation, conn.req_packed_command(cmd))
                    .await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Self::Sentinel(primary) => Box::pin(async move {
                let (generation, mut conn) = primary.conn().await?;
                let answer = conn.req_packed_commands(cmd, offset, count);
                primary.watched(generation, answer).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel(_) => 0,
        }
    }
}

/// One Redis deployment, as the adapters see it. Cheap to clone; each clone
/// shares the connection.
#[derive(Clone)]
pub struct RedisLink {
    conn: Shared,
    topology: Topology,
    /// Every command sent on the link's connections.
    commands: Counter,
}

#[derive(Clone)]
enum Topology {
    Node(Client),
    Cluster {
        /// For connections of a caller's own.
        client: Box<ClusterClient>,
        shards: Arc<Shards>,
        /// The first seed node (the start-up probe's).
        seed: String,
    },
    Sentinel(Arc<Primary>),
}

impl RedisLink {
    /// The Redis the settings name (`FILEDOCK_REDIS_URL`, `_MODE`,
    /// `_SENTINEL_MASTER`), if any.
    pub fn from_settings(settings: &Settings) -> anyhow::Result<Option<Self>> {
        use secrecy::ExposeSecret;
        let Some(url) = &settings.redis_url else {
            return Ok(None);
        };
        let url = url.expose_secret();
        Ok(Some(
            match (settings.redis_mode, &settings.redis_sentinel_master) {
                (RedisMode::Sentinel, Some(master)) => Self::connect_sentinel(url, master)?,
                (RedisMode::Sentinel, None) => anyhow::bail!(
                    "FILEDOCK_REDIS_MODE=sentinel needs FILEDOCK_REDIS_SENTINEL_MASTER (the master's name)"
                ),
                (mode, _) => Self::connect(url, mode)?,
            },
        ))
    }

    /// The primary that the sentinels at `urls` (comma-separated) name for
    /// the master called `master`, followed across failovers. Lazy.
    pub fn connect_sentinel(urls: &str, master: &str) -> anyhow::Result<Self> {
        let primary = Primary::new(urls, master)?;
        Ok(Self {
            conn: Shared::Sentinel(primary.clone()),
            topology: Topology::Sentinel(primary),
            commands: Counter::default(),
        })
    }

    /// Connects lazily, so a development server starts with Redis down.
    /// `url` is one node's, or in cluster mode seed nodes' (comma-separated);
    /// Sentinel: [`Self::connect_sentinel`].
    pub fn connect(url: &str, mode: RedisMode) -> anyhow::Result<Self> {
        match mode {
            RedisMode::Sentinel => {
                anyhow::bail!("a Sentinel link needs the master's name (connect_sentinel)")
            }
            RedisMode::Single => {
                let client = Client::open(url)?;
                let conn =
                    ConnectionManager::new_lazy_with_config(client.clone(), connection_config())?;
                Ok(Self {
                    conn: Shared::Node(conn),
                    topology: Topology::Node(client),
                    commands: Counter::default(),
                })
            }
            RedisMode::Cluster => {
                let seeds: Vec<&str> = url.split(',').map(str::trim).collect();
                let client = ClusterClientBuilder::new(seeds.clone())
                    .use_protocol(ProtocolVersion::RESP3)
                    .retries(3)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    // A call with its retries, redirections and reconnections.
                    .overall_response_timeout(Some(OVERALL_TIMEOUT))
                    .build()?;
                // The per-attempt timeouts go in a config (which replaces
                // the builder's: unset there would be none).
                let conn = client.get_pending_async_connection_with_config(cluster_config());
                // The subscriptions on a connection of their own (see Shards).
                let shards = Arc::new(Shards::default());
                let sender = notices::push_sender(Arc::downgrade(&shards));
                shards.attach(client.get_pending_async_connection_with_config(
                    cluster_config().set_push_sender(sender),
                ));
                Ok(Self {
                    conn: Shared::Cluster(conn),
                    topology: Topology::Cluster {
                        client: Box::new(client),
                        shards,
                        seed: seeds[0].to_owned(),
                    },
                    commands: Counter::default(),
                })
            }
        }
    }

    /// Counts the commands sent on this link's connections into `commands`
    /// (`filedock_redis_commands_total`).
    pub fn counted(mut self, commands: Counter) -> Self {
        self.commands = commands;
        self
    }

    /// The shared connection.
    pub fn conn(&self) -> RedisConn {
        Counted {
            inner: self.conn.clone(),
            commands: self.commands.clone(),
        }
    }

    /// A new connection of the caller's own (see [`Dedicated`]).
    pub async fn dedicated(&self) -> RedisResult<DedicatedConn> {
        let inner = self.dedicated_route().await?;
        Ok(Counted {
            inner,
            commands: self.commands.clone(),
        })
    }

    async fn dedicated_route(&self) -> RedisResult<Dedicated> {
        match &self.topology {
            Topology::Node(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Dedicated::Node(conn))
            }
            Topology::Cluster { client, .. } => {
                let conn = client
                    .get_async_connection_with_config(cluster_config())
                    .await?;
                Ok(Dedicated::Cluster(conn))
            }
            Topology::Sentinel(primary) => Dedicated::on_primary(primary.clone()).await,
        }
    }

    /// Starts hearing notices for `handler`: on one node every channel
    /// matching `patterns`; on a cluster the channels watched
    /// ([`Notices::watch`]).
    pub fn notices(&self, patterns: Vec<String>, handler: Arc<dyn NoticeHandler>) -> Notices {
        match &self.topology {
            Topology::Node(client) => Notices::on_node(client.clone(), patterns, handler),
            Topology::Cluster { shards, .. } => Notices::on_cluster(shards.clone(), handler),
            Topology::Sentinel(primary) => Notices::on_primary(primary.clone(), patterns, handler),
        }
    }

    /// The command that publishes a notice, in scripts and outside them: on
    /// a cluster the sharded one, heard on the node of the channel's slot.
    pub fn publish_command(&self) -> &'static str {
        match self.topology {
            Topology::Node(_) | Topology::Sentinel(_) => "PUBLISH",
            Topology::Cluster { .. } => "SPUBLISH",
        }
    }

    /// Which part of Redis `key` lives on, for telling an outage of one part
    /// from the rest: on a cluster the key's slot (one master's outage
    /// does not stop the others' keys), on one node always the same.
    pub fn outage_scope(&self, key: &str) -> u16 {
        match self.topology {
            Topology::Node(_) | Topology::Sentinel(_) => 0,
            Topology::Cluster { .. } => slot_of(key),
        }
    }

    /// Refuses a Redis of another kind than the mode's (see [`probe`]).
    pub async fn probe(&self) -> anyhow::Result<()> {
        match &self.topology {
            Topology::Node(client) => {
                let info = client.get_connection_info().clone();
                probe::refuse_wrong_kind(info, RedisMode::Single).await
            }
            Topology::Cluster { seed, .. } => {
                let info = redis::IntoConnectionInfo::into_connection_info(seed.as_str())?;
                probe::refuse_wrong_kind(info, RedisMode::Cluster).await
            }
            Topology::Sentinel(primary) => probe::refuse_unknown_master(primary).await,
        }
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// part between the first `{` and the next `}`, if not empty) or of the
/// whole key, modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    let key = key.as_bytes();
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let len = key[open + 1..].iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &key[open + 1..open + 1 + len])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

/// The per-attempt timeouts of a cluster connection, in a config (which
/// replaces the builder's: unset there would be none).
fn cluster_config() -> ClusterConfig {
    ClusterConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(RESPONSE_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::slot_of;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // The Redis Cluster specification's CRC16 check value, and its tags.
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), 8363);
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    }
}
