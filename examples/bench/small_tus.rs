//! Scenario 13 (issue 44): small resumable uploads. 100 × 1 MiB over tus
//! (a `POST`, then the body in one `PATCH`, as tus-js-client sends it), 8
//! in flight, on filedock and on tus-node-server (`@tus/server` with
//! `@tus/s3-store`, on the same s3s-fs), and the same bytes as plain
//! uploads on filedock; alternating, three repetitions. For filedock, what
//! each upload cost, from its own metrics: MongoDB commands, Redis
//! commands, S3 requests (by operation) and its process's CPU time. With
//! `FILEDOCK_BENCH_BASE_BIN` (other builds of filedock, comma-separated, say
//! main before a change) those builds run the same loads in the same run: the A/B.
//! Then the CPU per 4 KiB plain upload, 32 users and one user's burst.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use filedock::testing::{Server, free_port};

use crate::{
    cost::{Cost, Runs, counters, per_upload, quiet},
    support::*,
};

const MIB: usize = 1 << 20;
const UPLOADS: usize = 100;
const IN_FLIGHT: usize = 8;

/// Where a tus server takes uploads, and how it is asked.
struct Tus<'a> {
    server: &'a Server,
    /// The creation URL's path.
    path: &'a str,
    /// filedock's API key; `None` for the peer (no auth).
    key: Option<&'a str>,
}

impl Tus<'_> {
    fn request(
        &self,
        http: &reqwest::Client,
        method: reqwest::Method,
        url: String,
    ) -> reqwest::RequestBuilder {
        let req = http.request(method, url).header("tus-resumable", "1.0.0");
        match self.key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    /// One upload of `len` bytes: `POST`, then one `PATCH` with all of it;
    /// `(committed, latency)`.
    async fn upload(&self, http: &reqwest::Client, len: usize) -> (bool, Duration) {
        let started = Instant::now();
        let base = &self.server.base;
        let created = self
            .request(http, reqwest::Method::POST, format!("{base}{}", self.path))
            .header("upload-length", len.to_string())
            // filename bench.bin, filetype application/octet-stream
            .header(
                "upload-metadata",
                "filename YmVuY2guYmlu,filetype YXBwbGljYXRpb24vb2N0ZXQtc3RyZWFt",
            )
            .send()
            .await;
        let Some(location) = created
            .ok()
            .filter(|r| r.status().as_u16() == 201)
            .and_then(|r| Some(r.headers().get("location")?.to_str().ok()?.to_owned()))
        else {
            return (false, started.elapsed());
        };
        let url = match location.starts_with("http") {
            true => location,
            false => format!("{base}{location}"),
        };
        let patched = self
            .request(http, reqwest::Method::PATCH, url)
            .header("upload-offset", "0")
            .header("content-type", "application/offset+octet-stream")
            .body(vec![0x5a; len])
            .timeout(Duration::from_secs(120))
            .send()
            .await;
        (
            patched.is_ok_and(|r| r.status().as_u16() == 204),
            started.elapsed(),
        )
    }
}

/// tus-node-server on the stack's S3, from the npm install that
/// `scripts/bench.sh` made (`$FILEDOCK_BENCH_TUS_NODE`).
async fn tus_node() -> Server {
    let port = free_port();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/bench/tus_node_peer.mjs"
    );
    let child = Command::new("node")
        .arg(script)
        .env("NODE_PATH", env("FILEDOCK_BENCH_TUS_NODE"))
        .env("PORT", port.to_string())
        .env("S3_ENDPOINT", env("FILEDOCK_TEST_S3_ENDPOINT"))
        .env("S3_ACCESS_KEY", env("FILEDOCK_TEST_S3_ACCESS_KEY"))
        .env("S3_SECRET_KEY", env("FILEDOCK_TEST_S3_SECRET_KEY"))
        .env("S3_BUCKET", "tus-node-bench")
        .stdout(Stdio::null())
        .spawn()
        .expect("node runs");
    Server::wait_until_up(child, port, 400, Duration::from_millis(25)).await
}

fn mib_s(b: &Batch, size: usize) -> f64 {
    (b.ok * size) as f64 / MIB as f64 / b.wall.as_secs_f64()
}

pub(crate) async fn small_tus(client: &Client, r: &mut Report) {
    r.section(
        "13. Small resumable uploads: 100 × 1 MiB, 8 in flight (issue 44)",
        "| build | path | succeeded | MiB/s | p50 | p99 | MongoDB cmds / upload | Redis cmds / upload | S3 requests / upload | CPU ms / upload: server | SecantusDB | s3s-fs | Redis | load generator |",

    );
    let http = reqwest::Client::new();
    let builds = start_builds().await;
    let peer = tus_node().await;
    let keys: Vec<String> = {
        let mut keys = Vec::new();
        for (name, server) in &builds {
            keys.push(client.user(server, &format!("tus-{name}")).await);
        }
        keys
    };
    // Rows: (build index or None for the peer, tus or plain).
    let mut rows: Vec<(Option<usize>, bool)> = vec![(None, true)];
    for b in 0..builds.len() {
        rows.push((Some(b), true));
        rows.push((Some(b), false));
    }
    let mut runs: Vec<Runs> = rows.iter().map(|_| Runs::default()).collect();
    // Warm-up: one small load on each, so that no row pays for connections first.
    for &(b, tus) in &rows {
        one_load(client, &http, &builds, &keys, &peer, b, tus, 8).await;
    }
    for rep in 0..REPS {
        for i in 0..rows.len() {
            let which = (i + rep) % rows.len();
            let (b, tus) = rows[which];
            let server = b.map_or(&peer, |b| &builds[b].1);
            quiet().await;
            let before = counters(server, b.is_some()).await;
            let batch = one_load(client, &http, &builds, &keys, &peer, b, tus, UPLOADS).await;
            let after = counters(server, b.is_some()).await;
            runs[which].costs.push(per_upload(&before, &after, UPLOADS));
            runs[which].batches.push(batch);
        }
    }
    let mut rate = BTreeMap::new();
    let mut s3_ops = Vec::new();
    for (which, &(b, tus)) in rows.iter().enumerate() {
        let (batch, cost) = runs[which].median();
        let build = b.map_or("tus-node-server 2.4.5", |b| builds[b].0.as_str());
        let path = if tus { "tus" } else { "plain" };
        let mibs = mib_s(&batch, MIB);
        rate.insert((b, tus), mibs);
        let c = cost.unwrap_or_default();
        let counted = match b {
            Some(_) => format!("{:.1} | {:.1} | {:.1}", c.mongo, c.redis, c.s3_total()),
            None => " | | ".to_owned(),
        };
        let cost_cols = format!(
            "{counted} | {:.2} | {} | {} | {} | {}",
            c.cpu_ms,
            c.stack("mongo"),
            c.stack("s3"),
            c.stack("redis"),
            c.stack("load")
        );
        if b.is_some() {
            let ops: Vec<String> = c.s3.iter().map(|(op, n)| format!("{op} {n:.2}")).collect();
            s3_ops.push(format!("{build} {path}: {}", ops.join(", ")));
        }
        r.row(format!(
            "| {build} | {path} | {}/{} | {mibs:.1} | {} | {} | {cost_cols} |",
            batch.ok,
            batch.total,
            ms(batch.p50),
            ms(batch.p99),
        ));
    }
    let peer_rate = rate[&(None, true)];
    for (b, (name, _)) in builds.iter().enumerate() {
        let (tus, plain) = (rate[&(Some(b), true)], rate[&(Some(b), false)]);
        r.row(format!(
            "| {name} | tus ÷ tus-node-server | | {:.2}× | | | | | | | | | | |",
            tus / peer_rate
        ));
        r.row(format!(
            "| {name} | tus ÷ plain | | {:.2}× | | | | | | | | | | |",
            tus / plain
        ));
    }
    r.note(format!(
        "S3 requests per upload, by operation: {}.",
        s3_ops.join("; ")
    ));
    drop(peer);
    cpu_per_small_upload(client, &builds, r).await;
}

/// Scenario 13b alone (`scripts/bench.sh 13b`): filedock's CPU per 4 KiB
/// plain upload, for a profile of it without the rest of 13.
pub(crate) async fn cpu_only(client: &Client, r: &mut Report) {
    let builds = start_builds().await;
    cpu_per_small_upload(client, &builds, r).await;
}

/// One load of `n` uploads of 1 MiB, `IN_FLIGHT` at once: tus or plain,
/// on build `b` (`None`: the peer).
#[allow(clippy::too_many_arguments)]
async fn one_load(
    client: &Client,
    http: &reqwest::Client,
    builds: &[(String, Server)],
    keys: &[String],
    peer: &Server,
    b: Option<usize>,
    tus: bool,
    n: usize,
) -> Batch {
    let target = match b {
        Some(b) => Tus {
            server: &builds[b].1,
            path: "/v1/uploads",
            key: Some(&keys[b]),
        },
        None => Tus {
            server: peer,
            path: "/files",
            key: None,
        },
    };
    let target = &target;
    drive(n, IN_FLIGHT, move |_| async move {
        match (tus, target.key) {
            (true, _) | (false, None) => target.upload(http, MIB).await,
            (false, Some(key)) => {
                client
                    .upload(target.server, key, reqwest::Body::from(vec![0x5a; MIB]))
                    .await
            }
        }
    })
    .await
}

/// filedock's CPU per 4 KiB plain upload: 32 users with one in flight
/// each, and one user's 32 at once (grouped); with the MongoDB and Redis
/// commands per upload and the store's CPU beside.
async fn cpu_per_small_upload(client: &Client, builds: &[(String, Server)], r: &mut Report) {
    const N: usize = 640;
    r.section(
        "13b. filedock's CPU per 4 KiB plain upload, 640 uploads, 32 in flight (issue 44)",
        "| build | load | succeeded | per second | MongoDB cmds / upload | commit txns / upload | write conflicts / upload | Redis cmds / upload | CPU ms / upload: filedock | SecantusDB |",
    );
    for (users, load) in [(32, "32 users"), (1, "one user's burst")] {
        let mut results: Vec<Vec<(Batch, Cost)>> = builds.iter().map(|_| Vec::new()).collect();
        for rep in 0..REPS {
            for i in 0..builds.len() {
                let which = (i + rep) % builds.len();
                let server = &builds[which].1;
                let mut keys = Vec::new();
                for u in 0..users {
                    keys.push(client.user(server, &format!("cpu-{users}-{rep}-{u}")).await);
                }
                quiet().await;
                let before = counters(server, true).await;
                let batch = drive(N, 32, |i| {
                    client.upload(
                        server,
                        &keys[i % users],
                        reqwest::Body::from(vec![1u8; 4096]),
                    )
                })
                .await;
                let after = counters(server, true).await;
                results[which].push((batch, per_upload(&before, &after, N)));
            }
        }
        for (which, (name, _)) in builds.iter().enumerate() {
            let mut reps = results[which].clone();
            reps.sort_by(|a, b| a.1.cpu_ms.partial_cmp(&b.1.cpu_ms).unwrap());
            let (batch, c) = &reps[reps.len() / 2];
            r.row(format!(
                "| {name} | {load} | {}/{} | {:.0} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {} |",
                batch.ok,
                batch.total,
                batch.rate(),
                c.mongo,
                c.txns,
                c.conflicts,
                c.redis,
                c.cpu_ms,
                c.stack("mongo"),
            ));
        }
    }
}
