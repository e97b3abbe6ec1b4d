//! Scenario 11's tools: a user on a server of its own that grows, its
//! timed bursts with the server's work per upload, and the single-request probes.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use bytes::Bytes;
use filedock::testing::{Server, free_port};

use super::{BURST, Figure, IN_FLIGHT, LIST_BUDGET, Step};
use crate::support::*;

/// One user of a server of its own, and how many files it holds.
pub(super) struct Held<'a> {
    client: &'a Client,
    server: Server,
    data: Option<PathBuf>,
    key: String,
    pub(super) held: usize,
    body: Bytes,
}

impl<'a> Held<'a> {
    /// A user of a new server: on the embedded defaults, or on the real stack.
    pub(super) async fn start(client: &'a Client, embedded: bool) -> Self {
        let (server, data) = match embedded {
            true => {
                let (server, data) = start_embedded().await;
                (server, Some(data))
            }
            // Why a request failed (503s are logged at warn) goes to stderr.
            false => {
                let log = [("RUST_LOG", "error,filedock::http::error=warn")];
                (<Server as BenchServer>::start(&log).await, None)
            }
        };
        let key = client.user(&server, "held").await;
        // Open the connections a burst uses, so the first step does not pay for them.
        drive(IN_FLIGHT * 4, IN_FLIGHT, |_| {
            client.timed_get(&server, &key, "/v1/me")
        })
        .await;
        let body = Bytes::from(vec![4u8; 4096]);
        Self {
            client,
            server,
            data,
            key,
            held: 0,
            body,
        }
    }

    /// `n` uploads, 32 in flight.
    pub(super) async fn burst(&mut self, n: usize) -> Burst {
        let before = usage(&self.server);
        let (client, server, key, body) = (self.client, &self.server, &self.key, &self.body);
        let batch = drive(n, IN_FLIGHT, |_| {
            client.upload(server, key, reqwest::Body::from(body.clone()))
        })
        .await;
        self.held += batch.ok;
        let after = usage(&self.server);
        let per = |i: usize, unit: f64| (after[i] - before[i]) / unit / batch.total.max(1) as f64;
        Burst {
            batch,
            cpu_ms: per(0, 1.0),
            written_kib: per(1, 1024.0),
        }
    }

    /// Untimed uploads up to `target - BURST`, then the timed burst to
    /// `target`: the uploads that failed, and the burst.
    pub(super) async fn grow_to(&mut self, target: usize) -> (usize, Burst) {
        let fill = self
            .burst(target.saturating_sub(BURST).saturating_sub(self.held))
            .await;
        let burst = self.burst(target.saturating_sub(self.held)).await;
        let failed = fill.batch.total - fill.batch.ok + burst.batch.total - burst.batch.ok;
        (failed, burst)
    }

    /// Stops the server and removes its files (100k of them on the embedded store).
    pub(super) fn finish(self) {
        drop(self.server);
        if let Some(data) = self.data {
            let _ = std::fs::remove_dir_all(data);
        }
    }
}

/// Single-request samples at one step: (succeeded, latency).
#[derive(Default)]
pub(super) struct Probes {
    upload: Vec<(bool, Duration)>,
    me: Vec<(bool, Duration)>,
    list: Vec<(bool, Duration)>,
    listing: Duration,
}

impl Probes {
    /// One upload, one `/v1/me` and (within the budget) one first page;
    /// a failure is counted, not timed (SecantusDB answers a 100k-file first
    /// page so slowly that filedock's own checks of it time out: 503).
    pub(super) async fn round(&mut self, h: &mut Held<'_>, i: usize) {
        let (client, server, key) = (h.client, &h.server, &h.key);
        let (ok, t) = client
            .upload(server, key, reqwest::Body::from(h.body.clone()))
            .await;
        h.held += ok as usize;
        self.upload.push((ok, t));
        self.me.push(client.timed_get(server, key, "/v1/me").await);
        if i < 3 || self.listing < LIST_BUDGET {
            let (ok, t) = client.timed_get(server, key, "/v1/files?limit=100").await;
            self.listing += t;
            self.list.push((ok, t));
        }
    }

    pub(super) fn step(self, held: usize, burst: Burst, failed: usize) -> Step {
        Step {
            held,
            rate: burst.batch.rate(),
            cpu_ms: burst.cpu_ms,
            written_kib: burst.written_kib,
            failed,
            upload: Figure::of(&self.upload),
            me: Figure::of(&self.me),
            list: Figure::of(&self.list),
        }
    }
}

/// A timed burst, and what the server spent per upload of it.
#[derive(Clone, Copy)]
pub(super) struct Burst {
    pub(super) batch: Batch,
    cpu_ms: f64,
    written_kib: f64,
}

/// The server process's CPU time so far (ms, user + system) and the bytes
/// it has had written to storage, from `/proc`: work, not time, so that
/// the machine's load does not blur it.
fn usage(server: &Server) -> [f64; 2] {
    let pid = server.child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit(')').next().unwrap_or_default();
    // utime and stime, the 14th and 15th fields, in ticks of 10 ms (USER_HZ).
    let fields = after_comm.split_whitespace().skip(11).take(2);
    let ticks: f64 = fields.filter_map(|t| t.parse::<f64>().ok()).sum();
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let written = io.lines().find_map(|l| l.strip_prefix("write_bytes: "));
    [
        ticks * 10.0,
        written.and_then(|w| w.parse().ok()).unwrap_or(0.0),
    ]
}

/// A filedock server on the embedded defaults: no MongoDB, Redis or S3
/// settings, only a data directory and the admin key.
async fn start_embedded() -> (Server, PathBuf) {
    let port = free_port();
    let data = std::env::temp_dir().join(format!("filedock-bench-{}", run_id()));
    let child = Command::new(env("FILEDOCK_BIN"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .env("FILEDOCK_DATA_DIR", &data)
        .env("FILEDOCK_ADMIN_KEY", ADMIN)
        .env("FILEDOCK_SWEEP_INTERVAL_SECS", "0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("FILEDOCK_BIN runs");
    let server = Server::wait_until_up(child, port, 400, Duration::from_millis(25)).await;
    (server, data)
}
