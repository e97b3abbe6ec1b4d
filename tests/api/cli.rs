//! The command-line client (`filedock upload|ls|get|rm`) against a running
//! server: what it prints, what it stores, and its exit codes.

use std::process::Output;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// Runs `filedock ARGS` as the client of the server at `base` with `key`
/// (asynchronously: the server runs on this test's runtime).
async fn client_at(base: &str, key: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .args(args)
        .env("FILEDOCK_URL", base)
        .env("FILEDOCK_API_KEY", key)
        .output()
        .await
        .unwrap()
}

async fn client(app: &TestApp, key: &str, args: &[&str]) -> Output {
    client_at(&app.base, key, args).await
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn upload_list_get_and_remove_from_the_command_line() {
    let app = spawn_app().await;
    let u = app.create_user("cli").await;
    let dir = tempdir();
    let paths: Vec<_> = (0..3u64)
        .map(|i| {
            let path = dir.join(format!("f{i}.bin"));
            std::fs::write(&path, pseudo_random_bytes(100_000 * (i as usize + 1), i)).unwrap();
            path
        })
        .collect();
    let (_, session) = app.json("POST", "/v1/sessions", &u, None).await;
    let session = session["id"].as_str().unwrap();

    let mut args = vec!["upload", "--json", "--parallel", "2", "--session", session];
    args.extend(paths.iter().map(|p| p.to_str().unwrap()));
    let out = client(&app, &u.key, &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uploaded = json_lines(&out);
    assert_eq!(uploaded.len(), 3);
    let ids: Vec<&str> = uploaded.iter().map(|f| f["id"].as_str().unwrap()).collect();
    let (_, s) = app
        .json("GET", format!("/v1/sessions/{session}"), &u, None)
        .await;
    assert_eq!(
        s["file_ids"].as_array().unwrap().len(),
        3,
        "attached to the session"
    );

    let out = client(&app, &u.key, &["ls", "--json"]).await;
    assert!(out.status.success());
    assert_eq!(json_lines(&out)[0].as_array().unwrap().len(), 3);

    let target = dir.join("copy.bin");
    let out = client(
        &app,
        &u.key,
        &["get", ids[2], "-o", target.to_str().unwrap()],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(&paths[2]).unwrap()
    );

    let out = client(&app, &u.key, &["rm", ids[0]]).await;
    assert!(out.status.success());
    assert_eq!(app.list_ids(&u).await.len(), 2);
    assert_eq!(
        app.download(&u, ids[0]).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_exit_code_tells_a_refusal_from_an_unreachable_server() {
    let app = spawn_app().await;
    let u = app.create_user("cli-errors").await;
    let out = client(
        &app,
        &u.key,
        &["get", "01900000-0000-7000-8000-000000000000"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "the server refused: not found");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = client(&app, "wrong-key", &["ls"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing or invalid API key"));
    let out = client(&app, &u.key, &["upload", "/nonexistent/file"]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "a local file that cannot be read"
    );
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let out = client_at(&nowhere, &u.key, &["ls"]).await;
    assert_eq!(out.status.code(), Some(3), "nothing listens there");
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("filedock-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A large upload goes through the resumable endpoint: its connection cut
/// mid-way, the client asks the server where it stands and sends the rest;
/// the stored file is byte for byte the local one.
#[tokio::test]
async fn a_large_upload_cut_mid_way_resumes_to_an_identical_file() {
    const LEN: usize = 64 << 20;
    /// Bytes the proxy cuts after; planted at a few offsets, so that one of
    /// them arrives whole within a chunk.
    const MARKER: &[u8] = b"\xfe\xedCUT-HERE\xfa\xce";
    let app = spawn_app().await;
    let u = app.create_user("resume").await;
    let upstream = app.base.trim_start_matches("http://").parse().unwrap();
    let proxy = crate::support::fault_proxy::FaultProxy::start(upstream).await;
    let mut bytes = pseudo_random_bytes(LEN, 11);
    for at in [4 << 20, 5 << 20, 6 << 20] {
        bytes[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    let dir = tempdir();
    let path = dir.join("big.bin");
    std::fs::write(&path, &bytes).unwrap();

    proxy.cut_after(MARKER, std::time::Duration::from_secs(1));
    proxy.watch(b"upload-offset: ");
    let base = format!("http://{}", proxy.addr());
    let out = client_at(&base, &u.key, &["upload", "--json", path.to_str().unwrap()]).await;
    assert!(proxy.triggered(), "the connection was never cut");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It resumed: one upload created, and after the cut a PATCH from the
    // offset the server kept, not from 0 again.
    let offsets: Vec<u64> = proxy.watched().iter().map(|o| o.parse().unwrap()).collect();
    assert!(
        offsets.len() >= 2 && offsets[0] == 0,
        "PATCH offsets {offsets:?}"
    );
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[1] > 0,
        "the client started over instead of resuming: PATCH offsets {offsets:?}"
    );
    let created = app
        .metric(
            "filedock_http_requests_total",
            "method=\"POST\",route=\"/v1/uploads\"",
        )
        .await;
    assert_eq!(created, 1.0, "the client created a second upload");
    let id = json_lines(&out)[0]["id"].as_str().unwrap().to_owned();
    let stored = app.download(&u, &id).await.bytes().await.unwrap();
    assert!(
        stored.len() == LEN && stored[..] == bytes[..],
        "the stored file differs"
    );
    assert_eq!(app.list_ids(&u).await, [id], "one file, no leftover");
}

/// A large upload whose final PATCH committed but whose answer was lost
/// (the proxy cuts as the answer starts): the client asks `HEAD`, which
/// says the upload is complete (issue 20, item 3), and it finishes with the
/// one file and its `--session` attach, instead of failing "not found".
#[tokio::test]
async fn a_large_upload_whose_final_answer_was_lost_finishes_and_attaches() {
    const LEN: usize = 17 << 20;
    const MARKER: &[u8] = b"\xfe\xedLAST-PATCH\xfa\xce";
    let app = spawn_app().await;
    let u = app.create_user("lost-final").await;
    let (_, session) = app.json("POST", "/v1/sessions", &u, None).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let upstream = app.base.trim_start_matches("http://").parse().unwrap();
    let proxy = crate::support::fault_proxy::FaultProxy::start(upstream).await;
    let mut bytes = pseudo_random_bytes(LEN, 12);
    bytes[LEN - 100..LEN - 100 + MARKER.len()].copy_from_slice(MARKER);
    let dir = tempdir();
    let path = dir.join("big.bin");
    std::fs::write(&path, &bytes).unwrap();

    // One PATCH carries the whole file: the cut comes after its commit.
    proxy.cut_after(MARKER, std::time::Duration::from_millis(500));
    let base = format!("http://{}", proxy.addr());
    let args = [
        "upload",
        "--json",
        "--session",
        &session,
        path.to_str().unwrap(),
    ];
    let out = client_at(&base, &u.key, &args).await;
    assert!(proxy.triggered(), "the answer was never cut");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = json_lines(&out)[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.list_ids(&u).await,
        vec![id.clone()],
        "one file, not two"
    );
    let (_, got) = app
        .json("GET", format!("/v1/sessions/{session}"), &u, None)
        .await;
    assert_eq!(got["file_ids"], serde_json::json!([id]), "attached");
    let stored = app.download(&u, &id).await.bytes().await.unwrap();
    assert!(stored[..] == bytes[..], "the stored file differs");
    std::fs::remove_dir_all(dir).unwrap();
}
