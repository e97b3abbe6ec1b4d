//! The start-up check that the Redis named is the kind the mode says: a
//! single-mode filedock on a cluster node would get MOVED for about two keys
//! in three (every such request answering 503), and a cluster-mode filedock
//! on a standalone Redis could not learn any slot. An unreachable Redis
//! passes (connections stay lazy: development starts with Redis down).

use std::time::Duration;

use redis::{Client, ConnectionInfo};

use crate::config::RedisMode;

/// How long the start-up probe waits for Redis: a Redis that does not answer
/// is not refused, only a wrong one is.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Refuses a Redis at `node` whose kind is not `mode`'s (see the module).
pub async fn refuse_wrong_kind(node: ConnectionInfo, mode: RedisMode) -> anyhow::Result<()> {
    let client = Client::open(node)?;
    let info = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut conn)
            .await
    })
    .await;
    let info = match info {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "Redis start-up probe failed; its kind is not checked");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!("Redis start-up probe timed out; its kind is not checked");
            return Ok(());
        }
    };
    match (mode, is_cluster_node(&info)) {
        (RedisMode::Single, true) => anyhow::bail!(
            "FILEDOCK_REDIS_URL is a Redis Cluster node (INFO cluster: cluster_enabled:1), \
             but FILEDOCK_REDIS_MODE is single: keys on the other nodes would answer MOVED. \
             Set FILEDOCK_REDIS_MODE=cluster and list the cluster's seed nodes in \
             FILEDOCK_REDIS_URL, comma-separated"
        ),
        (RedisMode::Cluster, false) => anyhow::bail!(
            "FILEDOCK_REDIS_MODE is cluster, but {} is a standalone Redis (INFO cluster: \
             cluster_enabled:0). Set FILEDOCK_REDIS_MODE=single, or point FILEDOCK_REDIS_URL \
             at a cluster's nodes",
            client.get_connection_info().addr()
        ),
        _ => Ok(()),
    }
}

/// Refuses a master name no sentinel knows (a typo would otherwise leave
/// every lock call failing). Sentinels that do not answer pass.
pub async fn refuse_unknown_master(primary: &super::sentinel::Primary) -> anyhow::Result<()> {
    match tokio::time::timeout(PROBE_TIMEOUT, primary.known()).await {
        Ok(Ok(Some(_))) => Ok(()),
        Ok(Ok(None)) => anyhow::bail!(
            "no sentinel at FILEDOCK_REDIS_URL knows a master named by \
             FILEDOCK_REDIS_SENTINEL_MASTER (SENTINEL GET-MASTER-ADDR-BY-NAME answered nil)"
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "Sentinel start-up probe failed; the master is not checked");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("Sentinel start-up probe timed out; the master is not checked");
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

    #[test]
    fn a_cluster_node_is_told_by_its_info() {
        assert!(is_cluster_node("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!is_cluster_node("# Cluster\r\ncluster_enabled:0\r\n"));
    }
}
