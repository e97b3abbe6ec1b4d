//! filedock in cluster mode (`FILEDOCK_REDIS_MODE=cluster`) on the test
//! Redis Cluster (three masters with a replica each, started by
//! scripts/stack.sh): locks on every master, notices heard on the node of
//! each key's slot, subscriptions that follow the keys waited on. Skipped
//! without the cluster. The failovers are in `cluster_failover.rs`, run on
//! their own (they disturb every other test on the cluster).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use filedock::{
    config::{Environment, RedisMode},
    redis_link::{NoticeHandler, RedisLink},
};
use reqwest::StatusCode;

use crate::{helpers::*, support::redis_cluster as cluster};

/// Notices a handler heard, by channel.
#[derive(Default)]
pub(crate) struct Heard {
    pub by_channel: Mutex<HashMap<String, Vec<String>>>,
}

impl NoticeHandler for Heard {
    fn notice(&self, channel: &str, payload: &[u8]) {
        let payload = String::from_utf8_lossy(payload).into_owned();
        self.by_channel
            .lock()
            .unwrap()
            .entry(channel.to_owned())
            .or_default()
            .push(payload);
    }
    fn missed(&self) {}
}

impl Heard {
    pub fn count(&self, channel: &str) -> usize {
        self.by_channel
            .lock()
            .unwrap()
            .get(channel)
            .map_or(0, Vec::len)
    }
}

/// A cluster-mode app on the test cluster, in production (where a lock
/// that cannot be taken fails the request instead of running it unlocked).
pub(crate) fn cluster_settings(seeds: &str) -> filedock::config::Settings {
    let mut settings = test_settings();
    settings.redis_url = Some(seeds.to_owned().into());
    settings.redis_mode = RedisMode::Cluster;
    settings.env = Environment::Production;
    settings
}

/// 30 channels spread over the three masters, watched by one link: each
/// notice published on its channel's master is heard once; the sharded
/// subscriptions exist while watched and are gone after (a process holds
/// none for keys nobody waits on).
#[tokio::test]
async fn watched_channels_are_heard_on_every_master_and_unsubscribed_after() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let link = RedisLink::connect(&seeds, RedisMode::Cluster).unwrap();
    let heard = Arc::new(Heard::default());
    let notices = link.notices(Vec::new(), heard.clone());
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let channels: Vec<String> = (0..30).map(|i| format!("w{tag}:{{k{i}}}:notify")).collect();
    let mut masters = std::collections::HashSet::new();
    for c in &channels {
        masters.insert(cluster::master_of(&seeds, c).await.id);
    }
    assert_eq!(masters.len(), 3, "the channels cover every master");

    let mut watches = Vec::new();
    for c in &channels {
        let watch = notices.watch(c).await;
        assert!(watch.fresh, "the first watch of {c} subscribes");
        watches.push(watch);
    }
    let again = notices.watch(&channels[0]).await;
    assert!(!again.fresh, "a second watch shares the subscription");
    drop(again);
    let pattern = format!("w{tag}:*");
    assert_eq!(cluster::shard_channels(&seeds, &pattern).await, 30);

    for c in &channels {
        assert_eq!(cluster::spublish(&seeds, c, "n1").await, 1, "{c}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while channels.iter().any(|c| heard.count(c) < 1) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in &channels {
        assert_eq!(heard.count(c), 1, "{c} heard once");
    }

    drop(watches);
    // Unsubscribed a second after the last watcher left.
    let left = cluster::until_no_shard_channels(&seeds, &pattern).await;
    assert_eq!(left, 0, "subscriptions left after their watchers");
}

/// Watches dropped while their subscription is in flight (a request
/// cancelled mid-wait) leave no subscription behind and no watcher counted.
#[tokio::test]
async fn cancelled_watches_leave_no_subscription() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let link = RedisLink::connect(&seeds, RedisMode::Cluster).unwrap();
    let notices = link.notices(Vec::new(), Arc::new(Heard::default()));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    // Warm: the cluster's slot map is known, so the watches below are
    // cancelled at their SSUBSCRIBE.
    drop(notices.watch(&format!("c{tag}:{{warm}}:notify")).await);
    let mut cancelled = 0;
    for i in 0..20 {
        let channel = format!("c{tag}:{{k{i}}}:notify");
        // Polled once (its SSUBSCRIBE sent), then dropped.
        if futures::FutureExt::now_or_never(notices.watch(&channel)).is_none() {
            cancelled += 1;
        }
    }
    assert!(cancelled > 0, "no watch was cancelled mid-way");
    let pattern = format!("c{tag}:*");
    let left = cluster::until_no_shard_channels(&seeds, &pattern).await;
    assert_eq!(left, 0, "{cancelled} cancelled watches left subscriptions");
}

/// 24 users × 2 uploads at once, over two cluster-mode instances in
/// development (where a lock the backend cannot give is counted as
/// degraded, and the request runs without it): every lock is taken on its
/// key's master (the users' commit locks are spread over all three), so
/// every upload is created, none runs unlocked, none is misrouted, and
/// every user lists exactly its 2 files.
#[tokio::test]
async fn uploads_of_many_users_take_their_locks_on_every_master() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let mut settings = cluster_settings(&seeds);
    settings.env = Environment::Development;
    let a = spawn_app_with(settings.clone()).await;
    let b = spawn_app_with(settings).await;
    let mut users = Vec::new();
    for i in 0..24 {
        users.push(a.create_user(&format!("cluster-{i}")).await);
    }
    let uploads = users.iter().enumerate().flat_map(|(i, u)| {
        let app = if i % 2 == 0 { &a } else { &b };
        (0..2).map(move |n| async move {
            let res = app.upload_raw(u, &format!("f{n}"), vec![b'x'; 64]).await;
            error_code(res).await
        })
    });
    for answer in futures::future::join_all(uploads).await {
        assert_eq!(answer.0, StatusCode::CREATED, "{answer:?}");
    }
    for u in &users {
        assert_eq!(a.list_ids(u).await.len(), 2, "{}", u.id);
    }
    let mut masters = std::collections::HashSet::new();
    for u in &users {
        let key = format!("user_file_upload_lock:{{{}}}:commit", u.id);
        masters.insert(cluster::master_of(&seeds, &key).await.id);
    }
    // 24 users miss a master about once in 5,000 runs.
    assert_eq!(masters.len(), 3, "the users' locks live on every master");
    for app in [&a, &b] {
        for metric in [
            "filedock_lock_misrouted_total",
            "filedock_lock_degraded_total",
        ] {
            assert_eq!(app.metric(metric, "").await, 0.0, "{metric}");
        }
    }
}

/// Queue mode on a cluster: two instances, 12 or more agents whose buckets live on
/// every master, 8 connects each sent at once over both: every connect
/// answered 200 and applied once, all by the queue's workers (none by the
/// direct path, nothing misrouted or dead-lettered), the results heard
/// through sharded subscriptions on each bucket's master.
#[tokio::test]
async fn queue_mode_runs_on_a_cluster_with_buckets_on_every_master() {
    use filedock::{
        config::Coordination,
        coord::{bucket_of, queue::RedisQueue},
        lock::LockKey,
    };
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let mut settings = cluster_settings(&seeds);
    settings.coordination = Coordination::Queue;
    let a = spawn_app_with(settings.clone()).await;
    let b = spawn_app_with(settings.clone()).await;
    let mut agents = Vec::new();
    let mut masters = std::collections::HashSet::new();
    // At least 12, and until the buckets are on every master (at most 60).
    for i in 0..60 {
        if agents.len() >= 12 && masters.len() == 3 {
            break;
        }
        let user = a.create_user(&format!("q{i}")).await;
        let id = a.new_agent(&user).await;
        let stream = RedisQueue::stream(
            &settings.redis_prefix,
            bucket_of(&LockKey::agent_config(&id)),
        );
        masters.insert(cluster::master_of(&seeds, &stream).await.addr);
        agents.push((user, id));
    }
    assert_eq!(masters.len(), 3, "the agents' buckets live on every master");
    let (a_ref, b_ref) = (&a, &b);
    let total = agents.len() * 8;
    let connects = agents.iter().flat_map(|(user, agent)| {
        (0..8).map(move |j| {
            let app = if j % 2 == 0 { a_ref } else { b_ref };
            let path = format!("/v1/agents/{agent}/mcps/m{j}");
            async move { app.json("PUT", path, user, None).await }
        })
    });
    for (status, body) in futures::future::join_all(connects).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for (user, agent) in &agents {
        let (_, got) = b
            .json("GET", format!("/v1/agents/{agent}"), user, None)
            .await;
        let mut mcps: Vec<&str> = got["mcp_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        mcps.sort_unstable();
        assert_eq!(mcps, ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"]);
    }
    let applied = "outcome=\"applied\"";
    let mut queued = 0.0;
    for app in [&a, &b] {
        queued += app.metric("filedock_queue_processed_total", applied).await;
        for metric in [
            "filedock_lock_misrouted_total",
            "filedock_lock_degraded_total",
        ] {
            assert_eq!(app.metric(metric, "").await, 0.0, "{metric}");
        }
    }
    assert_eq!(
        queued, total as f64,
        "every connect applied by a queue worker"
    );
}

/// A cluster-mode filedock pointed at a standalone Redis refuses to start
/// (it could learn no slot), naming the setting.
#[tokio::test]
async fn cluster_mode_on_a_standalone_redis_is_refused_at_start() {
    let mut settings = test_settings();
    if cluster::cluster_seeds().is_none() || settings.redis_mode == RedisMode::Cluster {
        return;
    }
    // The stack's standalone Redis.
    settings.redis_mode = RedisMode::Cluster;
    let Err(e) = filedock::ports::Ports::connect(&settings).await else {
        panic!("cluster mode started on a standalone Redis");
    };
    assert!(
        format!("{e:#}").contains("FILEDOCK_REDIS_MODE=single"),
        "{e:#}"
    );
}
