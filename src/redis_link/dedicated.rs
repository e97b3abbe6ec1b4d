//! A connection of one caller's own, for a command that blocks it
//! (`XREADGROUP … BLOCK`): on the shared one it would stall every caller
//! whose commands go to the same node.

use std::sync::Arc;

use redis::{
    Cmd, Pipeline, RedisError, RedisFuture, Value,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster_async::ClusterConnection,
};

use super::{
    sentinel::Primary,
    timeouts::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT},
};

/// See the module. On a cluster, a cluster connection of its own (routed
/// by key, following moved slots and failed-over masters); with Sentinel,
/// a connection to the primary of one generation, which fails every call
/// once that primary is forgotten (the caller stops and starts again on
/// the new one: a demoted primary may still answer for seconds).
pub enum Dedicated {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
    Sentinel {
        conn: MultiplexedConnection,
        primary: Arc<Primary>,
        generation: u64,
    },
}

impl Dedicated {
    /// A new connection to the primary the sentinels name now.
    pub(super) async fn on_primary(primary: Arc<Primary>) -> redis::RedisResult<Self> {
        let (generation, client) = primary.client().await?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Self::Sentinel {
            conn,
            primary,
            generation,
        })
    }
}

/// Fails once the primary of `generation` is forgotten.
fn still_current(primary: &Primary, generation: u64) -> redis::RedisResult<()> {
    match primary.is_current(generation) {
        true => Ok(()),
        false => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "the primary this connection was made to is no longer the sentinels' choice",
        ))),
    }
}

impl ConnectionLike for Dedicated {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel {
                conn,
                primary,
                generation,
            } => Box::pin(async move {
                still_current(primary, *generation)?;
                primary
                    .watched(*generation, conn.req_packed_command(cmd))
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
            Self::Sentinel {
                conn,
                primary,
                generation,
            } => Box::pin(async move {
                still_current(primary, *generation)?;
                let answer = conn.req_packed_commands(cmd, offset, count);
                primary.watched(*generation, answer).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel { conn, .. } => conn.get_db(),
        }
    }
}
