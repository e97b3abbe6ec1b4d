//! Locks when things go wrong around them: a wait that runs out is
//! contention (429), and fencing tokens survive Redis losing its keys.

use std::time::{Duration, Instant};

use filedock::lock::{LockKey, LockManager, redis::RedisLocks};
use reqwest::StatusCode;

use crate::helpers::*;

const TTL: Duration = Duration::from_secs(30);

fn unique_prefix() -> String {
    format!("lt{}:", uuid::Uuid::new_v4().simple())
}

/// A lock wait that runs out is contention, which the client retries: 429
/// with `Retry-After`, not a 503 that a load balancer counts as an outage.
#[tokio::test]
async fn a_lock_wait_that_runs_out_is_answered_429_and_stores_nothing() {
    let mut settings = test_settings();
    settings.lock.wait_timeout = Duration::from_millis(300);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("waiter").await;
    let user = filedock::domain::UserId::parse(&u.id).unwrap();
    let held = app
        .state
        .ports
        .locks
        .acquire(&LockKey::user_commit(&user))
        .await
        .unwrap();
    let res = app.upload_raw(&u, "w.txt", b"wait".to_vec()).await;
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into())
    );
    held.release().await;
    assert!(
        app.blob_keys(&u).await.is_empty(),
        "a refused upload left its blob"
    );
    assert_eq!(app.intents().await, 0, "a refused upload left its intent");
}

/// Fencing tokens never go back, even when Redis loses every key (FLUSHALL,
/// or a restart without persistence): a commit under a new lock is never
/// refused as stale, and one under a lock from before is.
#[tokio::test]
async fn fencing_tokens_stay_monotonic_across_a_flushall_and_a_restart() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let port = free_port();
    let mut redis = crate::servers::OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let m = RedisLocks::connect(&url, &unique_prefix()).unwrap();
    let mut last = 0;
    for step in ["first", "after FLUSHALL", "after a restart"] {
        match step {
            "after FLUSHALL" => {
                let mut conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            }
            "after a restart" => {
                redis.stop();
                redis = crate::servers::OwnRedis::start(port).await;
            }
            _ => {}
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let lease = loop {
            match m.try_acquire("k:{fence}", TTL).await {
                Ok(Some(l)) => break l,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!("{step}: no lease: {other:?}"),
            }
        };
        assert!(
            lease.fence > last,
            "{step}: token {} after {last}",
            lease.fence
        );
        last = lease.fence;
        m.release(&lease).await.unwrap();
    }
}
