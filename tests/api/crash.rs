//! Crash trials: uploads killed at every phase and at random moments; after
//! a restart and one sweep, the bucket and the metadata agree exactly.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use filedock::{domain::users, http::AppState};
use futures::{StreamExt, future::join_all};
use reqwest::StatusCode;
use serde_json::Value;
use sha2::Digest;

use crate::{helpers::*, real::generated_body};

const PHASES: [&str; 4] = [
    "after_intent",
    "after_blob",
    "before_commit",
    "after_commit",
];

/// A small deterministic generator; the seed is printed so a failure replays.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// An upload the server answered 201: its file id and the SHA-256 sent.
type Acknowledged = Arc<Mutex<Vec<(String, String)>>>;

/// Sends three uploads (one multipart) at once, each in a task of its own,
/// and records every 201 in `acked` the moment it arrives, so that what was
/// acknowledged before a crash is known however the crash cuts the rest.
fn fire_uploads(base: &str, key: &str, acked: &Acknowledged) -> Vec<tokio::task::JoinHandle<()>> {
    let (big, big_sha) = generated_body(7 << 20, None); // multipart with 5 MiB parts
    let small = vec![1u8; 1024];
    let other = vec![2u8; 4096];
    let bodies = [
        (
            "small.txt",
            reqwest::Body::from(small.clone()),
            sha256_hex(&small),
        ),
        ("big.bin", big, big_sha),
        (
            "other.txt",
            reqwest::Body::from(other.clone()),
            sha256_hex(&other),
        ),
    ];
    bodies
        .into_iter()
        .map(|(name, body, sha)| {
            let req = reqwest::Client::new()
                .post(format!("{base}/v1/files?filename={name}"))
                .bearer_auth(key)
                .body(body)
                .timeout(Duration::from_secs(20));
            let acked = acked.clone();
            tokio::spawn(async move {
                let Ok(res) = req.send().await else { return };
                if res.status() != StatusCode::CREATED {
                    return;
                }
                if let Ok(v) = res.json::<Value>().await {
                    let id = v["id"].as_str().unwrap().to_owned();
                    acked.lock().unwrap().push((id, sha));
                }
            })
        })
        .collect()
}

/// Waits (up to 30 s) until two listings of the bucket's objects, a
/// second apart, are the same.
async fn settle_bucket(state: &AppState) {
    let list = || async { state.ports.blobs.list_keys("").await.unwrap() };
    let mut last = list().await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = list().await;
        if now == last {
            return;
        }
        last = now;
    }
    panic!("the bucket kept changing for 30 s after the last process died");
}

#[tokio::test]
async fn uploads_killed_at_any_moment_leave_nothing_behind_after_a_sweep() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let settings = test_settings();
    let (user, key) = {
        let state = AppState::build(settings.clone()).await.unwrap();
        let (user, key) = users::create_user(state.ports.meta.as_ref(), "victim")
            .await
            .unwrap();
        (user, key.secret)
    };
    let acked: Acknowledged = Arc::default();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash trial seed {seed}");
    let mut rng = Lcg(seed);
    // A crashed holder's lock lives until its TTL: keep it short so the next
    // trial is not blocked for the default 5 minutes.
    let common = [
        ("FILEDOCK_S3_PART_SIZE", "5242880"),
        ("FILEDOCK_LOCK_TTL_SECS", "2"),
    ];
    for trial in 0..24 {
        if trial < PHASES.len() * 2 {
            // The process aborts itself at this phase of the first upload to reach it.
            let crash = [
                ("FILEDOCK_TEST_CRASH_AT", PHASES[trial % PHASES.len()]),
                common[0],
                common[1],
            ];
            let mut server = spawn_binary(&settings, &crash).await;
            let uploads = join_all(fire_uploads(&server.base, &key, &acked));
            let _ = tokio::time::timeout(Duration::from_secs(20), uploads).await;
            let deadline = Instant::now() + Duration::from_secs(10);
            while server.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                server.child.try_wait().unwrap().is_some(),
                "trial {trial}: crash point not reached"
            );
        } else {
            // SIGKILL at a random moment of the uploads: from their start,
            // or (every other trial) from the first 201, so that some
            // uploads are acknowledged before a kill however slow the
            // machine is (each kill could otherwise come before any 201).
            let server = spawn_binary(&settings, &common).await;
            let delay = Duration::from_millis(rng.below(3000));
            let before = acked.lock().unwrap().len();
            let uploads = fire_uploads(&server.base, &key, &acked);
            if trial % 2 == 1 {
                let deadline = Instant::now() + Duration::from_secs(20);
                while acked.lock().unwrap().len() == before && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            tokio::time::sleep(delay).await;
            drop(server); // SIGKILL
            join_all(uploads).await; // the rest have lost their connection
        }
    }

    // A killed process's last S3 requests may still be carried out after
    // it died (the server has their bodies): an object can appear after a
    // sweep that took its intent, which a real grace period (minutes) rules
    // out and a grace of 0 does not. Wait until the bucket is still.
    let state = AppState::build(settings.clone()).await.unwrap();
    settle_bucket(&state).await;

    // Restart, then one sweep (cron style) that treats every intent as stale.
    let sweep = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .arg("sweep")
        .envs(binary_env(&settings))
        .env("FILEDOCK_SWEEP_INTENT_GRACE_SECS", "0")
        .output()
        .unwrap();
    assert!(
        sweep.status.success(),
        "sweep failed: {}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    let report: Value = serde_json::from_slice(&sweep.stdout).unwrap();
    eprintln!("sweep after the crash trials: {report}");
    assert_eq!(report["outcome"], "swept");
    assert!(
        report["intents_abandoned"].as_u64().unwrap() > 0,
        "the trials left no abandoned upload to clean"
    );

    let files = assert_bucket_matches_metadata(&state).await;
    assert!(files > 0, "some uploads committed");
    // Every upload answered 201 before its process died is there, whole.
    let acked = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty(),
        "no upload was acknowledged before a crash"
    );
    for (id, sha) in &acked {
        let id = filedock::vocab::FileId::parse(id).expect("a file id");
        let file = state.ports.meta.file(&user.id, &id).await.unwrap();
        let file = file.unwrap_or_else(|| panic!("{id} was answered 201, then lost to a crash"));
        let mut stream = state.ports.blobs.get(&file.key, None).await.unwrap();
        let mut hasher = sha2::Sha256::new();
        while let Some(chunk) = stream.next().await {
            hasher.update(chunk.unwrap());
        }
        assert_eq!(&hex::encode(hasher.finalize()), sha, "{id}'s bytes changed");
    }
    eprintln!(
        "{files} committed files, every one with its object, no strays; all {} answered 201 kept",
        acked.len()
    );
}
