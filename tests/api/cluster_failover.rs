//! Cluster mode across a manual failover (`CLUSTER FAILOVER` on a replica:
//! the master's slots move to it, no write lost): notices are heard again
//! where the slot now lives, and lock waiters on two instances are served
//! one at a time with increasing fences throughout. scripts/test.sh runs
//! these on their own, one at a time: a failover disturbs every other
//! request to that master.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use filedock::{
    config::{LockScope, LockSettings, LockStrategy, RedisMode},
    lock::{LockKey, LockManager, Locks, TryLock, redis::RedisLocks},
    redis_link::RedisLink,
};

use crate::{
    cluster_mode::Heard,
    support::{
        failover_waiters::{release_heard_across, serve_across},
        own_cluster::OwnRedisCluster,
        redis_cluster as cluster,
    },
};

/// A channel watched before its master fails over: the old master drops
/// its subscribers (the crate forgets the channel), and the link
/// subscribes again on the new master, where later notices are heard.
#[tokio::test]
async fn a_watched_channel_is_heard_again_after_its_master_fails_over() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let link = RedisLink::connect(&seeds, RedisMode::Cluster).unwrap();
    let heard = Arc::new(Heard::default());
    let notices = link.notices(Vec::new(), heard.clone());
    let channel = format!("f{}:{{k}}:notify", uuid::Uuid::new_v4().simple());
    let watch = notices.watch(&channel).await;
    assert!(watch.fresh);
    assert_eq!(cluster::spublish(&seeds, &channel, "before").await, 1);

    cluster::fail_over(&seeds, &channel).await;
    // Published until heard: the resubscription follows the failover.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut reached = 0;
    while heard.count(&channel) < 2 && Instant::now() < deadline {
        reached = cluster::spublish(&seeds, &channel, "after").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let payloads = heard.by_channel.lock().unwrap().get(&channel).cloned();
    let payloads = payloads.unwrap_or_default();
    assert_eq!(payloads.first().map(String::as_str), Some("before"));
    assert!(
        payloads.iter().any(|p| p == "after"),
        "not heard after the failover (last publish reached {reached}): {payloads:?}"
    );
    drop(watch);
}

/// 16 waiters on one key, half on each of two instances (two links), each
/// holding the lock for 150 ms, while the key's master fails over: every
/// waiter gets the lock (some before the failover, some after it), never
/// two at once, and each fence is above the one before. A call refused
/// meanwhile (503: an outage or a topology answer) is counted and tried
/// again.
#[tokio::test]
async fn lock_waiters_on_two_instances_are_served_one_at_a_time_across_a_failover() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let prefix = format!("lf{}:", uuid::Uuid::new_v4().simple());
    let manager = || {
        let link = RedisLink::connect(&seeds, RedisMode::Cluster).unwrap();
        Arc::new(RedisLocks::on(&link, &prefix)) as Arc<dyn LockManager>
    };
    let key = "{user:hot}:commit";
    let served = serve_across(
        [manager(), manager()],
        key,
        Duration::from_millis(150),
        || async {
            cluster::fail_over(&seeds, &format!("{prefix}{key}")).await;
            Instant::now()
        },
    )
    .await;
    served.assert_served_in_turn("a cluster failover");
    // A manual failover loses no write: never two holders.
    assert_eq!(served.overlaps, 0, "two holders at once");
}

/// A holder listening for release requests before its lock's master fails
/// over still hears one asked after it (a resumable upload's PATCH that
/// would otherwise keep a silent client's lock).
#[tokio::test]
async fn a_release_request_reaches_its_holder_after_a_failover() {
    let Some(seeds) = cluster::cluster_seeds() else {
        return;
    };
    let prefix = format!("lr{}:", uuid::Uuid::new_v4().simple());
    let holder = RedisLocks::on(
        &RedisLink::connect(&seeds, RedisMode::Cluster).unwrap(),
        &prefix,
    );
    let asker = RedisLocks::on(
        &RedisLink::connect(&seeds, RedisMode::Cluster).unwrap(),
        &prefix,
    );
    let key = "filedock_resumable_lock:{upload-1}";
    let heard = release_heard_across(&holder, &asker, key, || async {
        cluster::fail_over(&seeds, &format!("{prefix}{key}")).await;
    })
    .await;
    assert!(
        heard,
        "the holder never heard a release request after the failover"
    );
}

/// One master paused (its calls time out): a lock on one of its keys is an
/// outage (development: degraded, and the 1 s breaker opens), but the
/// breaker covers that master's slots only: within its second, a lock on
/// another master's key is still taken for real, not degraded. (With one
/// breaker for the whole backend it was degraded: a lock-free run beside
/// holders elsewhere.)
#[tokio::test]
async fn one_masters_outage_leaves_the_other_masters_locks_alone() {
    if cluster::cluster_seeds().is_none() {
        return;
    }
    // The cluster takes the paused master for failed only after 30 s (a
    // down cluster would answer CLUSTERDOWN for every key).
    let mut own = OwnRedisCluster::start_with(Duration::from_secs(30)).await;
    let prefix = "b:";
    let link = RedisLink::connect(&own.seeds(), RedisMode::Cluster).unwrap();
    let settings = LockSettings {
        strategy: LockStrategy::Notify,
        scope: LockScope::Commit,
        ttl: Duration::from_secs(30),
        wait_timeout: Duration::from_secs(5),
    };
    let metrics = Arc::new(filedock::metrics::Metrics::default());
    let manager = Arc::new(RedisLocks::on(&link, prefix));
    let locks = Locks::new(manager, settings, false, metrics);
    // Two users whose commit locks live on different masters.
    let full = |k: &LockKey| format!("{prefix}{}", k.as_str());
    let down = LockKey::user_commit("user-0");
    let down_master = cluster::master_of(&own.seeds(), &full(&down)).await.id;
    let mut up = None;
    for i in 1..100 {
        let key = LockKey::user_commit(&format!("user-{i}"));
        if cluster::master_of(&own.seeds(), &full(&key)).await.id != down_master {
            up = Some(key);
            break;
        }
    }
    let up = up.expect("a key on another master");
    for key in [&down, &up] {
        let TryLock::Held(guard) = locks.try_acquire(key).await.unwrap() else {
            panic!("{key:?} not taken with every master up");
        };
        guard.release().await;
    }
    let paused = own.pause_master_of(&full(&down)).await;
    let outage = locks.try_acquire(&down).await;
    let elsewhere = locks.try_acquire(&up).await;
    unsafe { libc::kill(paused, libc::SIGCONT) };
    assert!(
        matches!(outage, Ok(TryLock::Degraded)),
        "the paused master's key: {:?}",
        outage.map(|t| matches!(t, TryLock::Held(_)))
    );
    let Ok(TryLock::Held(guard)) = elsewhere else {
        let got = elsewhere.map(|t| matches!(t, TryLock::Degraded));
        panic!(
            "another master's key was not locked within the outage's breaker second: {got:?} (Ok(true): degraded)"
        );
    };
    guard.release().await;
}
