//! The process itself: graceful shutdown on SIGTERM, and secrets that never
//! reach its logs.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn sigterm_refuses_new_requests_lets_in_flight_ones_finish_and_leaves_nothing_behind() {
    let settings = test_settings();
    let mut server = spawn_binary(&settings, &[("FILEDOCK_SHUTDOWN_GRACE_SECS", "3")]).await;
    let client = reqwest::Client::new();
    let key = create_user_at(&server.base, ADMIN_KEY, "shutdown").await;
    // One upload that finishes within the grace period, one that does not.
    let upload = |chunks: usize| {
        use futures::StreamExt;
        let body = futures::stream::iter(0..chunks).then(|_| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, std::io::Error>(vec![5u8; 1000])
        });
        client
            .post(format!("{}/v1/files?filename=inflight.bin", server.base))
            .bearer_auth(&key)
            .body(reqwest::Body::wrap_stream(body))
            .send()
    };
    let (quick, slow) = (upload(5), upload(50));
    let stop = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sigterm(server.child.id());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fresh = reqwest::Client::new()
            .get(format!("{}/healthz", server.base))
            .send()
            .await;
        assert!(
            fresh.is_err(),
            "a new connection was accepted after SIGTERM"
        );
    };
    let started = Instant::now();
    let (quick, slow, ()) = tokio::join!(quick, slow, stop);
    assert_eq!(
        quick.unwrap().status(),
        StatusCode::CREATED,
        "the in-flight upload finished"
    );
    assert!(
        slow.is_err() || !slow.unwrap().status().is_success(),
        "cut at the grace period"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );

    // After one sweep, the cut upload has left nothing.
    let mut settings = settings;
    settings.sweep.intent_grace = Duration::ZERO;
    let state = filedock::http::AppState::build(settings).await.unwrap();
    let report = state.sweeper.try_run_once().await.unwrap();
    eprintln!("sweep after shutdown: {report:?}");
    let files = assert_bucket_matches_metadata(&state).await;
    assert_eq!(files, 1, "the finished upload is kept");
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    let settings = test_settings();
    let log = settings.data_dir.join("filedock.log");
    std::fs::create_dir_all(&settings.data_dir).unwrap();
    let admin = format!("adm_{}", uuid::Uuid::new_v4().simple());
    let link_secret = format!("lnk_{}", uuid::Uuid::new_v4().simple());
    let port = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .envs(binary_env(&settings))
        .env("FILEDOCK_ADMIN_KEY", &admin)
        .env("FILEDOCK_LINK_SECRET", &link_secret)
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = create_user_at(&base, &admin, "secretive").await;
    let up = client
        .post(format!("{base}/v1/files?filename=s.txt"))
        .bearer_auth(&key)
        .body("secret stuff")
        .send()
        .await;
    let file: Value = up.unwrap().json().await.unwrap();
    let _ = client
        .get(format!(
            "{base}/v1/files/{}/content",
            file["id"].as_str().unwrap()
        ))
        .bearer_auth(&key)
        .send()
        .await;
    // A signed link is a credential too, until it expires.
    let link: Value = client
        .post(format!(
            "{base}/v1/files/{}/links",
            file["id"].as_str().unwrap()
        ))
        .bearer_auth(&key)
        .json(&serde_json::json!({"expires_in": 60}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = link["url"].as_str().unwrap().to_owned();
    let got = client.get(&url).send().await.unwrap();
    assert_eq!(got.status(), reqwest::StatusCode::OK, "the link works");
    let signature = url.rsplit("signature=").next().unwrap().to_owned();
    let _ = client
        .get(format!("{base}/v1/files"))
        .bearer_auth(format!("{key}x"))
        .send()
        .await;
    let _ = client
        .post(format!("{base}/v1/admin/users"))
        .bearer_auth(format!("{admin}x"))
        .send()
        .await;
    let _ = client.get(format!("{base}/metrics")).send().await;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().count() > 5,
        "debug logging produced too little to judge:\n{text}"
    );
    let mut secrets = vec![admin.clone(), key.clone(), link_secret, signature];
    if real_backends() {
        secrets.push(std::env::var("FILEDOCK_TEST_S3_SECRET_KEY").unwrap());
    }
    for secret in secrets {
        assert!(!text.contains(&secret), "a secret appears in the logs");
    }
}

/// A handler that panics (a bug) is answered `500 internal` in the
/// documented shape, with its request id and no internals, and counted;
/// the process serves on, and what the request left (its blob and intent)
/// is the sweeper's like any dead upload's.
#[tokio::test]
async fn a_panicking_request_is_answered_500_counted_and_the_process_serves_on() {
    let settings = test_settings();
    let crash = [("FILEDOCK_TEST_CRASH_AT", "panic:after_blob")];
    let server = spawn_binary(&settings, &crash).await;
    let client = reqwest::Client::new();
    let key = create_user_at(&server.base, ADMIN_KEY, "buggy").await;
    for _ in 0..2 {
        let res = client
            .post(format!("{}/v1/files?filename=p.bin", server.base))
            .bearer_auth(&key)
            .body(vec![7u8; 4096])
            .send()
            .await
            .expect("an answer, not a dropped connection");
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let request_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], "internal", "{body}");
        assert_eq!(body["error"]["request_id"], request_id.as_str());
        assert!(
            !body.to_string().contains("panic"),
            "the answer leaks the panic: {body}"
        );
    }
    let panics = metric_at(&server.base, "filedock_http_panics_total", "").await;
    assert_eq!(panics, 2.0, "each panic counted");
    let answered = metric_at(
        &server.base,
        "filedock_http_requests_total",
        "status=\"500\"",
    )
    .await;
    assert_eq!(answered, 2.0, "and counted as a 500");
    let listed: Value = client
        .get(format!("{}/v1/files", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["files"],
        serde_json::json!([]),
        "the process serves on; nothing committed"
    );
    drop(server); // the embedded store has one process at a time

    // The panics left their blobs and intents: one sweep takes them.
    let mut settings = settings;
    settings.sweep.intent_grace = Duration::ZERO;
    settings.sweep.retry_interval = Duration::ZERO;
    let state = filedock::http::AppState::build(settings).await.unwrap();
    state.sweeper.try_run_once().await.unwrap();
    assert_eq!(assert_bucket_matches_metadata(&state).await, 0);
}

/// A `FILEDOCK_*` variable that is no setting is named at start-up with the
/// setting it meant: production refuses to start (a typo there would run
/// with that setting at its default without a word), development starts
/// and warns. Neither prints the variable's value (it may be a secret).
#[tokio::test]
async fn a_mistyped_setting_stops_production_and_is_warned_of_in_development() {
    let settings = test_settings();
    std::fs::create_dir_all(&settings.data_dir).unwrap();
    let secret = format!("adm_{}", uuid::Uuid::new_v4().simple());
    let typos = [
        ("FILEDOCK_REDIS_MOD", "cluster"),
        ("FILEDOCK_ADMIN_KY", secret.as_str()),
    ];
    let named = |out: &str| {
        for (typo, meant) in [
            ("FILEDOCK_REDIS_MOD", "FILEDOCK_REDIS_MODE"),
            ("FILEDOCK_ADMIN_KY", "FILEDOCK_ADMIN_KEY"),
        ] {
            assert!(
                out.contains(&format!("{typo} is not a setting; did you mean {meant}?")),
                "{typo} not named with {meant}: {out}"
            );
        }
        assert!(!out.contains(&secret), "a value was printed: {out}");
    };
    let start = |env: &str, log: &std::path::Path, port: u16| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"));
        command
            .envs(binary_env(&settings))
            .envs(typos)
            .env("FILEDOCK_ENV", env)
            .env("FILEDOCK_ALLOW_EMBEDDED", "true")
            .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::options().append(true).open(log).unwrap());
        command.spawn().unwrap()
    };

    let log = settings.data_dir.join("production.log");
    let port = free_port();
    let mut child = start("production", &log, port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("production started with variables that are no setting");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "production exited {status}");
    named(&std::fs::read_to_string(&log).unwrap());

    let log = settings.data_dir.join("development.log");
    let port = free_port();
    let child = start("development", &log, port);
    let server = Server::wait_until_up(child, port, 200, Duration::from_millis(50)).await;
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    drop(server);
    named(&std::fs::read_to_string(&log).unwrap());
}
