//! What a hostile or careless client can send outside the happy path:
//! made-up methods, odd ranges, bogus content types and request ids, a
//! user key on an admin route. Each answer is bounded and truthful.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::*;

/// Uploads `body` raw as `filename` with this `Content-Type`.
async fn upload_as(
    app: &TestApp,
    u: &TestUser,
    filename: &str,
    content_type: &[u8],
    body: &'static str,
) -> reqwest::Response {
    app.client
        .post(app.url("/v1/files"))
        .query(&[("filename", filename)])
        .bearer_auth(&u.key)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

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
async fn a_range_of_an_empty_file_is_not_satisfiable() {
    let app = spawn_app().await;
    let u = app.create_user("empty").await;
    let id = app.upload_json(&u, "empty.bin", Vec::new()).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for range in ["bytes=0-0", "bytes=-1", "bytes=0-"] {
        let res = app
            .client
            .get(app.url(&format!("/v1/files/{id}/content")))
            .bearer_auth(&u.key)
            .header("range", range)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::RANGE_NOT_SATISFIABLE, "{range}");
        assert_eq!(res.headers()["content-range"], "bytes */0", "{range}");
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
async fn a_download_can_never_run_as_a_page_of_this_origin() {
    let app = spawn_app().await;
    let u = app.create_user("html").await;
    let res = upload_as(
        &app,
        &u,
        "x.html",
        b"text/html",
        "<script>alert(1)</script>",
    )
    .await;
    let id = res.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let res = app.download(&u, &id).await;
    let h = res.headers();
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["content-security-policy"], "sandbox");
    assert!(
        h["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
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

/// One name rule for files, users and agents: no invisible or bidirectional
/// characters (a name must read as what it is), stored NFC-normalised.
#[tokio::test]
async fn names_with_invisible_characters_are_refused_and_names_are_stored_nfc() {
    let app = spawn_app().await;
    let u = app.create_user("names").await;
    for bad in [
        "a\u{061C}b.txt",
        "zero\u{200B}width.txt",
        "line\u{2028}sep.txt",
        "\u{FEFF}bom.txt",
    ] {
        let res = upload_as(&app, &u, bad, b"application/octet-stream", "x").await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{bad:?}"
        );
    }
    let (status, _) = app
        .json(
            "POST",
            "/v1/agents",
            &u,
            Some(json!({"name": "evil\u{202E}txt.exe"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an agent name with a bidi override"
    );
    let created = app
        .upload_json(&u, "e\u{301}te\u{301}.txt", b"x".to_vec())
        .await;
    assert_eq!(created["filename"], "\u{e9}t\u{e9}.txt", "stored NFC");
    assert!(
        app.list_ids(&u).await.len() == 1,
        "only the clean name was stored"
    );
}

/// Uploads one multipart `file` part whose `Content-Disposition` carries `params`.
async fn upload_disposition(app: &TestApp, u: &TestUser, params: &str) -> reqwest::Response {
    let body = format!(
        "--BND\r\nContent-Disposition: form-data; name=\"file\"; {params}\r\n\
         Content-Type: text/plain\r\n\r\nhello\r\n--BND--\r\n"
    );
    app.client
        .post(app.url("/v1/files"))
        .bearer_auth(&u.key)
        .header("content-type", "multipart/form-data; boundary=BND")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// A multipart `filename*=` (RFC 6266/8187) names the file, ahead of a
/// plain `filename`, and its decoded name still passes the name rule.
#[tokio::test]
async fn a_multipart_extended_filename_is_decoded() {
    let app = spawn_app().await;
    let u = app.create_user("extended").await;
    for (params, stored) in [
        (
            "filename=\"resume.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt",
            "r\u{e9}sum\u{e9}.txt",
        ),
        ("filename*=UTF-8''%E6%97%A5%E6%9C%AC.txt", "日本.txt"),
        ("filename*=iso-8859-1'fr'%E9t%E9.txt", "\u{e9}t\u{e9}.txt"),
    ] {
        let res = upload_disposition(&app, &u, params).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{params}");
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["filename"], stored, "{params}");
    }
    for bad in [
        "filename*=UTF-8''evil%E2%80%AEtxt.exe", // a bidi override, decoded
        "filename*=UTF-8''%FF.txt",              // not UTF-8
    ] {
        let res = upload_disposition(&app, &u, bad).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{bad}"
        );
    }
    assert_eq!(
        app.list_ids(&u).await.len(),
        3,
        "only the good names stored"
    );
}

/// `GET /v1/files/{id}/content` with these extra headers.
async fn get_content(
    app: &TestApp,
    u: &TestUser,
    id: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = app
        .client
        .get(app.url(&format!("/v1/files/{id}/content")))
        .bearer_auth(&u.key);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

/// RFC 9110 §13–14: a weak `If-None-Match` matches, `bytes=-0` is not
/// satisfiable, a suffix longer than the file is the whole file, a stale
/// `If-Range` gets the whole file, a stale `If-Match` is a 412.
#[tokio::test]
async fn conditional_and_range_requests_follow_rfc_9110() {
    let app = spawn_app().await;
    let u = app.create_user("conditional").await;
    let body = b"0123456789".to_vec();
    let file = app.upload_json(&u, "ten.txt", body.clone()).await;
    let id = file["id"].as_str().unwrap();
    let etag = format!("\"{}\"", file["sha256"].as_str().unwrap());
    let weak = format!("W/{etag}");

    let res = get_content(&app, &u, id, &[("if-none-match", &weak)]).await;
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED, "a weak tag matches");

    let res = get_content(&app, &u, id, &[("range", "bytes=-0")]).await;
    assert_eq!(res.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(res.headers()["content-range"], "bytes */10");
    assert_eq!(error_code(res).await.1, "range_not_satisfiable");

    let res = get_content(&app, &u, id, &[("range", "bytes=-500")]).await;
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT, "a longer suffix");
    assert_eq!(res.headers()["content-range"], "bytes 0-9/10");
    assert_eq!(res.bytes().await.unwrap(), body);

    let stale = "\"0000\"";
    let res = get_content(&app, &u, id, &[("range", "bytes=0-1"), ("if-range", stale)]).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "a stale If-Range: the whole file"
    );
    assert_eq!(res.bytes().await.unwrap(), body);
    let res = get_content(&app, &u, id, &[("range", "bytes=0-1"), ("if-range", &etag)]).await;
    assert_eq!(
        res.status(),
        StatusCode::PARTIAL_CONTENT,
        "a current If-Range"
    );
    assert_eq!(res.bytes().await.unwrap(), &body[..2]);

    let delete = |tag: &str| {
        app.client
            .delete(app.url(&format!("/v1/files/{id}")))
            .bearer_auth(&u.key)
            .header("if-match", tag)
            .send()
    };
    let res = delete(stale).await.unwrap();
    assert_eq!(
        error_code(res).await,
        (
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed".into()
        )
    );
    assert_eq!(
        app.list_ids(&u).await,
        [id],
        "a failed precondition deletes nothing"
    );
    let res = delete(&etag).await.unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "a current If-Match");
    assert!(app.list_ids(&u).await.is_empty());
}
