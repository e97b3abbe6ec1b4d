//! The waiters of a lock, on the in-process manager and (with real servers)
//! on Redis: served in arrival order (across instances and OS processes),
//! woken by the release and handed the lock, and a waiter that died in the
//! queue does not keep it.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use filedock::{
    lock::{LockManager, memory::MemoryLocks, redis::RedisLocks},
    redis_link::RedisConn,
};

use crate::{
    helpers::*,
    locks::{TTL, far, managers, redis_locks, test_link, unique_prefix},
};

/// Where a manager under test keeps the waiters of a key, to see them queued.
enum Waiting {
    Memory(Arc<MemoryLocks>),
    /// The key prefix: the queue is `{prefix}{key}:queue`, a sorted set.
    Redis(String, RedisConn),
}

impl Waiting {
    async fn count(&self, key: &str) -> usize {
        match self {
            Self::Memory(m) => m.waiters(key),
            Self::Redis(prefix, conn) => {
                let queue = format!("{prefix}{key}:queue");
                let queued: usize = redis::AsyncCommands::zcard(&mut conn.clone(), queue)
                    .await
                    .unwrap();
                queued
            }
        }
    }

    /// Waits until `n` waiters are queued for `key`.
    async fn until(&self, key: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.count(key).await != n {
            assert!(
                Instant::now() < deadline,
                "{n} waiters never queued for {key}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// As [`managers`], each with where it queues its waiters.
fn managers_seen() -> Vec<(&'static str, Arc<dyn LockManager>, Waiting)> {
    let memory = Arc::new(MemoryLocks::new());
    let mut all: Vec<(&'static str, Arc<dyn LockManager>, Waiting)> =
        vec![("memory", memory.clone(), Waiting::Memory(memory))];
    if real_backends() {
        let prefix = unique_prefix();
        all.push((
            "redis",
            Arc::new(redis_locks(&prefix)),
            Waiting::Redis(prefix, test_link().conn()),
        ));
    }
    all
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
    for (name, m, waiting) in managers_seen() {
        let key = format!("handoff:{{{}}}", uuid::Uuid::new_v4());
        let mut gaps = Vec::new();
        for _ in 0..10 {
            let held = m.try_acquire(&key, TTL).await.unwrap().unwrap();
            let (m2, key2) = (m.clone(), key.clone());
            let waiter = tokio::spawn(async move {
                let lease = m2.acquire_fair(&key2, TTL, far()).await.unwrap();
                (Instant::now(), lease)
            });
            waiting.until(&key, 1).await;
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
    for (name, m, waiting) in managers_seen() {
        let key = format!("dead-waiter:{{{}}}", uuid::Uuid::new_v4());
        let held = m.try_acquire(&key, long).await.unwrap().unwrap();
        // A waiter queues, then vanishes without leaving the queue.
        let (m2, k2) = (m.clone(), key.clone());
        let dead = tokio::spawn(async move { m2.acquire_fair(&k2, long, far()).await });
        waiting.until(&key, 1).await;
        dead.abort();
        let _ = dead.await;
        let (m3, k3) = (m.clone(), key.clone());
        let deadline = Instant::now() + Duration::from_secs(15);
        let live = tokio::spawn(async move { m3.acquire_fair(&k3, long, deadline).await });
        // The dead waiter is still queued, the live one behind it.
        waiting.until(&key, 2).await;
        m.release(&held).await.unwrap();
        let lease = live
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{name}: the live waiter never got the lock: {e}"));
        assert!(m.release(&lease).await.unwrap(), "{name}");
    }
}

/// Every key a lock leaves in Redis expires, the waiters' arrival counter
/// among them: one left for ever per lock ever waited for (a resumable
/// upload's among them) would grow with history.
#[tokio::test]
async fn a_lock_that_was_waited_for_leaves_no_key_that_never_expires() {
    if !real_backends() {
        return;
    }
    let prefix = unique_prefix();
    let m: Arc<dyn LockManager> = Arc::new(redis_locks(&prefix));
    let waiting = Waiting::Redis(prefix.clone(), test_link().conn());
    let key = format!("waited:{{{}}}", uuid::Uuid::new_v4());
    let held = m.try_acquire(&key, TTL).await.unwrap().unwrap();
    let (m2, k2) = (m.clone(), key.clone());
    let waiter = tokio::spawn(async move { m2.acquire_fair(&k2, TTL, far()).await });
    waiting.until(&key, 1).await;
    assert!(m.release(&held).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    assert!(lease.fence > held.fence);
    assert!(m.release(&lease).await.unwrap());
    let mut conn = test_link().conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k.ends_with(":seq")),
        "the wait counted its arrival: {keys:?}"
    );
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} does not expire (PTTL {ttl})");
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
    let _redis = crate::support::servers::OwnRedis::start(port).await;
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
    // Ten waiters arrive one after another, alternating between two
    // processes (each waits until those before it are queued).
    let children: Vec<_> = [("0,2,4,6,8"), ("1,3,5,7,9")]
        .into_iter()
        .map(|slots| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "lock_waiters::fifo_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .env("FIFO_PREFIX", &prefix)
                .env("FIFO_KEY", &key)
                .env("FIFO_LIST", &list)
                .env("FIFO_SLOTS", slots)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    Waiting::Redis(prefix.clone(), test_link().conn())
        .until(&key, 10)
        .await;
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
    let prefix = var("FIFO_PREFIX");
    let m: Arc<dyn LockManager> = Arc::new(redis_locks(&prefix));
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut tasks = Vec::new();
    for slot in var("FIFO_SLOTS")
        .split(',')
        .map(|s| s.parse::<u64>().unwrap())
    {
        let (m, key, list, client) = (m.clone(), key.clone(), list.clone(), client.clone());
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            // Arrives once the waiters before it are queued (whichever
            // process they are in): the order is the slots', however
            // slowly these processes started.
            let queue = format!("{prefix}{key}:queue");
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let queued: u64 = redis::AsyncCommands::zcard(&mut conn, &queue)
                    .await
                    .unwrap();
                if queued == slot {
                    break;
                }
                assert!(Instant::now() < deadline, "waiter {slot}: {queued} queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
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
