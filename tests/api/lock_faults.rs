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
    let mut redis = crate::support::servers::OwnRedis::start(port).await;
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
                redis = crate::support::servers::OwnRedis::start(port).await;
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

/// A streamed upload (no length: the large category) whose body the test
/// feeds by hand: the first chunk now, the rest when `rest` is sent.
fn held_upload(
    base: &str,
    key: &str,
) -> (
    tokio::sync::mpsc::Sender<bytes::Bytes>,
    tokio::task::JoinHandle<(StatusCode, String)>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok::<_, std::io::Error>(c), rx))
    });
    let req = reqwest::Client::new()
        .post(format!("{base}/v1/files?filename=stalled.bin"))
        .bearer_auth(key)
        .body(reqwest::Body::wrap_stream(body));
    let answer = tokio::spawn(async move {
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        (
            status,
            body["error"]["code"].as_str().unwrap_or("").to_owned(),
        )
    });
    (tx, answer)
}

fn signal(server: &Server, sig: i32) {
    unsafe { libc::kill(server.child.id() as i32, sig) };
}

/// A process paused (SIGSTOP) while it holds an upload's lock, past the
/// lease, while another instance takes the lock and commits: when it wakes,
/// its upload is refused with 409 `lock_lost` and nothing of it applies.
#[tokio::test]
async fn an_upload_paused_past_its_lease_is_refused_with_lock_lost() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    const LEASE: Duration = Duration::from_secs(1);
    let settings = test_settings();
    let lease = LEASE.as_secs().to_string();
    let env = [
        ("FILEDOCK_LOCK_SCOPE", "upload"),
        ("FILEDOCK_LOCK_TTL_SECS", lease.as_str()),
    ];
    let paused = spawn_binary(&settings, &env).await;
    let other = spawn_binary(&settings, &env).await;
    let key = create_user_at(&paused.base, ADMIN_KEY, "sleeper").await;
    let state = filedock::http::AppState::build(settings.clone())
        .await
        .unwrap();
    let user = state
        .ports
        .meta
        .key_by_hash(&filedock::domain::users::hash_key(&key))
        .await
        .unwrap()
        .unwrap()
        .1;

    let (rest, answer) = held_upload(&paused.base, &key);
    rest.send(bytes::Bytes::from(vec![1u8; 64 << 10]))
        .await
        .unwrap();
    // It holds the large category's lock (scope = upload) while it streams.
    let lock = format!(
        "{}{}",
        settings.redis_prefix,
        LockKey::user_upload(&user.id, "large").as_str()
    );
    let mut redis = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis::AsyncCommands::exists::<_, bool>(&mut redis, &lock)
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "the upload never took its lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&paused, libc::SIGSTOP);
    tokio::time::sleep(LEASE * 3).await;
    // Its lease ran out: the other instance's upload takes the lock and commits.
    let body = futures::stream::iter([Ok::<_, std::io::Error>(vec![2u8; 1024])]);
    let res = reqwest::Client::new()
        .post(format!("{}/v1/files?filename=fresh.bin", other.base))
        .bearer_auth(&key)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::CREATED,
        "the lock was free for the next holder"
    );
    let fresh: serde_json::Value = res.json().await.unwrap();

    signal(&paused, libc::SIGCONT);
    let _ = rest.send(bytes::Bytes::from(vec![1u8; 64 << 10])).await;
    drop(rest);
    assert_eq!(
        answer.await.unwrap(),
        (StatusCode::CONFLICT, "lock_lost".to_owned()),
        "the stale holder's upload"
    );
    let files = state
        .ports
        .meta
        .list_files(&user.id, None, 10)
        .await
        .unwrap();
    let ids: Vec<String> = files.iter().map(|f| f.id.to_string()).collect();
    assert_eq!(
        ids,
        [fresh["id"].as_str().unwrap()],
        "only the other upload applied"
    );
}

/// A process paused (SIGSTOP) while an upload streams, past the sweeper's
/// grace, while a sweep runs: its intent is taken for abandoned and its blob
/// deleted, so when it wakes its upload is refused with 409
/// `upload_expired`, and nothing of it is left.
#[tokio::test]
async fn an_upload_paused_past_the_grace_is_refused_with_upload_expired() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    const GRACE: Duration = Duration::from_secs(2);
    let mut settings = test_settings();
    let grace = GRACE.as_secs().to_string();
    let paused = spawn_binary(
        &settings,
        &[("FILEDOCK_SWEEP_INTENT_GRACE_SECS", grace.as_str())],
    )
    .await;
    let key = create_user_at(&paused.base, ADMIN_KEY, "sleeper").await;
    settings.sweep.intent_grace = GRACE;
    settings.sweep.retry_interval = Duration::ZERO;
    let state = filedock::http::AppState::build(settings).await.unwrap();
    let far = || filedock::meta::now() + chrono::Duration::days(1);

    let (rest, answer) = held_upload(&paused.base, &key);
    rest.send(bytes::Bytes::from(vec![1u8; 64 << 10]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while state
        .ports
        .meta
        .intents(far(), 10)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the upload never wrote its intent"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&paused, libc::SIGSTOP);
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
    let report = state.sweeper.try_run_once().await.unwrap();
    eprintln!("sweep while paused: {report:?}");
    assert!(
        state
            .ports
            .meta
            .intents(far(), 10)
            .await
            .unwrap()
            .is_empty(),
        "the paused upload's intent was not taken"
    );

    signal(&paused, libc::SIGCONT);
    let _ = rest.send(bytes::Bytes::from(vec![1u8; 64 << 10])).await;
    drop(rest);
    assert_eq!(
        answer.await.unwrap(),
        (StatusCode::CONFLICT, "upload_expired".to_owned()),
        "the swept upload"
    );
    state.sweeper.try_run_once().await.unwrap();
    assert_eq!(
        assert_bucket_matches_metadata(&state).await,
        0,
        "nothing of it is left"
    );
}

/// A release that fails (the link to Redis cut at that moment, as when a
/// master dies) is tried again once Redis answers: the key is free within
/// seconds, not barred for what is left of its five-minute lease.
#[tokio::test]
async fn a_release_that_failed_is_tried_again_and_frees_the_key() {
    use crate::support::fault_proxy::FaultProxy;
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let port = free_port();
    let _redis = crate::support::servers::OwnRedis::start(port).await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into()).await;
    let mut settings = test_settings();
    settings.redis_url = Some(format!("redis://{}/", proxy.addr()).into());
    settings.lock.ttl = Duration::from_secs(300);
    let app = spawn_app_with(settings).await;
    let key = LockKey::sweeper();
    let locks = &app.state.ports.locks;
    let held = locks.acquire(&key).await.unwrap().unwrap();
    // The release's script never reaches Redis, and the link stays cut 2 s.
    proxy.cut_instead_of(b"EVALSHA", Duration::from_secs(2));
    held.release().await;
    assert!(proxy.triggered(), "the release was not cut");
    let direct = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut direct = direct.get_multiplexed_async_connection().await.unwrap();
    let lock = format!("{}{}", app.state.settings.redis_prefix, key.as_str());
    let held_on: bool = redis::AsyncCommands::exists(&mut direct, &lock)
        .await
        .unwrap();
    assert!(held_on, "the first release applied: nothing to try again");
    let started = Instant::now();
    loop {
        // Not released yet: the link is cut; then retried within seconds.
        let free = locks.try_acquire(&key).await.unwrap();
        if let filedock::lock::TryLock::Held(g) = free {
            g.release().await;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the key is still held {:?} after its release",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
