//! Private server processes a test may stop and start again: its own
//! redis-server, SecantusDB or s3s-fs, on a free port (and RabbitMQ, in
//! `own_rabbit.rs`).

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::helpers::free_port;

/// A private redis-server a test may stop and start.
pub struct OwnRedis {
    child: Option<Child>,
}

impl OwnRedis {
    pub async fn start(port: u16) -> Self {
        let bin =
            std::env::var("FILEDOCK_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child: Some(child) }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private server process that a test may stop and start again on the same
/// port and data directory (SecantusDB or s3s-fs).
pub struct OwnServer {
    program: String,
    args: Vec<String>,
    port: u16,
    child: Option<Child>,
}

impl OwnServer {
    pub async fn mongo(dir: &std::path::Path) -> Self {
        Self::mongo_with(dir, &[]).await
    }

    /// [`Self::mongo`] with `extra` arguments (`--enable-test-commands`:
    /// `configureFailPoint`).
    pub async fn mongo_with(dir: &std::path::Path, extra: &[&str]) -> Self {
        let port = free_port();
        // Synced on commit, so that what committed survives the kill, as with mongod's journal.
        let mut args = [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--storage-path",
            &dir.display().to_string(),
            "--sync-on-commit",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::start(
            std::env::var("FILEDOCK_TEST_SECANTUSD").unwrap(),
            args,
            port,
        )
        .await
    }

    pub async fn s3(dir: &std::path::Path) -> Self {
        let port = free_port();
        std::fs::create_dir_all(dir).unwrap();
        let args = [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--access-key",
            &std::env::var("FILEDOCK_TEST_S3_ACCESS_KEY").unwrap(),
            "--secret-key",
            &std::env::var("FILEDOCK_TEST_S3_SECRET_KEY").unwrap(),
            &dir.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Self::start(std::env::var("FILEDOCK_TEST_S3S_FS").unwrap(), args, port).await
    }

    /// A redis-server of a Sentinel topology: the primary, or (with
    /// `primary`) its replica; `dir` takes what a full sync writes.
    pub async fn redis_replicated(dir: &std::path::Path, port: u16, primary: Option<u16>) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut args = ["--bind", "127.0.0.1", "--port", &port.to_string()]
            .map(str::to_owned)
            .to_vec();
        args.extend(["--dir".into(), dir.display().to_string()]);
        args.extend(["--save", "", "--appendonly", "no"].map(str::to_owned));
        if let Some(primary) = primary {
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.to_string(),
            ]);
        }
        Self::start(redis_server(), args, port).await
    }

    /// A sentinel on `port` watching the primary on `primary` as `master`
    /// (quorum 2, down after 1 s), its configuration (which it rewrites) in `dir`.
    pub async fn sentinel(dir: &std::path::Path, port: u16, master: &str, primary: u16) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {master} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 5000\n\
                 sentinel parallel-syncs {master} 1\n",
                dir.display()
            ),
        )
        .unwrap();
        let args = vec![conf.display().to_string(), "--sentinel".into()];
        Self::start(redis_server(), args, port).await
    }

    /// A redis-server that is a node of a Redis Cluster, its state (its
    /// `nodes.conf`) in `dir`, so that it rejoins when started again.
    /// `node_timeout`: how long before the cluster takes a silent node for
    /// failed (`cluster-node-timeout`).
    pub async fn redis_cluster_node(
        dir: &std::path::Path,
        port: u16,
        node_timeout: Duration,
    ) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let args = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout.as_millis().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Self::start(redis_server(), args, port).await
    }

    async fn start(program: String, args: Vec<String>, port: u16) -> Self {
        let mut server = Self {
            program,
            args,
            port,
            child: None,
        };
        server.restart().await;
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running process's PID.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub async fn restart(&mut self) {
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "{} did not start", self.program);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The redis-server binary (`FILEDOCK_TEST_REDIS_SERVER`, else on the PATH).
fn redis_server() -> String {
    std::env::var("FILEDOCK_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}
