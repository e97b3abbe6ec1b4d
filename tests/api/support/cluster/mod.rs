//! The fault suite's cluster: two filedock processes whose MongoDB, Redis
//! and S3 links (and RabbitMQ's, with the queue on it) run through fault
//! proxies, and a private Redis the nemesis may restart and flush (and a
//! private RabbitMQ it may kill). An instance can be killed (SIGKILL),
//! paused (SIGSTOP) and started again on its port.

use std::{process::Child, time::Duration};

use filedock::{
    config::{QueueBroker, RedisMode, Settings},
    http::AppState,
};

use crate::{
    helpers::*,
    support::{
        fault_deck::{Fault, Topology},
        fault_proxy::FaultProxy,
        own_cluster::OwnRedisCluster,
        own_rabbit::OwnRabbit,
        own_sentinel::{MASTER, OwnSentinel},
        precommit_hook::PrecommitHookServer,
        servers::OwnRedis,
        webhook_receiver::WebhookReceiver,
    },
};

mod env;

/// Leases and grace short enough that a paused process outlives them.
pub const LOCK_TTL: Duration = Duration::from_secs(2);
pub const GRACE: Duration = Duration::from_secs(4);
/// How long an upload whose commit answer was lost reads back before it
/// answers `outcome_unknown` (`FILEDOCK_SETTLE_WINDOW_SECS`): short, so
/// that a MongoDB cut can outlast it and the 504 path runs.
pub const SETTLE_WINDOW: Duration = Duration::from_secs(3);
/// A resumable upload with no PATCH for this long expires: the final
/// sweep, after it, must leave nothing of any.
pub const TUS_EXPIRY: Duration = Duration::from_secs(20);
/// The S3 part size: uploads of a few MiB already go multipart.
pub const PART_SIZE: usize = 5 << 20;
/// How long an instance trusts a key it authenticated: a revocation or a
/// user's deletion holds everywhere this long after it is answered.
pub const AUTH_CACHE: Duration = Duration::from_secs(2);
/// Each session's and agent's lists stop this short, so that some of the
/// workload's attaches and connects are refused (409 `container_full`) under
/// the faults too: the checker holds a refusal to "nothing applied".
pub const CONTAINER_MAX_ITEMS: usize = 3;
/// The caps on a user's keys and live tokens, low enough that the
/// hot user's mints meet them (409, and nothing stored) now and then.
pub const MAX_KEYS: usize = 5;
pub const MAX_TOKENS: usize = 8;
const INSTANCES: usize = 2;
/// What the suite reads from the instances' `/metrics` (summed over
/// restarts): panics, and how often the grouped paths ran.
pub const COUNTERS: [&str; 3] = [
    "filedock_http_panics_total",
    "filedock_uploads_grouped_total",
    "filedock_queue_grouped_total",
];

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

/// Whether the filedock at `base` answers `/healthz` within 20 s.
async fn answers(base: &str) -> bool {
    let client = reqwest::Client::new();
    for _ in 0..400 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One filedock process of the cluster, on a port it keeps across restarts.
pub struct Instance {
    pub base: String,
    port: u16,
    child: Option<Child>,
    log: std::path::PathBuf,
    /// Counters of the processes that ran on this port and are gone.
    counted_before: Vec<f64>,
}

pub struct Cluster {
    pub mongo: FaultProxy,
    pub redis: FaultProxy,
    pub s3: FaultProxy,
    pub own_redis: OwnRedis,
    pub redis_port: u16,
    /// On a Redis Cluster or with Sentinel, the instances' Redis instead
    /// (not behind a proxy: their clients follow the nodes' own addresses).
    pub own_cluster: Option<OwnRedisCluster>,
    pub own_sentinel: Option<OwnSentinel>,
    topology: Topology,
    /// With the queue on RabbitMQ: the instances' link to it, and the
    /// broker the nemesis kills (the suite's own state reaches it directly).
    pub amqp: Option<FaultProxy>,
    pub own_rabbit: Option<OwnRabbit>,
    broker: QueueBroker,
    pub instances: Vec<Instance>,
    /// The same backends, reached directly: maintenance and the checker.
    pub state: AppState,
    pub settings: Settings,
    coordination: String,
    pub dir: std::path::PathBuf,
    /// Where the instances deliver their webhooks.
    pub receiver: WebhookReceiver,
    /// What the instances ask before each commit (signed with the
    /// receiver's secret, the one `FILEDOCK_WEBHOOK_SECRET`).
    pub hook: PrecommitHookServer,
}

impl Cluster {
    /// `topology`: the instances take their locks on one Redis behind a
    /// proxy, or (lock mode) on a private Redis Cluster or Sentinel-watched
    /// primary, which the nemesis fails over. `broker`: in queue mode, the
    /// queue on that Redis, or on a private RabbitMQ behind a proxy.
    pub async fn start(coordination: &str, topology: Topology, broker: QueueBroker) -> Self {
        assert!(
            broker == QueueBroker::Redis || coordination == "queue",
            "RabbitMQ carries queue mode only"
        );
        let own_rabbit = match broker {
            QueueBroker::Rabbitmq => Some(OwnRabbit::start().await),
            QueueBroker::Redis => None,
        };
        let amqp = match &own_rabbit {
            Some(own) => Some(FaultProxy::start(([127, 0, 0, 1], own.port()).into()).await),
            None => None,
        };
        let redis_port = free_port();
        let own_redis = OwnRedis::start(redis_port).await;
        let own_cluster = match topology {
            Topology::Cluster => Some(OwnRedisCluster::start().await),
            _ => None,
        };
        let own_sentinel = match topology {
            Topology::Sentinel => Some(OwnSentinel::start().await),
            _ => None,
        };
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
        if let Some(own) = &own_cluster {
            settings.redis_url = Some(own.seeds().into());
            settings.redis_mode = RedisMode::Cluster;
        }
        if let Some(own) = &own_sentinel {
            settings.redis_url = Some(own.urls().to_owned().into());
            settings.redis_mode = RedisMode::Sentinel;
            settings.redis_sentinel_master = Some(MASTER.into());
        }
        settings.queue_broker = broker;
        settings.amqp_url = own_rabbit.as_ref().map(|own| own.url().into());
        settings.sweep.intent_grace = GRACE;
        settings.sweep.retry_interval = Duration::ZERO;
        settings.max_container_items = CONTAINER_MAX_ITEMS;
        settings.auth_cache_ttl = AUTH_CACHE;
        // Its leases as the instances' (a deployment's share one setting):
        // a release a killed master applied but had not replicated comes
        // back with the failover and bars its key until the lease ends.
        settings.lock.ttl = LOCK_TTL;
        let dir = settings.data_dir.clone();
        std::fs::create_dir_all(&dir).unwrap();
        let state = AppState::build(settings.clone()).await.unwrap();
        // The suite's own sweeps write events too (an expiry's): its
        // sequencer places them as an instance's would (ends with the test).
        filedock::worker::spawn(
            state.events.sequencer(),
            tokio_util::sync::CancellationToken::new(),
        );
        let receiver = WebhookReceiver::start().await;
        let hook = PrecommitHookServer::start(receiver.secret()).await;
        let mut cluster = Self {
            mongo,
            redis,
            s3,
            own_redis,
            redis_port,
            own_cluster,
            own_sentinel,
            topology,
            amqp,
            own_rabbit,
            broker,
            instances: Vec::new(),
            state,
            settings,
            coordination: coordination.to_owned(),
            dir,
            receiver,
            hook,
        };
        for i in 0..INSTANCES {
            let port = free_port();
            cluster.instances.push(Instance {
                base: format!("http://127.0.0.1:{port}"),
                port,
                child: None,
                log: cluster.dir.join(format!("instance{i}.log")),
                counted_before: vec![0.0; COUNTERS.len()],
            });
            cluster.start_instance(i).await;
        }
        cluster
    }

    /// Starts instance `i` on its port and waits until it answers.
    pub async fn start_instance(&mut self, i: usize) {
        let env = self.instance_env();
        let instance = &mut self.instances[i];
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&instance.log)
            .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
            .envs(env)
            .env("FILEDOCK_BIND", format!("127.0.0.1:{}", instance.port))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        instance.child = Some(child);
        if !answers(&instance.base).await {
            panic!("filedock did not start; see {}", instance.log.display());
        }
    }

    /// The fault kinds the nemesis deals for this cluster.
    pub fn deck(&self) -> Vec<Fault> {
        Fault::deck(&self.coordination, self.topology, self.broker)
    }

    /// Every fault proxy of the instances' links.
    pub fn proxies(&self) -> Vec<&FaultProxy> {
        let mut proxies = vec![&self.mongo, &self.redis, &self.s3];
        proxies.extend(&self.amqp);
        proxies
    }

    pub fn pid(&self, i: usize) -> i32 {
        self.instances[i].child.as_ref().unwrap().id() as i32
    }

    /// SIGKILLs instance `i` (its counters read first, while it answers).
    pub async fn kill(&mut self, i: usize) {
        let counted = self.counted_by(i).await;
        let instance = &mut self.instances[i];
        for (before, now) in instance.counted_before.iter_mut().zip(counted) {
            *before += now;
        }
        if let Some(mut child) = instance.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs instance `i` (its counters read first) and waits for its
    /// drain to end: it must exit 0 within the drain's bound.
    pub async fn drain(&mut self, i: usize) {
        let counted = self.counted_by(i).await;
        let instance = &mut self.instances[i];
        for (before, now) in instance.counted_before.iter_mut().zip(counted) {
            *before += now;
        }
        let Some(mut child) = instance.child.take() else {
            return;
        };
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // The ready grace, the requests' 30 s, the workers' as long again.
        let deadline = std::time::Instant::now() + Duration::from_secs(75);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("instance {i} did not end its drain in 75 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            status.success(),
            "instance {i} ended its drain with {status}"
        );
    }

    /// [`COUNTERS`] as instance `i`'s current process has them (0 if it
    /// does not answer).
    async fn counted_by(&self, i: usize) -> Vec<f64> {
        let url = format!("{}/metrics", self.instances[i].base);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let text = match client.get(url).send().await {
            Ok(res) => res.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        COUNTERS
            .iter()
            .map(|name| metric_in(&text, name, ""))
            .collect()
    }

    /// [`COUNTERS`] over every process the cluster ran.
    pub async fn counted(&self) -> Vec<f64> {
        let mut total = vec![0.0; COUNTERS.len()];
        for i in 0..self.instances.len() {
            let now = self.counted_by(i).await;
            for (t, (before, now)) in total
                .iter_mut()
                .zip(self.instances[i].counted_before.iter().zip(now))
            {
                *t += before + now;
            }
        }
        total
    }

    /// Every instance answers `/healthz` (a paused one has been continued).
    pub async fn all_up(&self) {
        for instance in &self.instances {
            answers(&instance.base).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
