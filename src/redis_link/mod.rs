//! How the Redis adapters (locks, the queue, release requests) reach Redis:
//! [`RedisLink`] hands out their connections and subscriptions, so the
//! topology (one node today; a cluster next, issue 43) is known here only;
//! and what a Redis error means for them: an outage to degrade around, or a
//! topology answer (MOVED, ASK…) that says the request went to the wrong
//! node and nothing ran.

use std::time::Duration;

use redis::{
    Client, ErrorKind, RedisError, RedisResult, ServerErrorKind,
    aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection, PubSub},
};

/// The connection every caller shares: multiplexed, reconnecting, lazy.
/// One node's today; a cluster's becomes another variant behind this name.
pub type RedisConn = ConnectionManager;

/// A connection of one caller's own, for a command that blocks it
/// (`XREADGROUP … BLOCK`): on the shared one it would stall everyone.
pub type DedicatedConn = MultiplexedConnection;

/// One Redis deployment, as the adapters see it. Cheap to clone; each clone
/// shares the connection.
#[derive(Clone)]
pub struct RedisLink {
    client: Client,
    conn: ConnectionManager,
}

impl RedisLink {
    /// Connects lazily, so a development server starts with Redis down.
    pub fn connect(url: &str) -> anyhow::Result<Self> {
        let client = Client::open(url)?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), connection_config())?;
        Ok(Self { client, conn })
    }

    /// The shared connection.
    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// A new connection of the caller's own (see [`DedicatedConn`]).
    pub async fn dedicated(&self) -> RedisResult<DedicatedConn> {
        self.client.get_multiplexed_async_connection().await
    }

    /// A new connection for (pattern) subscriptions.
    pub async fn pubsub(&self) -> RedisResult<PubSub> {
        self.client.get_async_pubsub().await
    }

    /// The command that publishes a notice, in scripts and outside them
    /// (a cluster's sharded pub/sub will answer `SPUBLISH`).
    pub fn publish_command(&self) -> &'static str {
        "PUBLISH"
    }

    /// Refuses a Redis this link cannot serve (see [`refuse_cluster_node`]).
    pub async fn probe(&self) -> anyhow::Result<()> {
        refuse_cluster_node(&self.client).await
    }
}

/// How filedock talks to Redis: fail fast (an unreachable Redis is an
/// outage to degrade around, not something to wait for).
pub fn connection_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
}

/// What a failed Redis call says about Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Redis is unreachable, slow or failing: the adapters degrade around it.
    Outage,
    /// Redis answered, but from a node that does not own the key (MOVED,
    /// ASK, READONLY), while a slot moves (TRYAGAIN), refused keys in
    /// several slots (CROSSSLOT), or from a node cut off from its cluster or
    /// its master (CLUSTERDOWN, MASTERDOWN) while the rest may still grant
    /// locks. The command did not run. Not an outage: a lock taken "without
    /// Redis" here would run beside a holder that the right node knows about
    /// (issue 43: 66 uploads ran unlocked this way).
    Topology,
}

/// Classifies `e`; only a server's topology answer is [`Fault::Topology`].
pub fn fault_of(e: &RedisError) -> Fault {
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown,
        ) => Fault::Topology,
        _ => Fault::Outage,
    }
}

/// How long the start-up probe waits for Redis: a Redis that does not answer
/// is not refused (development starts with Redis down), only a wrong one is.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Refuses to start on a Redis Cluster node with a single-node client: it
/// would get MOVED for about two keys in three, and every such request would
/// answer 503. An unreachable Redis passes (its connections stay lazy).
async fn refuse_cluster_node(client: &Client) -> anyhow::Result<()> {
    let info = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut conn)
            .await
    })
    .await;
    match info {
        Ok(Ok(info)) if is_cluster_node(&info) => anyhow::bail!(
            "FILEDOCK_REDIS_URL is a Redis Cluster node (INFO cluster: cluster_enabled:1), \
             but filedock talks to a single node: keys on the other nodes would answer \
             MOVED. Point FILEDOCK_REDIS_URL at a standalone Redis; a cluster \
             (FILEDOCK_REDIS_MODE=cluster, with the seed nodes listed) is not supported \
             yet (issue 43)"
        ),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "Redis start-up probe failed; not checked");
            Ok(())
        }
        Err(_) => {
            tracing::debug!("Redis start-up probe timed out; not checked");
            Ok(())
        }
    }
}

fn is_cluster_node(info: &str) -> bool {
    info.lines().any(|l| l.trim() == "cluster_enabled:1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(reply: &[u8]) -> RedisError {
        redis::parse_redis_value(reply)
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn topology_answers_are_not_outages() {
        for reply in [
            &b"-MOVED 5514 127.0.0.1:17002\r\n"[..],
            b"-ASK 5514 127.0.0.1:17002\r\n",
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
            b"-CLUSTERDOWN The cluster is down\r\n",
            b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
        ] {
            assert_eq!(fault_of(&error_of(reply)), Fault::Topology, "{reply:?}");
        }
        for reply in [
            &b"-ERR unknown command\r\n"[..],
            b"-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            assert_eq!(fault_of(&error_of(reply)), Fault::Outage, "{reply:?}");
        }
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(fault_of(&io), Fault::Outage);
    }

    #[test]
    fn a_cluster_node_is_told_by_its_info() {
        assert!(is_cluster_node("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!is_cluster_node("# Cluster\r\ncluster_enabled:0\r\n"));
    }
}
