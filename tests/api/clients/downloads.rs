//! Downloads asked for oddly: ranges of an empty file, conditional and
//! range requests by RFC 9110, and a file whose type would run as a page.

use reqwest::StatusCode;

use crate::helpers::*;

use super::upload_as;

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
