//! Lock semantics, on the in-process manager and (with real servers) on Redis.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::Utc;
use filedock::{
    config::{LockScope, LockStrategy},
    lock::{Lease, LockKey, LockManager, Locks, memory::MemoryLocks, redis::RedisLocks},
    meta::{CommitUpload, Fence, FileRecord, MetaError},
    metrics::Metrics,
};
use reqwest::StatusCode;

use crate::helpers::*;

const TTL: Duration = Duration::from_secs(30);

/// One manager per backend under test: in-process always, Redis with real servers.
fn managers() -> Vec<(&'static str, Arc<dyn LockManager>)> {
    let mut all: Vec<(&'static str, Arc<dyn LockManager>)> =
        vec![("memory", Arc::new(MemoryLocks::new()))];
    if real_backends() {
        all.push(("redis", Arc::new(redis_locks(&unique_prefix()))));
    }
    all
}

fn unique_prefix() -> String {
    format!("lt{}:", uuid::Uuid::new_v4().simple())
}

fn redis_locks(prefix: &str) -> RedisLocks {
    RedisLocks::connect(&std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap(), prefix).unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[tokio::test]
async fn a_lock_released_by_a_non_owner_stays_held() {
    for (name, m) in managers() {
        let held = m.try_acquire("k:{a}", TTL).await.unwrap().unwrap();
        let forged = Lease {
            owner: "not-the-owner".into(),
            ..held.clone()
        };
        assert!(!m.release(&forged).await.unwrap(), "{name}");
        assert!(!m.renew(&forged, TTL).await.unwrap(), "{name}");
        assert!(
            m.try_acquire("k:{a}", TTL).await.unwrap().is_none(),
            "{name}: still held"
        );
        assert!(m.release(&held).await.unwrap(), "{name}");
        let next = m
            .try_acquire("k:{a}", TTL)
            .await
            .unwrap()
            .expect("free after the owner's release");
        assert!(next.fence > held.fence, "{name}: fencing tokens increase");
    }
}

#[tokio::test]
async fn an_expired_holders_commit_is_refused_by_its_stale_fence() {
    let app = spawn_app().await;
    let u = app.create_user("fenced").await;
    let m = app.state.ports.locks.manager().clone();
    let key = format!("user_file_upload_lock:{{{}}}:small", u.id);
    // A holder stalls past its TTL…
    let stale = m
        .try_acquire(&key, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // …another request takes the lock and commits…
    assert_eq!(
        app.upload_raw(&u, "fresh.txt", b"new".to_vec())
            .await
            .status(),
        StatusCode::CREATED
    );
    // …so the stale holder's commit must be refused.
    let id = filedock::vocab::FileId::new();
    let file = FileRecord {
        id,
        owner_id: u.user_id(),
        filename: "stale.txt".into(),
        content_type: "text/plain".into(),
        size: 3,
        sha256: sha256_hex(b"old"),
        category: filedock::vocab::SizeCategory::Small,
        bucket: app.state.ports.blobs.bucket().into(),
        key: filedock::vocab::BlobKey::file(u.user_id(), id),
        created_at: Utc::now(),
        sessions: Vec::new(),
        agents: Vec::new(),
    };
    let commit = CommitUpload {
        file,
        fence: Some(Fence {
            slot: "small".into(),
            token: stale.fence as i64,
            pinned: false,
        }),
        quota_bytes: None,
        idempotency: None,
    };
    let r = app.state.ports.meta.commit_upload(&commit).await;
    assert!(matches!(r, Err(MetaError::StaleFence)), "{r:?}");
    assert_eq!(
        app.list_ids(&u).await.len(),
        1,
        "the stale commit left nothing"
    );
}

#[tokio::test]
async fn a_holder_working_past_the_ttl_keeps_its_lock_through_renewal() {
    for (name, m) in managers() {
        let mut settings = test_settings().lock;
        settings.ttl = Duration::from_millis(300);
        let locks = Locks::new(m.clone(), settings, true, Arc::new(Metrics::default()));
        let key = LockKey::agent_config(&uuid::Uuid::new_v4().to_string());
        let guard = locks.acquire(&key).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await; // four TTLs
        assert!(!guard.lost().is_cancelled(), "{name}: lease lost");
        assert!(
            m.try_acquire(key.as_str(), TTL).await.unwrap().is_none(),
            "{name}: renewed, still held"
        );
        guard.release().await;
        assert!(
            m.try_acquire(key.as_str(), TTL).await.unwrap().is_some(),
            "{name}: released"
        );
    }
}

#[tokio::test]
async fn a_lost_lease_cancels_the_holders_work() {
    for (name, m) in managers() {
        let mut settings = test_settings().lock;
        settings.ttl = Duration::from_millis(300);
        let locks = Locks::new(m.clone(), settings, true, Arc::new(Metrics::default()));
        let key = LockKey::agent_config(&uuid::Uuid::new_v4().to_string());
        let guard = locks.acquire(&key).await.unwrap().unwrap();
        // Someone breaks the lease (as an expiry during a long pause would).
        let stolen = Lease {
            owner: guard.lease().owner.clone(),
            ..guard.lease().clone()
        };
        assert!(m.release(&stolen).await.unwrap());
        let thief = m.try_acquire(key.as_str(), TTL).await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(2), guard.lost().cancelled())
            .await
            .unwrap_or_else(|_| panic!("{name}: the watchdog did not notice the lost lease"));
        m.release(&thief).await.unwrap();
    }
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    for (name, m) in managers() {
        let key = format!("order:{{{}}}", uuid::Uuid::new_v4());
        let first = m.try_acquire(&key, TTL).await.unwrap().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (m, order, key) = (m.clone(), order.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let lease = m.acquire_fair(&key, TTL, far()).await.unwrap();
                order.lock().unwrap().push(i);
                m.release(&lease).await.unwrap();
            }));
            tokio::time::sleep(Duration::from_millis(15)).await; // arrive one after another
        }
        m.release(&first).await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            (0..16).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn waiters_from_two_instances_are_served_in_arrival_order() {
    if !real_backends() {
        eprintln!("needs Redis: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    // Two managers with their own connections and subscriptions: two filedock
    // instances as far as Redis can tell.
    let prefix = unique_prefix();
    let a: Arc<dyn LockManager> = Arc::new(redis_locks(&prefix));
    let b: Arc<dyn LockManager> = Arc::new(redis_locks(&prefix));
    let key = format!("order:{{{}}}", uuid::Uuid::new_v4());
    let first = a.try_acquire(&key, TTL).await.unwrap().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let m = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (order, key) = (order.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let lease = m.acquire_fair(&key, TTL, far()).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            m.release(&lease).await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    a.release(&first).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_next_waiter_is_woken_by_the_release_not_by_polling() {
    // Redis waiters re-poll every 500 ms as a safety net; a hand-off well
    // under that shows the release notice did the waking.
    for (name, m) in managers() {
        let key = format!("handoff:{{{}}}", uuid::Uuid::new_v4());
        let mut gaps = Vec::new();
        for _ in 0..10 {
            let held = m.try_acquire(&key, TTL).await.unwrap().unwrap();
            let (m2, key2) = (m.clone(), key.clone());
            let waiter = tokio::spawn(async move {
                let lease = m2.acquire_fair(&key2, TTL, far()).await.unwrap();
                (Instant::now(), lease)
            });
            tokio::time::sleep(Duration::from_millis(30)).await; // the waiter is queued
            let released_at = Instant::now();
            m.release(&held).await.unwrap();
            let (acquired_at, lease) = waiter.await.unwrap();
            gaps.push(acquired_at - released_at);
            m.release(&lease).await.unwrap();
        }
        gaps.sort();
        let median = gaps[gaps.len() / 2];
        assert!(
            median < Duration::from_millis(100),
            "{name}: median hand-off {median:?}"
        );
    }
}

/// Release hands the lock straight to the head of the queue. If that waiter's
/// process died while it waited, the handed-over lease is short (seconds, not
/// the TTL), so the next live waiter gets the lock well within its wait.
#[tokio::test]
async fn a_waiter_that_died_in_the_queue_does_not_keep_the_lock() {
    let long = Duration::from_secs(300);
    for (name, m) in managers() {
        let key = format!("dead-waiter:{{{}}}", uuid::Uuid::new_v4());
        let held = m.try_acquire(&key, long).await.unwrap().unwrap();
        // A waiter queues, then vanishes without leaving the queue.
        let (m2, k2) = (m.clone(), key.clone());
        let dead = tokio::spawn(async move { m2.acquire_fair(&k2, long, far()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        dead.abort();
        let (m3, k3) = (m.clone(), key.clone());
        let deadline = Instant::now() + Duration::from_secs(15);
        let live = tokio::spawn(async move { m3.acquire_fair(&k3, long, deadline).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        m.release(&held).await.unwrap();
        let lease = live
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{name}: the live waiter never got the lock: {e}"));
        assert!(m.release(&lease).await.unwrap(), "{name}");
    }
}

/// The release gives the lock to the waiter and tells it the fencing token:
/// the waiter holds the lock without trying again, so a hand-off costs Redis
/// one script call. Counted on a private Redis, so that no other test's calls
/// mix in.
#[tokio::test]
async fn a_handed_over_lock_costs_the_waiter_no_second_try() {
    if !real_backends() {
        return;
    }
    let port = free_port();
    let _redis = crate::servers::OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let m: Arc<dyn LockManager> = Arc::new(RedisLocks::connect(&url, "h:").unwrap());
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pubsub_ready = async |conn: &mut redis::aio::MultiplexedConnection| {
        let patterns: u64 = redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query_async(conn)
            .await
            .unwrap();
        patterns > 0
    };
    while !pubsub_ready(&mut conn).await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let key = "handed:{k}";
    for round in 0..6 {
        let held = m.try_acquire(key, TTL).await.unwrap().unwrap();
        let m2 = m.clone();
        let waiter = tokio::spawn(async move { m2.acquire_fair(key, TTL, far()).await });
        loop {
            let queued: u64 = redis::AsyncCommands::zcard(&mut conn, "h:handed:{k}:queue")
                .await
                .unwrap();
            if queued == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let before = script_calls(&mut conn).await;
        assert!(m.release(&held).await.unwrap());
        let lease = waiter.await.unwrap().unwrap();
        let calls = script_calls(&mut conn).await - before;
        // Round 0 loads the scripts (EVALSHA answers NOSCRIPT, then EVAL).
        if round > 0 {
            assert_eq!(
                calls, 1,
                "round {round}: the release, and no try by the waiter"
            );
        }
        assert!(lease.fence > held.fence);
        assert!(
            m.release(&lease).await.unwrap(),
            "the waiter holds the lock"
        );
    }
}

#[tokio::test]
async fn both_strategies_serialize_one_key_without_failures() {
    for (name, m) in managers() {
        for strategy in [LockStrategy::Notify, LockStrategy::Backoff] {
            let mut settings = test_settings().lock;
            settings.strategy = strategy;
            let locks = Arc::new(Locks::new(
                m.clone(),
                settings,
                true,
                Arc::new(Metrics::default()),
            ));
            let key = LockKey::session_files(&uuid::Uuid::new_v4().to_string());
            let inside = Arc::new(Mutex::new(0));
            let mut tasks = Vec::new();
            for _ in 0..12 {
                let (locks, key, inside) = (locks.clone(), key.clone(), inside.clone());
                tasks.push(tokio::spawn(async move {
                    let g = locks.acquire(&key).await.unwrap().unwrap();
                    {
                        let mut n = inside.lock().unwrap();
                        *n += 1;
                        assert_eq!(*n, 1, "two holders at once");
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    *inside.lock().unwrap() -= 1;
                    g.release().await;
                }));
            }
            for t in tasks {
                t.await
                    .unwrap_or_else(|e| panic!("{name} {strategy:?}: {e}"));
            }
        }
    }
}

#[tokio::test]
async fn uploads_work_under_the_upload_lock_scope_and_the_backoff_strategy() {
    let mut settings = test_settings();
    settings.lock.scope = LockScope::Upload;
    settings.lock.strategy = LockStrategy::Backoff;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("seed-style").await;
    let res =
        futures::future::join_all((0..10).map(|i| app.upload_raw(&u, "x.txt", vec![i; 100]))).await;
    assert!(res.iter().all(|r| r.status() == StatusCode::CREATED));
    assert_eq!(app.list_ids(&u).await.len(), 10);
}

/// Milliseconds since the epoch, the clock both processes share.
fn epoch_ms() -> u64 {
    filedock::lock::now_micros() / 1000
}

#[tokio::test]
async fn waiters_in_two_os_processes_are_served_in_arrival_order() {
    if !real_backends() {
        eprintln!("needs Redis: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let prefix = unique_prefix();
    let key = format!("order:{{{}}}", uuid::Uuid::new_v4());
    let list = format!("{prefix}fifo-order");
    let m = redis_locks(&prefix);
    let first = m.try_acquire(&key, TTL).await.unwrap().unwrap();
    // Ten waiters arrive 40 ms apart, alternating between two processes.
    let start = epoch_ms() + 2000;
    let children: Vec<_> = [("0,2,4,6,8"), ("1,3,5,7,9")]
        .into_iter()
        .map(|slots| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["locks::fifo_child", "--exact", "--ignored", "--nocapture"])
                .env("FIFO_PREFIX", &prefix)
                .env("FIFO_KEY", &key)
                .env("FIFO_LIST", &list)
                .env("FIFO_START", start.to_string())
                .env("FIFO_SLOTS", slots)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let release_at = start + 10 * 40 + 500;
    tokio::time::sleep(Duration::from_millis(release_at.saturating_sub(epoch_ms()))).await;
    m.release(&first).await.unwrap();
    for mut child in children {
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "a waiter process failed");
    }
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let order: Vec<u32> = redis::AsyncCommands::lrange(&mut conn, &list, 0, -1)
        .await
        .unwrap();
    assert_eq!(
        order,
        (0..10).collect::<Vec<_>>(),
        "served in arrival order across processes"
    );
}

/// The waiter process of the test above (run by it, not on its own).
#[tokio::test]
#[ignore = "a helper process for waiters_in_two_os_processes_are_served_in_arrival_order"]
async fn fifo_child() {
    let var = |n: &str| std::env::var(n).unwrap();
    let (key, list) = (var("FIFO_KEY"), var("FIFO_LIST"));
    let start: u64 = var("FIFO_START").parse().unwrap();
    let m: Arc<dyn LockManager> = Arc::new(redis_locks(&var("FIFO_PREFIX")));
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut tasks = Vec::new();
    for slot in var("FIFO_SLOTS")
        .split(',')
        .map(|s| s.parse::<u64>().unwrap())
    {
        let (m, key, list, client) = (m.clone(), key.clone(), list.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(
                (start + slot * 40).saturating_sub(epoch_ms()),
            ))
            .await;
            let lease = m
                .acquire_fair(&key, TTL, Instant::now() + Duration::from_secs(30))
                .await
                .unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let _: i64 = redis::AsyncCommands::rpush(&mut conn, &list, slot)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            m.release(&lease).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
