//! The fault suite's cluster: two filedock processes whose MongoDB, Redis
//! and S3 links run through fault proxies, a private Redis the nemesis may
//! restart and flush, and the nemesis itself.

use std::time::{Duration, Instant};

use filedock::{config::Settings, http::AppState};
use rand::{Rng, rngs::StdRng};

use crate::{fault_proxy::FaultProxy, helpers::*, servers::OwnRedis};

/// Leases and grace short enough that a paused process outlives them.
const LOCK_TTL_SECS: &str = "2";
pub const GRACE_SECS: u64 = 4;

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

pub struct Cluster {
    pub mongo: FaultProxy,
    pub redis: FaultProxy,
    pub s3: FaultProxy,
    own_redis: OwnRedis,
    redis_port: u16,
    pub instances: Vec<Server>,
    /// The same backends, reached directly: maintenance and the checker.
    pub state: AppState,
    pub dir: std::path::PathBuf,
}

impl Cluster {
    pub async fn start(coordination: &str) -> Self {
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

/// Injects faults until `until`; returns how many.
pub async fn nemesis(c: &mut Cluster, rng: &mut StdRng, until: Instant) -> Vec<String> {
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
