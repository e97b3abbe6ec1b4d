//! Hostile names: too long, with paths, control, bidirectional or invisible
//! characters, in a multipart `filename*`. Refused (400, nothing stored) or
//! stored safely, NFC-normalised.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

use super::upload_as;

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
