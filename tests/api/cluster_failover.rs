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
    config::RedisMode,
    lock::{LockManager, redis::RedisLocks},
    redis_link::RedisLink,
};

use crate::{
    cluster_mode::Heard,
    support::{failover_waiters::serve_across, redis_cluster as cluster},
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
    let lease = holder
        .try_acquire(key, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free lock");
    let listener = holder.listen_for_release(key).await;
    let mut asked = listener.requests();
    cluster::fail_over(&seeds, &format!("{prefix}{key}")).await;
    // Asked again and again, as a waiting request does.
    let deadline = Instant::now() + Duration::from_secs(15);
    while asked.borrow().is_none() && Instant::now() < deadline {
        let _ = asker.request_release(key).await;
        let _ = tokio::time::timeout(Duration::from_millis(250), asked.changed()).await;
    }
    assert!(
        asked.borrow().is_some(),
        "the holder never heard a release request after the failover"
    );
    holder.release(&lease).await.ok();
}
