//! Lock semantics, on the in-process manager and (with real servers) on Redis.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::Utc;

use filedock::{
    config::{LockScope, LockStrategy, RedisMode},
    lock::{Lease, LockKey, LockManager, Locks, memory::MemoryLocks, redis::RedisLocks},
    meta::{CommitUpload, Fence, FileRecord, MetaError},
    metrics::Metrics,
    redis_link::RedisLink,
};

use reqwest::StatusCode;

use crate::helpers::*;

pub(crate) const TTL: Duration = Duration::from_secs(30);

/// One manager per backend under test: in-process always, Redis with real servers.
pub(crate) fn managers() -> Vec<(&'static str, Arc<dyn LockManager>)> {
    let mut all: Vec<(&'static str, Arc<dyn LockManager>)> =
        vec![("memory", Arc::new(MemoryLocks::new()))];
    if real_backends() {
        all.push(("redis", Arc::new(redis_locks(&unique_prefix()))));
    }
    all
}

pub(crate) fn unique_prefix() -> String {
    format!("lt{}:", uuid::Uuid::new_v4().simple())
}

/// A link to the test Redis, in its mode (scripts/test.sh runs the lock
/// tests again on a Redis Cluster).
pub(crate) fn test_link() -> RedisLink {
    let url = std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap();
    let mode = std::env::var("FILEDOCK_TEST_REDIS_MODE").map_or(RedisMode::Single, |m| {
        m.parse().expect("single, cluster or sentinel")
    });
    match mode {
        RedisMode::Sentinel => {
            let master = std::env::var("FILEDOCK_TEST_REDIS_SENTINEL_MASTER").unwrap();
            RedisLink::connect_sentinel(&url, &master).unwrap()
        }
        mode => RedisLink::connect(&url, mode).unwrap(),
    }
}

pub(crate) fn redis_locks(prefix: &str) -> RedisLocks {
    RedisLocks::on(&test_link(), prefix)
}

pub(crate) fn far() -> Instant {
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
        resumable: false,
        state: None,
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
