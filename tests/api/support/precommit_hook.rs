//! The fault suite's pre-commit hook: a server in the test process that
//! refuses (422, with a reason) every upload whose filename starts with
//! [`REFUSED_PREFIX`] and lets every other one commit (204), checking each
//! call's signature with the `standardwebhooks` crate (a call it cannot
//! verify is refused too, and counted).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Json, Router, body::Bytes, extract::State, http::HeaderMap, http::StatusCode};
use serde_json::{Value, json};

/// The filenames the hook refuses start with this.
pub const REFUSED_PREFIX: &str = "refuse-";

#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    refused: AtomicUsize,
    unverified: AtomicUsize,
}

pub struct PrecommitHookServer {
    url: String,
    counts: Arc<(standardwebhooks::Webhook, Counts)>,
    task: tokio::task::JoinHandle<()>,
}

impl PrecommitHookServer {
    /// Checks calls signed with `secret` (`FILEDOCK_WEBHOOK_SECRET`).
    pub async fn start(secret: String) -> Self {
        let verifier = standardwebhooks::Webhook::new(&secret).expect("a whsec_ secret");
        let counts = Arc::new((verifier, Counts::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/precommit", listener.local_addr().unwrap());
        let app = Router::new().fallback(answer).with_state(counts.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, counts, task }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// (accepted, refused, calls that did not verify).
    pub fn counts(&self) -> (usize, usize, usize) {
        let c = &self.counts.1;
        (
            c.accepted.load(Ordering::SeqCst),
            c.refused.load(Ordering::SeqCst),
            c.unverified.load(Ordering::SeqCst),
        )
    }
}

impl Drop for PrecommitHookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    State(shared): State<Arc<(standardwebhooks::Webhook, Counts)>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let (verifier, counts) = &*shared;
    if verifier.verify(&body, &headers).is_err() {
        counts.unverified.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"reason": "bad signature"})),
        );
    }
    let call: Value = serde_json::from_slice(&body).unwrap_or_default();
    let name = call["data"]["filename"].as_str().unwrap_or_default();
    match name.starts_with(REFUSED_PREFIX) {
        true => {
            counts.refused.fetch_add(1, Ordering::SeqCst);
            let reason = format!("{name}: names starting with {REFUSED_PREFIX} are refused");
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({ "reason": reason })),
            )
        }
        false => {
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            (StatusCode::NO_CONTENT, Json(Value::Null))
        }
    }
}
