//! Scenarios 4 to 6: lock vs queue, the ceiling, and small files.

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use filedock::{
    blob::{BlobStore, s3::S3BlobStore},
    domain::{Filename, upload::NewUpload, users},
    http::AppState,
    metrics::Metrics,
    testing::Server,
    vocab::{BlobKey, FileId, UserId},
};
use futures::{StreamExt, TryStreamExt, stream};

use crate::support::*;

/// 200 users on `server`, each with an agent: (key, agent id).
async fn agents_on(client: &Client, server: &Server) -> Vec<(String, String)> {
    let mut owners = Vec::new();
    for u in 0..200 {
        let key = client.user(server, &format!("spread-{u}")).await;
        let agent = client.agent(server, &key).await;
        owners.push((key, agent));
    }
    owners
}

/// Scenario 4: lock vs queue coordination, spread over 200 users and on
/// one hot agent: the lock path, the queue on Redis Streams, and the queue
/// on RabbitMQ with direct reply-to and with a reply queue per instance
/// (the study's three designs, and its reply choice measured), alternating
/// within each repetition; then the hot agent at 200 in flight (the
/// study's k6 load) with failures, mean, p50 and p99.
pub(crate) async fn lock_vs_queue(client: &Client, r: &mut Report) {
    r.section(
        "4. Lock vs queue coordination (1000 MCP connects, 64 in flight)",
        "| load | coordination | succeeded | ops/s | p50 | p99 |",
    );
    let amqp = std::env::var("FILEDOCK_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let rabbit = |reply_to: &'static str| {
        vec![
            ("FILEDOCK_COORDINATION", "queue".to_owned()),
            ("FILEDOCK_QUEUE_BROKER", "rabbitmq".into()),
            ("FILEDOCK_AMQP_URL", amqp.clone()),
            ("FILEDOCK_AMQP_REPLY_TO", reply_to.into()),
            // The machine's broker: the run's queues go with it.
            ("FILEDOCK_AMQP_QUEUE_EXPIRY_SECS", "60".into()),
        ]
    };
    let designs: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("lock", vec![("FILEDOCK_COORDINATION", "lock".into())]),
        (
            "queue, Redis Streams",
            vec![("FILEDOCK_COORDINATION", "queue".into())],
        ),
        ("queue, RabbitMQ direct reply-to", rabbit("direct")),
        ("queue, RabbitMQ reply queue", rabbit("queue")),
    ];
    let mut servers = Vec::new();
    for (_, env) in &designs {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        servers.push(Server::start(&env).await);
    }
    // 200 users with an agent each, on every server.
    let mut owners = Vec::new();
    for server in &servers {
        owners.push(agents_on(client, server).await);
    }
    let n = servers.len();
    let run = |load: &'static str, ops: usize, in_flight: usize, spread: bool, rep: usize| {
        let (servers, owners) = (&servers, &owners);
        async move {
            let mut batches = vec![None; n];
            for i in 0..n {
                let which = (i + rep) % n;
                let (server, owners) = (&servers[which], &owners[which]);
                // The 200-in-flight run on an agent of its own: a hot
                // agent's links grow with every run on it.
                let hot = usize::from(load == "H");
                let batch = drive(ops, in_flight, |k| {
                    let (key, agent) = if spread {
                        &owners[k % 200]
                    } else {
                        &owners[hot]
                    };
                    let mcp = format!("{load}{rep}-{k}");
                    async move { client.connect(server, key, agent, &mcp).await }
                })
                .await;
                batches[which] = Some(batch);
            }
            batches
                .into_iter()
                .map(Option::unwrap)
                .collect::<Vec<Batch>>()
        }
    };
    for (load, spread) in [
        ("A: spread over 200 agents", true),
        ("B: one hot agent", false),
    ] {
        let mut results = vec![Vec::new(); n];
        for rep in 0..REPS {
            for (i, b) in run(&load[..1], 1000, 64, spread, rep)
                .await
                .into_iter()
                .enumerate()
            {
                results[i].push(b);
            }
        }
        let medians: Vec<Batch> = results.into_iter().map(median).collect();
        for ((name, _), b) in designs.iter().zip(&medians) {
            r.row(format!(
                "| {load} | {name} | {}/{} | {:.0} | {} | {} |",
                b.ok,
                b.total,
                b.rate(),
                ms(b.p50),
                ms(b.p99)
            ));
        }
        for ((name, _), b) in designs.iter().zip(&medians).skip(1) {
            r.row(format!(
                "| {load} | {name} ÷ lock (ops/s) | | {:.2}× | | |",
                b.rate() / medians[0].rate()
            ));
        }
    }
    r.section(
        "4b. One hot agent at 200 in flight (the study's load: 1000 MCP connects)",
        "| coordination | failed | ops/s | mean | p50 | p99 |",
    );
    let mut results = vec![Vec::new(); n];
    for rep in 0..REPS {
        for (i, b) in run("H", 1000, 200, false, rep)
            .await
            .into_iter()
            .enumerate()
        {
            results[i].push(b);
        }
    }
    for ((name, _), b) in designs.iter().zip(results.into_iter().map(median)) {
        r.row(format!(
            "| {name} | {} | {:.0} | {} | {} | {} |",
            b.total - b.ok,
            b.rate(),
            ms(b.mean),
            ms(b.p50),
            ms(b.p99)
        ));
    }
}

/// Scenario 4c: scenario 4 on a Redis Cluster (three masters with a
/// replica each, cluster mode) beside one Redis node, same run: four
/// servers (lock and queue on each), alternating within each repetition.
pub(crate) async fn lock_vs_queue_on_a_cluster(client: &Client, r: &mut Report) {
    r.section(
        "4c. Lock vs queue on one Redis node vs a Redis Cluster (1000 MCP connects, 64 in flight)",
        "| load | coordination | one node ops/s | cluster ops/s | cluster ÷ one node | one node p99 | cluster p99 |",
    );
    let seeds = env("FILEDOCK_TEST_REDIS_CLUSTER_URL");
    let cluster = [
        ("FILEDOCK_REDIS_MODE", "cluster"),
        ("FILEDOCK_REDIS_URL", seeds.as_str()),
    ];
    let mut servers = Vec::new();
    for on_cluster in [false, true] {
        for coordination in ["lock", "queue"] {
            let mut extra = vec![("FILEDOCK_COORDINATION", coordination)];
            if on_cluster {
                extra.extend(cluster);
            }
            servers.push(Server::start(&extra).await);
        }
    }
    // 200 users with an agent each, on every server.
    let mut owners = Vec::new();
    for server in &servers {
        owners.push(agents_on(client, server).await);
    }
    for (load, spread) in [
        ("A: spread over 200 agents", true),
        ("B: one hot agent", false),
    ] {
        let mut results: Vec<Vec<Batch>> = vec![Vec::new(); servers.len()];
        for rep in 0..REPS {
            for i in 0..servers.len() {
                let which = (i + rep) % servers.len();
                let (server, owners) = (&servers[which], &owners[which]);
                let batch = drive(1000, 64, |n| {
                    let (key, agent) = if spread { &owners[n % 200] } else { &owners[0] };
                    let mcp = format!("m{rep}-{n}");
                    async move { client.connect(server, key, agent, &mcp).await }
                })
                .await;
                results[which].push(batch);
            }
        }
        let b: Vec<Batch> = results.into_iter().map(median).collect();
        for (name, node, on_cluster) in [("lock", b[0], b[2]), ("queue", b[1], b[3])] {
            r.row(format!(
                "| {load} | {name} | {:.0} ({}/{}) | {:.0} ({}/{}) | {:.2}× | {} | {} |",
                node.rate(),
                node.ok,
                node.total,
                on_cluster.rate(),
                on_cluster.ok,
                on_cluster.total,
                on_cluster.rate() / node.rate(),
                ms(node.p99),
                ms(on_cluster.p99)
            ));
        }
        r.row(format!(
            "| {load} | queue ÷ lock (ops/s) | {:.2}× | {:.2}× | | | |",
            b[1].rate() / b[0].rate(),
            b[3].rate() / b[2].rate()
        ));
    }
}

/// Scenario 5: large uploads through filedock vs straight to S3, and peak RSS.
pub(crate) async fn ceiling(client: &Client, r: &mut Report) {
    r.section(
        "5. Throughput ceiling: filedock vs a direct aws-sdk-s3 upload of the same bytes",
        "| size | filedock | direct S3 | filedock ÷ direct |",
    );
    let server = Server::start(&[]).await;
    let key = client.user(&server, "big").await;
    let direct = S3BlobStore::connect(
        &s3_store_settings(&format!("d{}/", run_id())),
        Arc::new(Metrics::default()),
    )
    .await
    .unwrap();
    for (size, reps) in [(256usize << 20, REPS), (1 << 30, 1)] {
        let mut rates = [Vec::new(), Vec::new()];
        for rep in 0..reps {
            for i in 0..2 {
                let which = (i + rep) % 2;
                let (body, raw) = generated(size);
                let started = Instant::now();
                let ok = if which == 0 {
                    client.upload(&server, &key, body).await.0
                } else {
                    direct
                        .put(
                            // Direct writes, under keys of their own.
                            &BlobKey::file(UserId::new(), FileId::new()),
                            raw.map_err(Into::into).boxed(),
                        )
                        .await
                        .is_ok()
                };
                assert!(ok, "upload of {size} bytes failed");
                rates[which].push(size as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64());
            }
        }
        let (f, d) = (median_f(rates[0].clone()), median_f(rates[1].clone()));
        r.row(format!(
            "| {} MiB | {f:.0} MiB/s | {d:.0} MiB/s | {:.2} |",
            size >> 20,
            f / d
        ));
    }
    // Peak memory of a fresh server through one 1 GiB upload.
    let fresh = Server::start(&[]).await;
    let key = client.user(&fresh, "rss").await;
    let (body, _) = generated(1 << 30);
    assert!(client.upload(&fresh, &key, body).await.0);
    r.note(format!(
        "Peak RSS of a fresh filedock through one 1 GiB upload (8 MiB parts, 4 in flight): **{} MiB**.",
        fresh.peak_rss_mib()
    ));
}

/// Scenario 6: 4 KiB uploads at 32 in flight over 200 users vs direct S3 PUTs.
pub(crate) async fn small_files(client: &Client, r: &mut Report) {
    r.section(
        "6. Small files: 2000 × 4 KiB, 32 in flight",
        "| path | succeeded | per second | p50 | p99 |",
    );
    let server = Server::start(&[]).await;
    let mut keys = Vec::new();
    for u in 0..200 {
        keys.push(client.user(&server, &format!("small-{u}")).await);
    }
    let direct = S3BlobStore::connect(
        &s3_store_settings(&format!("s{}/", run_id())),
        Arc::new(Metrics::default()),
    )
    .await
    .unwrap();
    let body = Bytes::from(vec![9u8; 4096]);
    // The floor: the same service code (intent, lock, PUT, transaction,
    // release) called in-process, without HTTP or authentication.
    let floor_state = AppState::build(floor_settings()).await.unwrap();
    let mut floor_users = Vec::new();
    for u in 0..200 {
        floor_users.push(
            users::create_user(floor_state.ports.meta.as_ref(), &format!("floor-{u}"))
                .await
                .unwrap()
                .0,
        );
    }
    let mut results = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..3 {
            let which = (i + rep) % 3;
            let batch = if which == 0 {
                drive(2000, 32, |n| {
                    client.upload(&server, &keys[n % 200], reqwest::Body::from(body.clone()))
                })
                .await
            } else if which == 2 {
                drive(2000, 32, |n| {
                    let (state, user, body) = (&floor_state, &floor_users[n % 200], body.clone());
                    async move {
                        let t = Instant::now();
                        let new = NewUpload {
                            filename: Filename::parse("floor.bin").unwrap(),
                            content_type: "application/octet-stream".into(),
                            declared_len: Some(4096),
                            body: stream::iter([Ok(body)]).boxed(),
                            idempotency_key: None,
                            expected_digest: None,
                        };
                        let slot = state.uploads.reserve(user).unwrap();
                        (
                            state.uploads.upload(slot, user, new).await.is_ok(),
                            t.elapsed(),
                        )
                    }
                })
                .await
            } else {
                drive(2000, 32, |_| {
                    let (direct, body) = (&direct, body.clone());
                    async move {
                        let t = Instant::now();
                        let ok = direct
                            .put(
                                &BlobKey::file(UserId::new(), FileId::new()),
                                stream::iter([Ok(body)]).boxed(),
                            )
                            .await
                            .is_ok();
                        (ok, t.elapsed())
                    }
                })
                .await
            };
            results[which].push(batch);
        }
    }
    let (f, d, fl) = (
        median(results[0].clone()),
        median(results[1].clone()),
        median(results[2].clone()),
    );
    for (name, b) in [
        ("filedock over HTTP", f),
        ("the floor: same service calls in-process, no HTTP", fl),
        ("direct S3 PUT only", d),
    ] {
        r.row(format!(
            "| {name} | {}/{} | {:.0} | {} | {} |",
            b.ok,
            b.total,
            b.rate(),
            ms(b.p50),
            ms(b.p99)
        ));
    }
    r.row(format!(
        "| filedock ÷ floor (per second) | | {:.2} | | |",
        f.rate() / fl.rate()
    ));
    r.row(format!(
        "| filedock ÷ direct S3 PUT (per second) | | {:.2} | | |",
        f.rate() / d.rate()
    ));
}
