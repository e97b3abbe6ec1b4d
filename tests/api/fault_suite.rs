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

use filedock::{config::Settings, domain::users, http::AppState};
use rand::{Rng, SeedableRng, rngs::StdRng};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;

use crate::{
    fault_proxy::FaultProxy,
    helpers::*,
    history::{Answer, Event, FinalState, Op, check},
    real::OwnRedis,
};

/// Leases and grace short enough that a paused process outlives them.
const LOCK_TTL_SECS: &str = "2";
const GRACE_SECS: u64 = 4;
const CLIENTS: usize = 12;
const MCP: &str = "mcp-shared";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn addr_of(url: &str) -> std::net::SocketAddr {
    let host = url
        .split("://")
        .nth(1)
        .unwrap()
        .split(['/', '?'])
        .next()
        .unwrap();
    host.parse().unwrap()
}

struct Cluster {
    mongo: FaultProxy,
    redis: FaultProxy,
    s3: FaultProxy,
    own_redis: OwnRedis,
    redis_port: u16,
    instances: Vec<Server>,
    /// The same backends, reached directly: maintenance and the checker.
    state: AppState,
    dir: std::path::PathBuf,
}

impl Cluster {
    async fn start(coordination: &str) -> Self {
        let redis_port = free_port();
        let own_redis = OwnRedis::start(redis_port).await;
        let mongo = FaultProxy::start(addr_of(
            &std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap(),
        ))
        .await;
        let redis = FaultProxy::start(([127, 0, 0, 1], redis_port).into()).await;
        let s3 = FaultProxy::start(addr_of(
            &std::env::var("FILEDOCK_TEST_S3_ENDPOINT").unwrap(),
        ))
        .await;
        let mut settings: Settings = test_settings();
        settings.redis_url = Some(format!("redis://127.0.0.1:{redis_port}/").into());
        settings.sweep.intent_grace = Duration::from_secs(GRACE_SECS);
        settings.sweep.retry_interval = Duration::ZERO;
        let dir = settings.data_dir.clone();
        std::fs::create_dir_all(&dir).unwrap();
        let mut instances = Vec::new();
        for i in 0..2 {
            instances.push(
                spawn_instance(
                    &settings,
                    &mongo,
                    &redis,
                    &s3,
                    coordination,
                    &dir.join(format!("instance{i}.log")),
                )
                .await,
            );
        }
        let state = AppState::build(settings).await.unwrap();
        Self {
            mongo,
            redis,
            s3,
            own_redis,
            redis_port,
            instances,
            state,
            dir,
        }
    }
}

async fn spawn_instance(
    settings: &Settings,
    mongo: &FaultProxy,
    redis: &FaultProxy,
    s3: &FaultProxy,
    coordination: &str,
    log: &std::path::Path,
) -> Server {
    let port = free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .envs(binary_env(settings))
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .env(
            "FILEDOCK_MONGODB_URI",
            format!(
                "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=1000",
                mongo.addr()
            ),
        )
        .env("FILEDOCK_REDIS_URL", format!("redis://{}/", redis.addr()))
        .env("FILEDOCK_S3_ENDPOINT", format!("http://{}", s3.addr()))
        .env("FILEDOCK_COORDINATION", coordination)
        .env("FILEDOCK_LOCK_TTL_SECS", LOCK_TTL_SECS)
        .env("FILEDOCK_LOCK_WAIT_SECS", "10")
        .env("FILEDOCK_SWEEP_INTENT_GRACE_SECS", GRACE_SECS.to_string())
        .env("FILEDOCK_SWEEP_RETRY_INTERVAL_SECS", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if reqwest::get(format!("{}/healthz", server.base))
            .await
            .is_ok()
        {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("filedock did not start; see {}", log.display());
}

/// What the workload shares: the user, the containers, the files it may
/// delete or attach, and the history.
struct World {
    bases: Vec<String>,
    key: String,
    session: String,
    agent: String,
    files: Mutex<Vec<String>>,
    history: Mutex<Vec<Event>>,
    uploads: std::sync::atomic::AtomicUsize,
    /// Links of their own that clients connect, and those acknowledged.
    links: std::sync::atomic::AtomicUsize,
    connected: Mutex<Vec<String>>,
    client: reqwest::Client,
}

impl World {
    /// Sends one request and classifies the answer.
    async fn send(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<reqwest::Body>,
        json: Option<Value>,
    ) -> (Answer, Value) {
        let mut req = self
            .client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(90));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/octet-stream")
                .body(b);
        }
        if let Some(j) = json {
            req = req.json(&j);
        }
        match req.send().await {
            Err(e) => (Answer::Unknown(format!("transport: {e}")), Value::Null),
            Ok(res) => {
                let status = res.status();
                let body: Value = res.json().await.unwrap_or(Value::Null);
                let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
                let answer = if status.is_success() {
                    Answer::Ok
                } else if status == StatusCode::GATEWAY_TIMEOUT || code == "outcome_unknown" {
                    Answer::Unknown(code)
                } else {
                    Answer::Failed(if code.is_empty() {
                        status.to_string()
                    } else {
                        code
                    })
                };
                (answer, body)
            }
        }
    }

    async fn one_op(&self, rng: &mut StdRng) {
        let base = &self.bases[rng.random_range(0..self.bases.len())];
        let known = self.files.lock().unwrap().clone();
        let pick = rng.random_range(0..100);
        let invoked = Instant::now();
        let (op, answer, file_id) = if pick < 40 || known.is_empty() {
            let n = self
                .uploads
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let bytes = pseudo_random_bytes(rng.random_range(1..16_384), n as u64);
            let name = format!("u{n}.bin");
            let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
            let path = format!("/v1/files?filename={name}");
            let (answer, body) = self
                .send(base, Method::POST, &path, Some(bytes.into()), None)
                .await;
            let id = body["id"].as_str().map(str::to_owned);
            if let (Answer::Ok, Some(id)) = (&answer, &id) {
                self.files.lock().unwrap().push(id.clone());
            }
            (Op::Upload { name, sha256 }, answer, id)
        } else {
            let file_id = known[rng.random_range(0..known.len())].clone();
            let (op, method, path, json) = match pick {
                40..55 => (
                    Op::Delete {
                        file_id: file_id.clone(),
                    },
                    Method::DELETE,
                    format!("/v1/files/{file_id}"),
                    None,
                ),
                55..70 => (
                    Op::AttachSession {
                        file_id: file_id.clone(),
                    },
                    Method::POST,
                    format!("/v1/sessions/{}/files", self.session),
                    Some(json!({"file_id": file_id})),
                ),
                70..80 => (
                    Op::AttachAgent {
                        file_id: file_id.clone(),
                    },
                    Method::POST,
                    format!("/v1/agents/{}/files", self.agent),
                    Some(json!({"file_id": file_id})),
                ),
                80..85 => (
                    Op::Link { connect: true },
                    Method::PUT,
                    format!("/v1/agents/{}/mcps/{MCP}", self.agent),
                    None,
                ),
                85..90 => (
                    Op::Link { connect: false },
                    Method::DELETE,
                    format!("/v1/agents/{}/mcps/{MCP}", self.agent),
                    None,
                ),
                90..95 => {
                    let n = self.links.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mcp = format!("own{n}");
                    let path = format!("/v1/agents/{}/mcps/{mcp}", self.agent);
                    (Op::OwnLink { mcp, connect: true }, Method::PUT, path, None)
                }
                _ => {
                    // Disconnect a link whose connect was acknowledged, once.
                    let Some(mcp) = self.connected.lock().unwrap().pop() else {
                        return;
                    };
                    let path = format!("/v1/agents/{}/mcps/{mcp}", self.agent);
                    (
                        Op::OwnLink {
                            mcp,
                            connect: false,
                        },
                        Method::DELETE,
                        path,
                        None,
                    )
                }
            };
            let (answer, _) = self.send(base, method, &path, None, json).await;
            if let (Op::OwnLink { mcp, connect: true }, Answer::Ok) = (&op, &answer) {
                self.connected.lock().unwrap().push(mcp.clone());
            }
            (op, answer, None)
        };
        self.history.lock().unwrap().push(Event {
            op,
            invoked,
            completed: Instant::now(),
            answer,
            file_id,
        });
    }
}

/// Injects faults until `until`; returns how many.
async fn nemesis(c: &mut Cluster, rng: &mut StdRng, until: Instant) -> Vec<String> {
    let mut injected = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        let down = Duration::from_millis(rng.random_range(50..3000));
        let fault = match rng.random_range(0..8) {
            0 => {
                c.mongo.cut(down);
                format!("mongo cut {down:?}")
            }
            1 => {
                c.mongo.cut_after(b"commitTransaction", down);
                format!("mongo cut after a commit {down:?}")
            }
            2 if rng.random_bool(0.5) => {
                c.redis.cut(down);
                format!("redis cut {down:?}")
            }
            2 => {
                c.redis.cut_after(b"XADD", down);
                format!("redis cut after an enqueue {down:?}")
            }
            3 => {
                c.s3.cut(down.min(Duration::from_secs(2)));
                format!("s3 cut {down:?}")
            }
            4 => {
                // Longer than the lock lease and the sweeper's grace.
                let pause = Duration::from_millis(rng.random_range(2500..5000));
                let pid = c.instances[1].child.id() as i32;
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                tokio::time::sleep(pause).await;
                unsafe { libc::kill(pid, libc::SIGCONT) };
                format!("instance 1 paused {pause:?}")
            }
            5 => {
                c.own_redis.stop();
                tokio::time::sleep(down).await;
                c.own_redis = OwnRedis::start(c.redis_port).await;
                format!("redis restarted after {down:?}")
            }
            6 => {
                let url = format!("redis://127.0.0.1:{}/", c.redis_port);
                if let Ok(mut conn) = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                {
                    let _: Result<(), _> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
                }
                "redis FLUSHALL".into()
            }
            _ => {
                c.mongo
                    .cut(Duration::from_millis(rng.random_range(5000..8000)));
                "mongo cut long".into()
            }
        };
        injected.push(fault);
    }
    injected
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
async fn final_state(w: &World, state: &AppState, user_id: &str) -> FinalState {
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
        fin.files.insert(f.id.clone(), (f.filename.clone(), sha));
    }
    fin.session_files = state
        .ports
        .meta
        .session(user_id, &w.session)
        .await
        .unwrap()
        .unwrap()
        .file_ids;
    let agent = state
        .ports
        .meta
        .agent(user_id, &w.agent)
        .await
        .unwrap()
        .unwrap();
    fin.agent_files = agent.file_ids;
    fin.linked = agent.mcp_ids.iter().any(|m| m == MCP);
    fin.mcp_ids = agent.mcp_ids;
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
        .map(|f| f.key)
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
    let session = client
        .post(format!("{base0}/v1/sessions"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let agent = client
        .post(format!("{base0}/v1/agents"))
        .bearer_auth(&key)
        .json(&json!({"name": "a"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let world = Arc::new(World {
        bases: cluster.instances.iter().map(|s| s.base.clone()).collect(),
        key,
        session,
        agent,
        files: Mutex::default(),
        history: Mutex::default(),
        uploads: 0.into(),
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
