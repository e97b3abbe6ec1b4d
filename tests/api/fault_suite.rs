//! The fault suite: two filedock processes behind fault proxies to MongoDB,
//! Redis and S3, a workload of uploads, deletes, attaches and connects and
//! disconnects of one shared MCP link, and a nemesis that cuts links (also
//! right after a commit is sent), pauses a process past its leases, restarts
//! and flushes Redis, while `reconcile --delete` and `sweep` run in a loop.
//! After healing and one sweep, the final state is checked against the
//! history of requests and answers (see `history.rs`).
//!
//! `FILEDOCK_FAULT_SEED` replays a fault schedule; `FILEDOCK_FAULT_SECS`
//! (default 20) sets how long the workload runs, for a longer soak.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use filedock::{domain::users, http::AppState, vocab::UserId};
use rand::{SeedableRng, rngs::StdRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Digest;

use crate::{
    fault_cluster::{Cluster, GRACE_SECS, nemesis},
    fault_workload::{MCP, World},
    helpers::*,
    history::{FinalState, check},
};

const CLIENTS: usize = 12;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `reconcile --delete` and one sweeper pass, in turns, until `stop`.
async fn maintenance(state: AppState, stop: tokio_util::sync::CancellationToken) -> (usize, usize) {
    let sweeper = state.sweeper.clone();
    let (mut reconciles, mut sweeps) = (0, 0);
    while !stop.is_cancelled() {
        if state.reconciler.reconcile(true).await.is_ok() {
            reconciles += 1;
        }
        if sweeper.try_run_once().await.is_ok() {
            sweeps += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (reconciles, sweeps)
}

/// Reads everything back through the direct backends.
async fn final_state(w: &World, state: &AppState, user_id: &UserId) -> FinalState {
    let mut fin = FinalState::default();
    for f in state
        .ports
        .meta
        .list_files(user_id, None, 100_000)
        .await
        .unwrap()
    {
        let res = w
            .client
            .get(format!("{}/v1/files/{}/content", w.bases[0], f.id))
            .bearer_auth(&w.key)
            .send()
            .await
            .unwrap();
        let sha = if res.status() == StatusCode::OK {
            Some(hex::encode(sha2::Sha256::digest(
                res.bytes().await.unwrap(),
            )))
        } else {
            None
        };
        fin.files
            .insert(f.id.to_string(), (f.filename.clone(), sha));
    }
    fin.session_files = state
        .ports
        .meta
        .session(user_id, &w.session.parse().unwrap())
        .await
        .unwrap()
        .unwrap()
        .file_ids
        .iter()
        .map(ToString::to_string)
        .collect();
    let agent = state
        .ports
        .meta
        .agent(user_id, &w.agent.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    fin.agent_files = agent.file_ids.iter().map(ToString::to_string).collect();
    fin.mcp_ids = agent
        .mcp_ids
        .iter()
        .map(|m| m.as_str().to_owned())
        .collect();
    fin.linked = fin.mcp_ids.iter().any(|m| m == MCP);
    let objects: std::collections::HashSet<String> = state
        .ports
        .blobs
        .list_keys(&format!("files/{user_id}/"))
        .await
        .unwrap()
        .into_iter()
        .collect();
    let records: std::collections::HashSet<String> = state
        .ports
        .meta
        .list_files(user_id, None, 100_000)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.key.to_string())
        .collect();
    fin.strays = objects.difference(&records).count();
    fin.missing = records.difference(&objects).count();
    fin.intents = state
        .ports
        .meta
        .intents(filedock::meta::now() + chrono::Duration::days(1), 10_000)
        .await
        .unwrap()
        .len();
    fin
}

async fn run_suite(coordination: &str) {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let seed: u64 = env_or("FILEDOCK_FAULT_SEED", rand::random());
    let secs: u64 = env_or("FILEDOCK_FAULT_SECS", 20);
    eprintln!(
        "fault suite ({coordination}): seed {seed}, {secs} s; replay with FILEDOCK_FAULT_SEED={seed}"
    );
    let mut cluster = Cluster::start(coordination).await;
    let base0 = cluster.instances[0].base.clone();
    let key = create_user_at(&base0, ADMIN_KEY, "jepsen").await;
    let user_id = cluster
        .state
        .ports
        .meta
        .user_by_key_hash(&users::hash_key(&key))
        .await
        .unwrap()
        .unwrap()
        .id;
    let client = reqwest::Client::new();
    let created = |path: &'static str, body: Value| {
        let req = client
            .post(format!("{base0}{path}"))
            .bearer_auth(&key)
            .json(&body);
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["id"].as_str().unwrap().to_owned()
        }
    };
    let session = created("/v1/sessions", json!({})).await;
    let agent = created("/v1/agents", json!({"name": "a"})).await;
    let world = Arc::new(World {
        bases: cluster.instances.iter().map(|s| s.base.clone()).collect(),
        key,
        session,
        agent,
        files: Mutex::default(),
        history: Mutex::default(),
        uploads: 0.into(),
        renames: 0.into(),
        links: 0.into(),
        connected: Mutex::default(),
        client,
    });

    let until = Instant::now() + Duration::from_secs(secs);
    let stop = tokio_util::sync::CancellationToken::new();
    let upkeep = tokio::spawn(maintenance(cluster.state.clone(), stop.clone()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let w = world.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (i as u64 + 1));
                while Instant::now() < until {
                    w.one_op(&mut rng).await;
                }
            })
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = nemesis(&mut cluster, &mut rng, until).await;
    for proxy in [&cluster.mongo, &cluster.redis, &cluster.s3] {
        proxy.heal();
    }
    for c in clients {
        c.await.unwrap();
    }
    stop.cancel();
    let (reconciles, sweeps) = upkeep.await.unwrap();

    // Healed: wait out the grace, then one sweep takes what failed uploads left.
    tokio::time::sleep(Duration::from_secs(GRACE_SECS + 1)).await;
    cluster.state.sweeper.try_run_once().await.unwrap();
    let fin = final_state(&world, &cluster.state, &user_id).await;
    let history = world.history.lock().unwrap().clone();
    let v = check(&history, &fin);
    eprintln!(
        "fault suite ({coordination}) seed {seed}: {} faults, {} requests, {} acknowledged, {} failed, {} unknown; lost {}, half-done {}, reordered {}, failed-but-applied {}, internal errors {}; {reconciles} reconciles and {sweeps} sweeps beside; not 2xx: {:?}",
        faults.len(),
        v.requests,
        v.acknowledged,
        v.failed,
        v.unknown,
        v.lost,
        v.half_done,
        v.reordered,
        v.failed_but_applied,
        v.internal_errors,
        v.codes
    );
    if v.violations() > 0 {
        eprintln!("faults: {faults:?}");
        for n in v.notes.iter().take(30) {
            eprintln!("  {n}");
        }
        eprintln!("instance logs in {}", cluster.dir.display());
    }
    assert_eq!(
        v.violations(),
        0,
        "seed {seed}: the guarantees did not hold"
    );
    assert!(
        v.acknowledged > 0 && faults.len() > 3,
        "the run did too little to prove anything"
    );
}

#[tokio::test]
async fn lock_mode_keeps_every_acknowledged_write_under_faults() {
    run_suite("lock").await;
}

#[tokio::test]
async fn queue_mode_keeps_every_acknowledged_write_under_faults() {
    run_suite("queue").await;
}
