//! A private Sentinel topology (a primary, its replica, three sentinels)
//! that the fault suite's nemesis fails over (`SENTINEL FAILOVER`: the
//! replica promoted, the old primary made its replica), waiting each time
//! until the sentinels agree and the new replica's link is up.

use std::time::Duration;

use crate::{
    helpers::free_port,
    support::{sentinel, servers::OwnServer},
};

pub const MASTER: &str = "faultsuite";

pub struct OwnSentinel {
    /// The two data nodes, then the three sentinels.
    servers: Vec<OwnServer>,
    urls: String,
    dir: std::path::PathBuf,
}

impl OwnSentinel {
    pub async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "filedock-own-sentinel-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let (primary, replica) = (free_port(), free_port());
        let mut servers = vec![
            OwnServer::redis_replicated(&dir.join("primary"), primary, None).await,
            OwnServer::redis_replicated(&dir.join("replica"), replica, Some(primary)).await,
        ];
        let mut urls = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let node = dir.join(format!("sentinel{i}"));
            servers.push(OwnServer::sentinel(&node, port, MASTER, primary).await);
            urls.push(format!("redis://127.0.0.1:{port}/"));
        }
        let own = Self {
            servers,
            urls: urls.join(","),
            dir,
        };
        // The sentinels agree on the primary and know its replica.
        sentinel::primary(&own.urls, MASTER).await;
        sentinel::until_replica_known(&own.urls, MASTER, Duration::from_secs(30)).await;
        own
    }

    /// The sentinels, comma-separated (`FILEDOCK_REDIS_URL` with Sentinel).
    pub fn urls(&self) -> &str {
        &self.urls
    }

    /// `SENTINEL FAILOVER`, waited out.
    pub async fn fail_over(&mut self) -> bool {
        sentinel::fail_over(&self.urls, MASTER).await;
        true
    }

    /// SIGKILLs the primary; once the sentinels promote its replica, starts
    /// it again as it was started, a primary (empty: nothing persisted)
    /// until the sentinels make it the new primary's replica, which is
    /// waited out. Instances still on it meanwhile may take locks there.
    pub async fn kill_primary(&mut self) -> bool {
        let old = sentinel::primary(&self.urls, MASTER).await;
        let Some(i) = self.servers[..2]
            .iter()
            .position(|s| old == format!("127.0.0.1:{}", s.port()))
        else {
            return false;
        };
        self.servers[i].stop();
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        while sentinel::primary(&self.urls, MASTER).await == old {
            assert!(
                std::time::Instant::now() < deadline,
                "no replica took over from {old}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.servers[i].restart().await;
        sentinel::until_replica_known(&self.urls, MASTER, Duration::from_secs(60)).await;
        true
    }
}

impl Drop for OwnSentinel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
