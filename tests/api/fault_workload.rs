//! The fault suite's workload: clients that upload, rename, delete, attach,
//! and connect and disconnect links, recording every request and its answer.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use rand::{Rng, rngs::StdRng};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;

use crate::{
    helpers::*,
    history::{Answer, Event, Op},
};

/// The one MCP link every client connects and disconnects.
pub const MCP: &str = "mcp-shared";

/// What the workload shares: the user, the containers, the files it may
/// delete or attach, and the history.
pub struct World {
    pub bases: Vec<String>,
    pub key: String,
    pub session: String,
    pub agent: String,
    pub files: Mutex<Vec<String>>,
    pub history: Mutex<Vec<Event>>,
    pub uploads: std::sync::atomic::AtomicUsize,
    /// Renames sent, which number their names.
    pub renames: std::sync::atomic::AtomicUsize,
    /// Links of their own that clients connect, and those acknowledged.
    pub links: std::sync::atomic::AtomicUsize,
    pub connected: Mutex<Vec<String>>,
    pub client: reqwest::Client,
}

impl World {
    /// Sends one request and classifies the answer.
    async fn send(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<reqwest::Body>,
        json: Option<Value>,
    ) -> (Answer, Value) {
        let mut req = self
            .client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(90));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/octet-stream")
                .body(b);
        }
        if let Some(j) = json {
            req = req.json(&j);
        }
        match req.send().await {
            Err(e) => (Answer::Unknown(format!("transport: {e}")), Value::Null),
            Ok(res) => {
                let status = res.status();
                let body: Value = res.json().await.unwrap_or(Value::Null);
                let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
                let answer = if status.is_success() {
                    Answer::Ok
                } else if status == StatusCode::GATEWAY_TIMEOUT || code == "outcome_unknown" {
                    Answer::Unknown(code)
                } else {
                    Answer::Failed(if code.is_empty() {
                        status.to_string()
                    } else {
                        code
                    })
                };
                (answer, body)
            }
        }
    }

    pub async fn one_op(&self, rng: &mut StdRng) {
        let base = &self.bases[rng.random_range(0..self.bases.len())];
        let known = self.files.lock().unwrap().clone();
        let pick = rng.random_range(0..100);
        let invoked = Instant::now();
        let (op, answer, file_id) = if pick < 35 || known.is_empty() {
            let n = self
                .uploads
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let bytes = pseudo_random_bytes(rng.random_range(1..16_384), n as u64);
            let name = format!("u{n}.bin");
            let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
            let path = format!("/v1/files?filename={name}");
            let (answer, body) = self
                .send(base, Method::POST, &path, Some(bytes.into()), None)
                .await;
            let id = body["id"].as_str().map(str::to_owned);
            if let (Answer::Ok, Some(id)) = (&answer, &id) {
                self.files.lock().unwrap().push(id.clone());
            }
            (Op::Upload { name, sha256 }, answer, id)
        } else {
            let file_id = known[rng.random_range(0..known.len())].clone();
            let (op, method, path, json) = match pick {
                35..40 => {
                    let n = self
                        .renames
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let name = format!("r{n}.bin");
                    let json = Some(json!({"name": name}));
                    let path = format!("/v1/files/{file_id}");
                    (Op::Rename { file_id, name }, Method::PATCH, path, json)
                }
                40..55 => (
                    Op::Delete {
                        file_id: file_id.clone(),
                    },
                    Method::DELETE,
                    format!("/v1/files/{file_id}"),
                    None,
                ),
                55..70 => (
                    Op::AttachSession {
                        file_id: file_id.clone(),
                    },
                    Method::POST,
                    format!("/v1/sessions/{}/files", self.session),
                    Some(json!({"file_id": file_id})),
                ),
                70..80 => (
                    Op::AttachAgent {
                        file_id: file_id.clone(),
                    },
                    Method::POST,
                    format!("/v1/agents/{}/files", self.agent),
                    Some(json!({"file_id": file_id})),
                ),
                80..85 => (
                    Op::Link { connect: true },
                    Method::PUT,
                    format!("/v1/agents/{}/mcps/{MCP}", self.agent),
                    None,
                ),
                85..90 => (
                    Op::Link { connect: false },
                    Method::DELETE,
                    format!("/v1/agents/{}/mcps/{MCP}", self.agent),
                    None,
                ),
                90..95 => {
                    let n = self.links.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mcp = format!("own{n}");
                    let path = format!("/v1/agents/{}/mcps/{mcp}", self.agent);
                    (Op::OwnLink { mcp, connect: true }, Method::PUT, path, None)
                }
                _ => {
                    // Disconnect a link whose connect was acknowledged, once.
                    let Some(mcp) = self.connected.lock().unwrap().pop() else {
                        return;
                    };
                    let path = format!("/v1/agents/{}/mcps/{mcp}", self.agent);
                    (
                        Op::OwnLink {
                            mcp,
                            connect: false,
                        },
                        Method::DELETE,
                        path,
                        None,
                    )
                }
            };
            let (answer, _) = self.send(base, method, &path, None, json).await;
            if let (Op::OwnLink { mcp, connect: true }, Answer::Ok) = (&op, &answer) {
                self.connected.lock().unwrap().push(mcp.clone());
            }
            (op, answer, None)
        };
        self.history.lock().unwrap().push(Event {
            op,
            invoked,
            completed: Instant::now(),
            answer,
            file_id,
        });
    }
}
