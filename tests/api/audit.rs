//! The audit trail (issue 25): every key created or revoked and token
//! minted is logged under `filedock::audit` with its actor and request id,
//! and no log line carries a secret.

use std::process::{Command, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use filedock::testing::create_user_json;

/// A `filedock` binary on fresh backends whose log (stderr, JSON lines at
/// `info`) goes to the file it returns.
async fn spawn_logging_binary() -> (Server, std::path::PathBuf) {
    let settings = test_settings();
    std::fs::create_dir_all(&settings.data_dir).unwrap();
    let log = settings.data_dir.join("filedock.log");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_filedock"))
        .envs(binary_env(&settings))
        .env("RUST_LOG", "info")
        .env("FILEDOCK_LOG_FORMAT", "json")
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server =
        Server::wait_until_up(child, port, 200, std::time::Duration::from_millis(50)).await;
    (server, log)
}

/// `method path` with `key` and an optional JSON body: the status, the
/// request id and the JSON answer.
async fn call(
    base: &str,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, String, Value) {
    let mut req = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    (status, id, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_account_change_is_logged_with_its_actor_and_request_id_and_no_secret() {
    let (server, log) = spawn_logging_binary().await;
    let base = server.base.as_str();
    let created = create_user_json(&reqwest::Client::new(), base, ADMIN_KEY, "ann").await;
    let (user, first) = (
        created["id"].as_str().unwrap(),
        created["api_key"].as_str().unwrap(),
    );
    let keys = format!("/v1/admin/users/{user}/keys");
    let (status, admin_rid, spare) =
        call(base, "POST", &keys, ADMIN_KEY, Some(json!({"name": "ci"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, own_rid, own) = call(
        base,
        "POST",
        "/v1/me/keys",
        first,
        Some(json!({"name": "laptop"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let mint = json!({"scopes": ["files:write"], "expires_in": 60});
    let (status, mint_rid, token) = call(base, "POST", "/v1/tokens", first, Some(mint)).await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let spare_id = spare["id"].as_str().unwrap();
    let revoke = format!("/v1/me/keys/{spare_id}");
    let (status, revoke_rid, _) = call(base, "DELETE", &revoke, first, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    drop(server); // killed: everything it logged is in the file

    let text = std::fs::read_to_string(&log).unwrap();
    let secrets = [
        first,
        spare["api_key"].as_str().unwrap(),
        own["api_key"].as_str().unwrap(),
        token["token"].as_str().unwrap(),
        ADMIN_KEY,
    ];
    for secret in secrets {
        assert!(!text.contains(secret), "a secret was logged:\n{text}");
    }
    let audit: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "filedock::audit")
        .collect();
    assert_eq!(audit.len(), 4, "{audit:#?}");
    let expect = [
        ("key_created", "admin", admin_rid),
        ("key_created", "user:", own_rid),
        ("token_minted", "user:", mint_rid),
        ("key_revoked", "user:", revoke_rid),
    ];
    for (line, (action, actor, rid)) in audit.iter().zip(expect) {
        let fields = &line["fields"];
        assert_eq!(fields["action"], action, "{line}");
        assert!(
            fields["actor"].as_str().unwrap().starts_with(actor),
            "{line}"
        );
        assert_eq!(fields["request_id"], rid.as_str(), "{line}");
        assert_eq!(fields["user_id"], user, "{line}");
    }
}
