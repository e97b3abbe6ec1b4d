//! Test support shared by the API tests (`tests/api`) and the benchmarks
//! (`examples/bench/`), behind the `testing` feature: free ports, the
//! `filedock` binary as a child process, and the client calls both make.

use std::{process::Child, time::Duration};

use reqwest::StatusCode;
use serde_json::{Value, json};

/// A port nothing listens on. Below Linux's ephemeral range (32768–60999):
/// a port that `bind(:0)` hands out is free only until an outgoing
/// connection takes it as its source port, and a test run makes thousands
/// of those.
pub fn free_port() -> u16 {
    loop {
        let port = rand::random_range(20_000..32_768);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A `filedock` server process, killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Waits until the server `child` started on `port` answers `/healthz`,
    /// trying `tries` times, `pause` apart; panics if it never does.
    pub async fn wait_until_up(child: Child, port: u16, tries: usize, pause: Duration) -> Self {
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        for _ in 0..tries {
            if client
                .get(format!("{}/healthz", server.base))
                .send()
                .await
                .is_ok()
            {
                return server;
            }
            tokio::time::sleep(pause).await;
        }
        panic!("filedock did not start");
    }
}

/// The `/metrics` text of the server at `base`.
pub async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of a metric's samples whose labels contain `labels`, on the
/// server at `base`.
pub async fn metric_at(base: &str, name: &str, labels: &str) -> f64 {
    metric_in(&metrics_text(base).await, name, labels)
}

/// A counter's value in a `/metrics` text, summed over label sets matching `labels`.
pub fn metric_in(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A counter with one label in a `/metrics` text, by that label's value
/// (`filedock_s3_requests_total` by `op`, say).
pub fn metric_by_label(text: &str, name: &str) -> std::collections::BTreeMap<String, f64> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let label = l.split('"').nth(1)?.to_owned();
            Some((label, l.rsplit(' ').next()?.parse::<f64>().ok()?))
        })
        .collect()
}

/// Sends `request` and parses the answer's JSON body (panics if it has none).
pub async fn json_of(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// Creates a user through the admin API of the server at `base`: the body
/// of the answer (`id`, `name`, `api_key`).
pub async fn create_user_json(
    client: &reqwest::Client,
    base: &str,
    admin_key: &str,
    name: &str,
) -> Value {
    let res = client
        .post(format!("{base}/v1/admin/users"))
        .bearer_auth(admin_key)
        .json(&json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json().await.unwrap()
}

/// Creates a user through the admin API of the server at `base`; its API key.
pub async fn create_user_at(base: &str, admin_key: &str, name: &str) -> String {
    let body = create_user_json(&reqwest::Client::new(), base, admin_key, name).await;
    body["api_key"].as_str().unwrap().to_owned()
}

/// Uploads `body` as a raw `POST /v1/files?filename=` to the server at `base`.
pub async fn upload_raw_at(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    filename: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    client
        .post(format!("{base}/v1/files"))
        .query(&[("filename", filename)])
        .bearer_auth(key)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Uploads, and parses the answer: its status and its JSON body (`null` if
/// it has none).
pub async fn upload_and_parse(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    filename: &str,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, Value) {
    let res = upload_raw_at(client, base, key, filename, body).await;
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Lua script calls a Redis server has served (`INFO commandstats`).
pub async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// SHA-256 of `bytes`, hex (what filedock reports as `sha256`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `len` bytes that do not compress, the same for the same `seed`.
pub fn pseudo_random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
