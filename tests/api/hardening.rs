//! Hostile input, limits, graceful shutdown and secrets in logs.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

/// Sends raw bytes on a fresh connection; returns what came back (maybe nothing).
async fn raw(app: &TestApp, request: &[u8], then_close: bool) -> String {
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    if then_close {
        drop(conn);
        return String::new();
    }
    conn.shutdown().await.ok();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Waits until the server has seen the broken upload fail.
async fn seen_failing(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .metric("filedock_uploads_total", "outcome=\"invalid_request\"")
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the server never failed the upload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server has cleaned up after a broken upload.
async fn nothing_left(app: &TestApp, user: &TestUser) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.intents().await > 0 {
        assert!(Instant::now() < deadline, "an intent was left behind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        app.blob_keys(user).await.is_empty(),
        "a blob was left behind"
    );
    assert!(
        app.list_ids(user).await.is_empty(),
        "metadata was left behind"
    );
}

fn upload_head(user: &TestUser, extra: &str) -> String {
    format!(
        "POST /v1/files?filename=raw.bin HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n{extra}\r\n",
        user.key
    )
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_leaves_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("short").await;
    let mut req = upload_head(&u, "content-length: 100000\r\n").into_bytes();
    req.extend_from_slice(&[1u8; 1000]);
    raw(&app, &req, true).await; // the client goes away with 99 000 bytes missing
    seen_failing(&app).await;
    nothing_left(&app, &u).await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_leaves_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("gone").await;
    let mut req = upload_head(&u, "transfer-encoding: chunked\r\n").into_bytes();
    for _ in 0..4 {
        req.extend_from_slice(b"400\r\n");
        req.extend_from_slice(&[2u8; 1024]);
        req.extend_from_slice(b"\r\n");
    }
    raw(&app, &req, true).await; // no terminating chunk
    seen_failing(&app).await;
    nothing_left(&app, &u).await;
}

#[tokio::test]
async fn a_body_longer_than_its_content_length_stores_only_the_declared_bytes() {
    let app = spawn_app().await;
    let u = app.create_user("long").await;
    let mut req = upload_head(&u, "content-length: 10\r\nconnection: close\r\n").into_bytes();
    req.extend_from_slice(b"0123456789 and then some garbage that is not a request");
    let answer = raw(&app, &req, false).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let ids = app.list_ids(&u).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(
        app.download(&u, &ids[0])
            .await
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"0123456789"
    );
}

#[tokio::test]
async fn enormous_headers_are_refused_and_the_server_stays_up() {
    let app = spawn_app().await;
    let huge = "x".repeat(1 << 20);
    let res = app
        .client
        .get(app.url("/v1/files"))
        .header("x-huge", huge)
        .send()
        .await;
    if let Ok(res) = res {
        assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

/// A client that opens a connection and never finishes its request head
/// (slowloris) is disconnected after the header timeout; others are served
/// meanwhile.
#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let mut settings = test_settings();
    settings.header_timeout = Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let healthy = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(healthy.status(), StatusCode::OK, "others are served");
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the connection was still open after 10 s (header timeout 1 s)"
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "an unfinished request was not served"
    );
    eprintln!("closed after {:?}", started.elapsed());
}

/// A JSON body that stops arriving gets 408 after the body timeout, like an
/// upload's, instead of holding the request open.
#[tokio::test]
async fn a_json_body_that_never_arrives_gets_408() {
    let mut settings = test_settings();
    settings.body_idle_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("slow-json").await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{{\"name\":",
        u.key
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 10 s (body timeout 0.5 s)");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let timeouts = app
        .metric("filedock_http_requests_total", "status=\"408\"")
        .await;
    assert_eq!(timeouts, 1.0, "counted as a 408");
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_is_given_up_on() {
    let mut settings = test_settings();
    settings.body_idle_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("stall").await;
    use futures::StreamExt;
    let stalling = futures::stream::iter(0..2).then(|i| async move {
        if i == 1 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok::<_, std::io::Error>(vec![1u8; 1000])
    });
    let started = Instant::now();
    let res = app
        .client
        .post(app.url("/v1/files?filename=stall.bin"))
        .bearer_auth(&u.key)
        .body(reqwest::Body::wrap_stream(stalling))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::REQUEST_TIMEOUT, "request_timeout".into())
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered before the client resumed"
    );
    nothing_left(&app, &u).await;
}

#[tokio::test]
async fn json_bodies_are_small_and_uploads_are_not() {
    let app = spawn_app().await;
    let u = app.create_user("json").await;
    let name = "n".repeat(100 * 1024);
    let res = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&serde_json::json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // The JSON limit does not apply to uploads.
    let res = app.upload_raw(&u, "big.bin", vec![0u8; 1 << 20]).await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn hostile_filenames_are_refused_or_stored_safely() {
    let app = spawn_app().await;
    let u = app.create_user("names").await;
    let long = "a".repeat(1024);
    for bad in [
        long.as_str(),
        "evil\u{202E}txt.exe",
        "tab\there",
        "..",
        "a/b",
    ] {
        let res = app.upload_raw(&u, bad, b"x".to_vec()).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{bad:?}"
        );
    }
    let res = app
        .upload_raw(&u, "📄 notes – ünïcode.txt", b"x".to_vec())
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let file: Value = res.json().await.unwrap();
    let got = app.download(&u, file["id"].as_str().unwrap()).await;
    let cd = got.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cd.is_ascii() && cd.contains("; filename=\""), "{cd}");
    assert!(app.list_ids(&u).await.len() == 1 && app.intents().await == 0);
}

#[tokio::test]
async fn wrong_methods_and_bad_ids_get_the_documented_errors() {
    let app = spawn_app().await;
    let u = app.create_user("m").await;
    let res = app
        .client
        .patch(app.url("/v1/files"))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed".into())
    );
    for path in [
        "/v1/files/..%2F..%2Fetc",
        "/v1/files/%00",
        "/v1/sessions/123",
        "/v1/agents/x/mcps/y",
    ] {
        let res = app
            .client
            .get(app.url(path))
            .bearer_auth(&u.key)
            .send()
            .await
            .unwrap();
        let status = res.status();
        assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
            "{path}: {status}"
        );
        let body: Value = res.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "{path}: {body}");
    }
}

#[tokio::test]
async fn a_user_gets_a_clear_error_past_the_concurrent_upload_cap() {
    let mut settings = test_settings();
    settings.max_uploads_per_user = 2;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("busy").await;
    let slow = || {
        let chunks = futures::stream::iter(0..5).then(|_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok::<_, std::io::Error>(vec![1u8; 100])
        });
        app.client
            .post(app.url("/v1/files?filename=slow.bin"))
            .bearer_auth(&u.key)
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
    };
    use futures::StreamExt;
    let results = futures::future::join_all([slow(), slow(), slow()]).await;
    let mut statuses: Vec<u16> = results
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    statuses.sort();
    assert_eq!(statuses, [201, 201, 429]);
    let refused = results
        .into_iter()
        .map(Result::unwrap)
        .find(|r| r.status() == 429)
        .unwrap();
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(error_code(refused).await.1, "too_many_uploads");
    assert_eq!(
        app.upload_raw(&u, "after.bin", vec![1]).await.status(),
        StatusCode::CREATED,
        "slots come back"
    );
}

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
