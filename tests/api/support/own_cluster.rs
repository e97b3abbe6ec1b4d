//! A private Redis Cluster (three masters with a replica each) whose nodes
//! the fault suite's nemesis may kill and start again: a killed master's
//! replica is promoted, and the killed node, started again on its port and
//! directory, rejoins as a replica; or a replica takes over by `CLUSTER
//! FAILOVER`. Each fault waits until the cluster is whole again (three
//! masters, three connected replicas, every node `cluster_state:ok`).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use rand::{Rng, rngs::StdRng};

use crate::{
    helpers::free_port,
    support::{redis_cluster as topology, servers::OwnServer},
};

/// How long a replica may take to take over.
const HEAL_WITHIN: Duration = Duration::from_secs(30);

pub struct OwnRedisCluster {
    nodes: Vec<OwnServer>,
    dir: std::path::PathBuf,
}

/// Whether `port` can be bound on loopback now (a node's cluster bus
/// listens on its port + 10000).
fn bindable(port: u32) -> bool {
    port < 65536 && std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok()
}

impl OwnRedisCluster {
    /// A node silent for 2 s is taken for failed (its replica promoted).
    pub async fn start() -> Self {
        Self::start_with(Duration::from_secs(2)).await
    }

    /// With that `cluster-node-timeout`.
    pub async fn start_with(node_timeout: Duration) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "filedock-own-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let mut ports: Vec<u16> = Vec::new();
        let mut nodes = Vec::new();
        while ports.len() < 6 {
            let port = free_port();
            if ports.contains(&port) || !bindable(port as u32 + 10000) {
                continue;
            }
            ports.push(port);
            let dir = dir.join(port.to_string());
            nodes.push(OwnServer::redis_cluster_node(&dir, port, node_timeout).await);
        }
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Self { nodes, dir };
        cluster.until_whole().await;
        cluster
    }

    /// Every node, comma-separated (`FILEDOCK_REDIS_URL` in cluster mode).
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn index_of(&self, addr: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| addr == format!("127.0.0.1:{}", n.port()))
            .unwrap_or_else(|| panic!("{addr} is not a node of this cluster"))
    }

    /// SIGSTOPs the master that owns `key`'s slot (its calls time out;
    /// its replica takes over after the node timeout); its PID, for SIGCONT.
    pub async fn pause_master_of(&mut self, key: &str) -> i32 {
        let victim = topology::master_of(&self.seeds(), key).await;
        let pid = self.nodes[self.index_of(&victim.addr)]
            .pid()
            .expect("running");
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        pid
    }

    async fn until_whole(&self) {
        topology::until_whole(&self.seeds()).await;
    }

    /// SIGKILLs a master at random (its last writes may be lost with it);
    /// once its replica is promoted, starts it again (it rejoins as a
    /// replica) and waits until the cluster is whole.
    pub async fn kill_master(&mut self, rng: &mut StdRng) -> bool {
        let masters: Vec<_> = topology::nodes(&self.seeds())
            .await
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .collect();
        let victim = &masters[rng.random_range(0..masters.len())];
        let slot = victim.slots[0].0;
        let i = self.index_of(&victim.addr);
        self.nodes[i].stop();
        let deadline = Instant::now() + HEAL_WITHIN;
        loop {
            let promoted = topology::nodes(&self.seeds()).await.into_iter().any(|n| {
                n.master
                    && n.id != victim.id
                    && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            });
            if promoted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over from {}",
                victim.addr
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.nodes[i].restart().await;
        self.until_whole().await;
        true
    }

    /// `CLUSTER FAILOVER` on a replica at random (no write lost); waits
    /// until it is a master and the cluster is whole.
    pub async fn fail_over(&mut self, rng: &mut StdRng) -> bool {
        let replicas: Vec<_> = topology::nodes(&self.seeds())
            .await
            .into_iter()
            .filter(|n| n.master_id.is_some())
            .collect();
        let chosen = &replicas[rng.random_range(0..replicas.len())];
        let mut conn = topology::connect(&chosen.addr).await;
        let seeds = self.seeds();
        let took_over = topology::ask_failover(&mut conn, || async {
            let nodes = topology::nodes(&seeds).await;
            nodes.iter().any(|n| n.id == chosen.id && n.master)
        })
        .await;
        assert!(took_over, "{} never took over", chosen.addr);
        self.until_whole().await;
        true
    }
}

impl Drop for OwnRedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
