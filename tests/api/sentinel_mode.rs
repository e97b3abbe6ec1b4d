//! filedock with Sentinel (`FILEDOCK_REDIS_MODE=sentinel`) on the test
//! topology (a primary, its replica, three sentinels; scripts/stack.sh):
//! locks on the primary the sentinels name, followed across a failover
//! without a restart. scripts/test.sh runs these one at a time: each
//! fails the primary over. Skipped without the topology.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use filedock::{
    config::RedisMode,
    lock::{LockManager, redis::RedisLocks},
    redis_link::RedisLink,
};
use reqwest::StatusCode;

use crate::{
    helpers::*,
    support::{
        failover_waiters::{release_heard_across, serve_across},
        sentinel,
    },
};

fn sentinel_settings(urls: &str, master: &str) -> filedock::config::Settings {
    let mut settings = test_settings();
    settings.redis_url = Some(urls.to_owned().into());
    settings.redis_mode = RedisMode::Sentinel;
    settings.redis_sentinel_master = Some(master.to_owned());
    settings
}

/// 12 users × 2 uploads over two instances in development (where a lock
/// the backend cannot give would be counted as degraded), then a Sentinel
/// failover, then as many again: every upload created, none degraded or
/// misrouted once the sentinels agree (the instances left the old
/// primary by themselves), every user lists its 4 files.
#[tokio::test]
async fn uploads_follow_the_primary_across_a_sentinel_failover() {
    let Some((urls, master)) = sentinel::sentinels() else {
        return;
    };
    let settings = sentinel_settings(&urls, &master);
    let a = spawn_app_with(settings.clone()).await;
    let b = spawn_app_with(settings).await;
    let mut users = Vec::new();
    for i in 0..12 {
        users.push(a.create_user(&format!("sentinel-{i}")).await);
    }
    let round = |r: usize| {
        let (a, b, users) = (&a, &b, &users);
        async move {
            let uploads = users.iter().enumerate().flat_map(|(i, u)| {
                let app = if i % 2 == 0 { a } else { b };
                (0..2).map(move |n| async move {
                    let res = app
                        .upload_raw(u, &format!("r{r}-{n}"), vec![b'x'; 64])
                        .await;
                    error_code(res).await
                })
            });
            futures::future::join_all(uploads).await
        }
    };
    for answer in round(0).await {
        assert_eq!(answer.0, StatusCode::CREATED, "before: {answer:?}");
    }
    let old = sentinel::primary(&urls, &master).await;
    let new = sentinel::fail_over(&urls, &master).await;
    assert_ne!(old, new);
    // The instances heard +switch-master, or find the old primary demoted
    // (READONLY: refused, 503) and ask again: a moment after the failover,
    // every lock is on the new primary.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = (
        a.metric("filedock_lock_misrouted_total", "").await,
        b.metric("filedock_lock_misrouted_total", "").await,
    );
    for answer in round(1).await {
        assert_eq!(answer.0, StatusCode::CREATED, "after: {answer:?}");
    }
    for u in &users {
        assert_eq!(a.list_ids(u).await.len(), 4, "{}", u.id);
    }
    for app in [&a, &b] {
        let degraded = app.metric("filedock_lock_degraded_total", "").await;
        assert_eq!(degraded, 0.0, "a lock was given up for an outage");
    }
    let after = (
        a.metric("filedock_lock_misrouted_total", "").await,
        b.metric("filedock_lock_misrouted_total", "").await,
    );
    assert_eq!(before, after, "refused after the instances moved");
}

/// 16 waiters on one key, half on each of two instances, each holding the
/// lock for 300 ms, while the sentinels fail the primary over: every waiter
/// gets the lock (some before, some after), and each fence is above the one
/// before in the order the lock was granted: a fence is never below Redis
/// `TIME` in µs, so fences grow with the time of their grant whichever
/// primary gave them, which is what keeps a commit safe if a demoted
/// primary still granted the lock meanwhile (overlapping holds are counted
/// and reported, not excluded).
#[tokio::test]
async fn lock_waiters_are_served_across_a_sentinel_failover() {
    let Some((urls, master)) = sentinel::sentinels() else {
        return;
    };
    let prefix = format!("ls{}:", uuid::Uuid::new_v4().simple());
    let manager = || {
        let link = RedisLink::connect_sentinel(&urls, &master).unwrap();
        Arc::new(RedisLocks::on(&link, &prefix)) as Arc<dyn LockManager>
    };
    // Ready to fail over at once (after an earlier failover the sentinels
    // take seconds to know the demoted primary as a replica).
    sentinel::until_replica_known(&urls, &master, Duration::from_secs(40)).await;
    let served = serve_across(
        [manager(), manager()],
        "{user:hot}:commit",
        Duration::from_millis(300),
        || async { sentinel::fail_over_timed(&urls, &master).await.1 },
    )
    .await;
    served.assert_served_in_turn("a Sentinel failover");
}

/// A holder listening for release requests before the failover hears one
/// asked after it: its subscription moved to the new primary.
#[tokio::test]
async fn a_release_request_reaches_its_holder_after_a_sentinel_failover() {
    let Some((urls, master)) = sentinel::sentinels() else {
        return;
    };
    let prefix = format!("lr{}:", uuid::Uuid::new_v4().simple());
    let link = || RedisLink::connect_sentinel(&urls, &master).unwrap();
    let (holder, asker) = (
        RedisLocks::on(&link(), &prefix),
        RedisLocks::on(&link(), &prefix),
    );
    let key = "filedock_resumable_lock:{upload-1}";
    let heard = release_heard_across(&holder, &asker, key, || async {
        let new = sentinel::fail_over(&urls, &master).await;
        // A demoted primary still hears what is published on the new one
        // (it replicates it): what shows the subscriptions moved is the new
        // primary's count of them (one connection for each of the two links).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut subscribers = 0;
        while subscribers < 2 && Instant::now() < deadline {
            subscribers = sentinel::pattern_subscribers(&new).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            subscribers >= 2,
            "{subscribers} links subscribed on the new primary"
        );
    })
    .await;
    assert!(
        heard,
        "the holder never heard a release request after the failover"
    );
}

/// A master name no sentinel knows is refused at start, by its setting.
#[tokio::test]
async fn an_unknown_master_name_is_refused_at_start() {
    let Some((urls, _)) = sentinel::sentinels() else {
        return;
    };
    let settings = sentinel_settings(&urls, "no-such-master");
    let Err(e) = filedock::ports::Ports::connect(&settings).await else {
        panic!("started with a master no sentinel knows");
    };
    assert!(
        format!("{e:#}").contains("FILEDOCK_REDIS_SENTINEL_MASTER"),
        "{e:#}"
    );
}

/// Queue mode with Sentinel: 8 agents × 4 connects over two instances,
/// a failover, as many again: every connect answered 200 and applied once,
/// each by a queue worker (the bucket workers left the old primary, whose
/// connections fail once the sentinels name another, and took their
/// buckets again on the new one).
#[tokio::test]
async fn queued_writes_follow_the_primary_across_a_sentinel_failover() {
    let Some((urls, master)) = sentinel::sentinels() else {
        return;
    };
    let mut settings = sentinel_settings(&urls, &master);
    settings.coordination = filedock::config::Coordination::Queue;
    let a = spawn_app_with(settings.clone()).await;
    let b = spawn_app_with(settings).await;
    let mut agents = Vec::new();
    for i in 0..8 {
        let user = a.create_user(&format!("queued-{i}")).await;
        let agent = a.new_agent(&user).await;
        agents.push((user, agent));
    }
    let round = |r: usize| {
        let (a, b, agents) = (&a, &b, &agents);
        async move {
            let connects = agents.iter().flat_map(|(user, agent)| {
                (0..4).map(move |n| async move {
                    let app = if n % 2 == 0 { a } else { b };
                    let path = format!("/v1/agents/{agent}/mcps/r{r}-{n}");
                    app.json("PUT", path, user, None).await
                })
            });
            futures::future::join_all(connects).await
        }
    };
    for (status, body) in round(0).await {
        assert_eq!(status, StatusCode::OK, "before: {body}");
    }
    sentinel::until_replica_known(&urls, &master, Duration::from_secs(40)).await;
    let old = sentinel::primary(&urls, &master).await;
    let new = sentinel::fail_over(&urls, &master).await;
    assert_ne!(old, new);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (status, body) in round(1).await {
        assert_eq!(status, StatusCode::OK, "after: {body}");
    }
    for (user, agent) in &agents {
        let (_, got) = a
            .json("GET", format!("/v1/agents/{agent}"), user, None)
            .await;
        assert_eq!(got["mcp_ids"].as_array().unwrap().len(), 8, "{got}");
    }
    let applied = "outcome=\"applied\"";
    let mut queued = 0.0;
    for app in [&a, &b] {
        queued += app.metric("filedock_queue_processed_total", applied).await;
    }
    assert_eq!(queued, 64.0, "every connect applied by a queue worker");
}
