//! Liveness, readiness (each dependency checked) and metrics.

use std::time::Duration;

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
};
use serde_json::{Map, Value, json};

use super::{
    error::{ApiResult, ok},
    state::AppState,
};

pub async fn healthz() -> ApiResult {
    ok(Json(json!({"status": "ok"})))
}

/// 200 when every dependency answers within 2 s; 503 naming those that do
/// not; 503 `draining` at once when the instance is shutting down.
pub async fn readyz(State(state): State<AppState>) -> ApiResult {
    if state.drain.is_unready() {
        let body = json!({"status": "draining", "checks": {}, "failing": ["draining"]});
        return ok((StatusCode::SERVICE_UNAVAILABLE, Json(body)));
    }
    let limit = Duration::from_secs(2);
    let check = |r: Result<Result<(), String>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(())) => "ok",
        _ => "unavailable",
    };
    let (meta, blobs, locks) = tokio::join!(
        tokio::time::timeout(limit, async {
            state.ports.meta.ping().await.map_err(|e| e.to_string())
        }),
        tokio::time::timeout(limit, async {
            state.ports.blobs.ping().await.map_err(|e| e.to_string())
        }),
        tokio::time::timeout(limit, async {
            state.ports.locks.ping().await.map_err(|e| e.to_string())
        }),
    );
    let mut checks = Map::new();
    checks.insert("metadata".into(), check(meta).into());
    checks.insert("blobs".into(), check(blobs).into());
    checks.insert("locks".into(), check(locks).into());
    let failing: Vec<String> = checks
        .iter()
        .filter(|(_, v)| *v != "ok")
        .map(|(k, _)| k.clone())
        .collect();
    let status = if failing.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if failing.is_empty() { "ready" } else { "unavailable" },
        "checks": Value::Object(checks),
        "failing": failing,
    });
    ok((status, Json(body)))
}

pub async fn metrics(State(state): State<AppState>) -> ApiResult {
    ok((
        [(
            header::CONTENT_TYPE,
            // What prometheus-client's text encoder writes (it ends in `# EOF`).
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    ))
}
