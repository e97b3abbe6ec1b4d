//! The test Redis Cluster (scripts/stack.sh `stack_cluster_start`: three
//! masters with a replica each): its nodes, who owns a key's slot, and a
//! manual failover of that slot's master.

use std::time::{Duration, Instant};

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

/// The cluster's nodes as the first seed sees them.
pub async fn nodes(seeds: &str) -> Vec<Node> {
    let first = seeds.split(',').next().unwrap();
    let mut conn = redis::Client::open(first)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    text.lines().filter_map(parse_node).collect()
}

fn parse_node(line: &str) -> Option<Node> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 || f[2].contains("fail") {
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

/// The slot of `key` (its hash tag's).
pub fn slot_of(key: &str) -> u16 {
    let tagged = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(tagged.as_bytes()) % 16384
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
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
    let old = master_of(seeds, key).await;
    let replica = nodes(seeds)
        .await
        .into_iter()
        .find(|n| n.master_id.as_deref() == Some(old.id.as_str()))
        .expect("the master has a replica");
    let mut conn = connect(&replica.addr).await;
    let _: String = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query_async(&mut conn)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = master_of(seeds, key).await;
        if now.id == replica.id {
            return replica.addr;
        }
        assert!(Instant::now() < deadline, "the failover did not complete");
        tokio::time::sleep(Duration::from_millis(100)).await;
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

#[test]
fn slots_are_redis_cluster_slots() {
    // CLUSTER KEYSLOT answers, from the Redis Cluster specification's examples.
    assert_eq!(slot_of("123456789"), 12739);
    assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
    // An empty tag is no tag: the whole key is hashed.
    assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
}
