//! The test Redis Cluster (scripts/stack.sh `stack_cluster_start`: three
//! masters with a replica each): its nodes, who owns a key's slot, and a
//! manual failover of that slot's master.

use std::time::{Duration, Instant};

use filedock::redis_link::slot_of;
use redis::aio::MultiplexedConnection;

/// The cluster's nodes, comma-separated, if the test script started one
/// (with the real stack).
pub fn cluster_seeds() -> Option<String> {
    let urls = std::env::var("FILEDOCK_TEST_REDIS_CLUSTER_URL").ok()?;
    crate::helpers::real_backends().then_some(urls)
}

/// One node of the cluster, as `CLUSTER NODES` lists it.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: String,
    /// `127.0.0.1:port`
    pub addr: String,
    pub master: bool,
    /// A replica's master's id.
    pub master_id: Option<String>,
    pub slots: Vec<(u16, u16)>,
}

pub async fn connect(addr: &str) -> MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The cluster's nodes, failing ones left out, as the first seed that
/// answers sees them.
pub async fn nodes(seeds: &str) -> Vec<Node> {
    cluster_nodes(seeds)
        .await
        .lines()
        .filter_map(parse_node)
        .collect()
}

/// `CLUSTER NODES` from the first seed that answers.
pub async fn cluster_nodes(seeds: &str) -> String {
    for seed in seeds.split(',') {
        let Ok(client) = redis::Client::open(seed.trim()) else {
            continue;
        };
        let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await
        else {
            continue;
        };
        let nodes: redis::RedisResult<String> = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await;
        if let Ok(text) = nodes {
            return text;
        }
    }
    panic!("no node of {seeds} answers");
}

fn parse_node(line: &str) -> Option<Node> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 || f[2].contains("fail") || f[7] != "connected" {
        return None;
    }
    let slots = f[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .map(|s| match s.split_once('-') {
            Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
            None => (s.parse().unwrap(), s.parse().unwrap()),
        })
        .collect();
    Some(Node {
        id: f[0].to_owned(),
        addr: f[1].split('@').next()?.to_owned(),
        master: f[2].contains("master"),
        master_id: (f[3] != "-").then(|| f[3].to_owned()),
        slots,
    })
}

/// The master that owns `key`'s slot now.
pub async fn master_of(seeds: &str, key: &str) -> Node {
    let slot = slot_of(key);
    nodes(seeds)
        .await
        .into_iter()
        .find(|n| n.master && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
        .unwrap_or_else(|| panic!("no master owns slot {slot}"))
}

/// A manual failover (`CLUSTER FAILOVER` on a replica) of the master that
/// owns `key`'s slot: no write is lost. Returns the new master's address
/// once the replica reports itself master and the old one a replica.
pub async fn fail_over(seeds: &str, key: &str) -> String {
    // After an earlier failover, its demoted master may still be catching up.
    until_whole(seeds).await;
    let old = master_of(seeds, key).await;
    let replica = nodes(seeds)
        .await
        .into_iter()
        .find(|n| n.master_id.as_deref() == Some(old.id.as_str()))
        .expect("the master has a replica");
    let mut conn = connect(&replica.addr).await;
    assert!(
        ask_failover(&mut conn, || async {
            master_of(seeds, key).await.id == replica.id
        })
        .await,
        "the failover did not complete"
    );
    until_whole(seeds).await;
    replica.addr
}

/// `CLUSTER FAILOVER` on `replica` until `done` (a manual failover that
/// times out, its replica not caught up with the master, is given up by
/// the node: it is asked again, after 15 s with `FORCE`, which does not
/// wait for the master); whether it was done within 30 s.
pub async fn ask_failover<F, Fut>(replica: &mut MultiplexedConnection, done: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while Instant::now() < deadline {
        let mut ask = redis::cmd("CLUSTER");
        ask.arg("FAILOVER");
        if started.elapsed() > Duration::from_secs(15) {
            ask.arg("FORCE");
        }
        let asked: redis::RedisResult<String> = ask.query_async(replica).await;
        if asked.is_ok() {
            let ask_again = Instant::now() + Duration::from_secs(5);
            while Instant::now() < ask_again {
                if done().await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    false
}

/// Whether the cluster is whole: six nodes, none failing or disconnected,
/// three masters with slots and three replicas, and every node says ok.
pub async fn whole(seeds: &str) -> bool {
    let listed = cluster_nodes(seeds).await;
    let nodes = nodes(seeds).await;
    let masters = nodes
        .iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .count();
    let replicas = nodes.iter().filter(|n| n.master_id.is_some()).count();
    if listed.lines().count() != 6 || nodes.len() != 6 || masters != 3 || replicas != 3 {
        return false;
    }
    for node in &nodes {
        let Ok(client) = redis::Client::open(format!("redis://{}/", node.addr)) else {
            return false;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
            return false;
        }
        // A replica that has not finished syncing cannot take over.
        let replication: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        let synced = replication
            .lines()
            .any(|l| l.trim() == "master_link_status:up");
        if node.master_id.is_some() && !synced {
            return false;
        }
    }
    true
}

/// Waits until the cluster is [`whole`] (at most 60 s).
pub async fn until_whole(seeds: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !whole(seeds).await {
        assert!(
            Instant::now() < deadline,
            "the Redis Cluster did not become whole: {}",
            cluster_nodes(seeds).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sharded channels matching `pattern` subscribed on any master.
pub async fn shard_channels(seeds: &str, pattern: &str) -> usize {
    let mut total = 0;
    for node in nodes(seeds).await.into_iter().filter(|n| n.master) {
        let mut conn = connect(&node.addr).await;
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        total += channels.len();
    }
    total
}

/// Waits (at most 10 s) until no master holds a sharded channel matching
/// `pattern`; how many are left.
pub async fn until_no_shard_channels(seeds: &str, pattern: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = shard_channels(seeds, pattern).await;
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `SPUBLISH`es `payload` on `channel` at the master that owns it; how many
/// subscribers it reached.
pub async fn spublish(seeds: &str, channel: &str, payload: &str) -> i64 {
    let mut conn = connect(&master_of(seeds, channel).await.addr).await;
    redis::cmd("SPUBLISH")
        .arg(channel)
        .arg(payload)
        .query_async(&mut conn)
        .await
        .unwrap_or(0)
}
