//! Requests outside the happy path: made-up and wrong methods, bad ids,
//! bogus content types and request ids, a user key on an admin route, and
//! what `/metrics` lets a client do. Each answer is bounded and truthful.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::*;

use super::upload_as;

/// `GET path` with `key`.
async fn get_as(app: &TestApp, path: &str, key: &str) -> reqwest::Response {
    app.client
        .get(app.url(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn made_up_methods_do_not_grow_the_metrics() {
    let app = spawn_app().await;
    for method in ["PROBEA1", "PROBEB2", &"X".repeat(10_000)] {
        let res = app
            .client
            .request(
                Method::from_bytes(method.as_bytes()).unwrap(),
                app.url("/x"),
            )
            .send()
            .await
            .unwrap();
        assert!(
            res.status().is_client_error(),
            "{method:.20}: {}",
            res.status()
        );
    }
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !text.contains("PROBE"),
        "a client's method became a metric label"
    );
    assert!(
        !text.contains("XXXX"),
        "a client's method became a metric label"
    );
    assert!(
        app.metric("filedock_http_requests_total", "method=\"other\"")
            .await
            >= 3.0,
        "made-up methods are counted as other"
    );
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
async fn a_content_type_that_is_not_a_media_type_is_refused_and_nothing_stored() {
    let app = spawn_app().await;
    let u = app.create_user("typed").await;
    for bad in [
        "x".repeat(1000),
        "not a type".into(),
        "text/".into(),
        "a/b c".into(),
    ] {
        let res = upload_as(&app, &u, "t.txt", bad.as_bytes(), "body").await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{bad:.30}"
        );
    }
    assert!(app.list_ids(&u).await.is_empty());
    assert!(app.blob_keys(&u).await.is_empty());
    let ok = upload_as(&app, &u, "t.txt", b"text/plain; charset=utf-8", "body").await;
    assert_eq!(ok.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_request_id_is_echoed_only_when_it_is_a_short_token() {
    let app = spawn_app().await;
    let send = |id: &'static str| {
        app.client
            .get(app.url("/healthz"))
            .header("x-request-id", id)
            .send()
    };
    let res = send("abc-123_x.y").await.unwrap();
    assert_eq!(res.headers()["x-request-id"], "abc-123_x.y");
    let res = send("attacker {\"level\":\"ERROR\"}").await.unwrap();
    let echoed = res.headers()["x-request-id"].to_str().unwrap();
    assert!(!echoed.contains("attacker"), "echoed {echoed}");
    assert!(
        uuid::Uuid::parse_str(echoed).is_ok(),
        "a fresh id replaced it: {echoed}"
    );
}

#[tokio::test]
async fn a_user_key_on_an_admin_route_is_forbidden_and_new_keys_are_not_cached() {
    let app = spawn_app().await;
    let res = app
        .client
        .post(app.url("/v1/admin/users"))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({"name": "someone"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        res.headers()["cache-control"],
        "no-store",
        "the key is shown once"
    );
    let key = res.json::<serde_json::Value>().await.unwrap()["api_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let res = get_as(&app, "/v1/admin/orphans", &key).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::FORBIDDEN, "forbidden".into())
    );
    let res = get_as(&app, "/v1/admin/orphans", "nobody").await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
}

#[tokio::test]
async fn metrics_declare_the_openmetrics_format_and_upload_buckets_reach_hours() {
    let app = spawn_app().await;
    let res = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(
        res.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = res.text().await.unwrap();
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends in # EOF"
    );
    let top = text
        .lines()
        .filter(|l| l.starts_with("filedock_upload_duration_seconds_bucket"))
        .filter_map(|l| {
            l.split("le=\"")
                .nth(1)?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .fold(0.0, f64::max);
    assert!(top >= 3600.0, "the longest upload bucket is {top} s");
}

#[tokio::test]
async fn metrics_on_their_own_listener_are_served_only_there() {
    let mut settings = test_settings();
    settings.metrics_addr = Some("127.0.0.1:0".into());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("scraped").await;
    app.upload_json(&u, "a.txt", b"counted".to_vec()).await;

    let metrics_base = app.metrics_base.clone().expect("a metrics listener");
    assert_ne!(metrics_base, app.base);
    let res = app
        .client
        .get(format!("{metrics_base}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(
        metric_at(
            &metrics_base,
            "filedock_uploads_total",
            "outcome=\"committed\""
        )
        .await,
        1.0,
        "the metrics listener shows the API's figures"
    );

    let res = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::NOT_FOUND, "not_found".to_owned()),
        "the API listener no longer serves /metrics"
    );
    let res = app
        .client
        .get(format!("{metrics_base}/v1/files"))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "nor the metrics listener the API"
    );
}
