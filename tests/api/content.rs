//! Checksums and content types (issue 13, items 4 and 5): a declared
//! `Content-Digest` is verified with nothing stored on a mismatch; placeholder
//! types are detected from the bytes; an allow-list refuses other types with
//! nothing stored; downloads say how a browser may show the file.

use base64::{Engine, engine::general_purpose::STANDARD};
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256, Sha512};

use crate::helpers::*;

/// A valid 1×1 PNG.
const PNG: [u8; 69] = [
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90, 0x77, 0x53,
    0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0x00,
    0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e,
    0x44, 0xae, 0x42, 0x60, 0x82,
];

/// The start of an ELF executable (its 64-byte header, the rest zero).
fn elf() -> Vec<u8> {
    let mut bytes =
        b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00".to_vec();
    bytes.resize(64, 0);
    bytes
}

/// Uploads `bytes` raw with these headers (no `Content-Type` unless given).
async fn upload_with(
    app: &TestApp,
    u: &TestUser,
    bytes: Vec<u8>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url("/v1/files"))
        .query(&[("filename", "f")])
        .bearer_auth(&u.key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(bytes).send().await.unwrap()
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha-256=:{}:", STANDARD.encode(Sha256::digest(bytes)))
}

/// Nothing of `u`'s is stored: no blob, no file record, no intent left.
async fn assert_nothing_stored(app: &TestApp, u: &TestUser) {
    assert_eq!(app.blob_keys(u).await, Vec::<String>::new(), "blobs");
    assert_eq!(app.list_ids(u).await, Vec::<String>::new(), "files");
    assert_eq!(app.intents().await, 0, "intents");
}

#[tokio::test]
async fn a_matching_content_digest_is_accepted_and_downloads_carry_repr_digest() {
    let app = spawn_app().await;
    let u = app.create_user("digest").await;
    let bytes = pseudo_random_bytes(300_000, 1);
    let sha512 = format!("sha-512=:{}:", STANDARD.encode(Sha512::digest(&bytes)));
    for digest in [
        sha256_digest(&bytes),
        sha512,
        format!("md5=:AAAA:, {}", sha256_digest(&bytes)),
    ] {
        let res = upload_with(&app, &u, bytes.clone(), &[("content-digest", &digest)]).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{digest}");
        let file: Value = res.json().await.unwrap();
        let got = app.download(&u, file["id"].as_str().unwrap()).await;
        assert_eq!(got.headers()["repr-digest"], sha256_digest(&bytes).as_str());
    }
}

#[tokio::test]
async fn a_digest_mismatch_stores_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("mismatch").await;
    // Larger than one S3 part on the real backend: a multipart upload completes, then goes.
    let bytes = pseudo_random_bytes(6 << 20, 2);
    let wrong = sha256_digest(b"something else");
    let wrong512 = format!("sha-512=:{}:", STANDARD.encode(Sha512::digest(b"other")));
    for digest in [wrong, wrong512] {
        let res = upload_with(&app, &u, bytes.clone(), &[("content-digest", &digest)]).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "digest_mismatch".into()),
            "{digest}"
        );
    }
    assert_nothing_stored(&app, &u).await;
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
}

#[tokio::test]
async fn malformed_or_unsupported_digests_are_refused() {
    let app = spawn_app().await;
    let u = app.create_user("malformed").await;
    for digest in ["sha-256=abc", "md5=:AAAA:", "sha-256=:AAAA:", "nonsense"] {
        let res = upload_with(&app, &u, b"x".to_vec(), &[("content-digest", digest)]).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{digest}"
        );
    }
    // On a multipart body the digest would be the form's, not the file's.
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("x"),
    );
    let res = app
        .client
        .post(app.url("/v1/files"))
        .bearer_auth(&u.key)
        .header("content-digest", sha256_digest(b"x"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::BAD_REQUEST, "invalid_request".into())
    );
    assert_nothing_stored(&app, &u).await;
}

#[tokio::test]
async fn a_png_sent_without_a_real_type_is_detected_and_a_declared_type_is_kept() {
    let app = spawn_app().await;
    let u = app.create_user("detect").await;
    for declared in [
        None,
        Some("application/octet-stream"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let headers: Vec<(&str, &str)> = declared.iter().map(|t| ("content-type", *t)).collect();
        let file: Value = upload_with(&app, &u, PNG.to_vec(), &headers)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(file["content_type"], "image/png", "sent as {declared:?}");
        let got = app.download(&u, file["id"].as_str().unwrap()).await;
        assert_eq!(got.headers()["content-type"], "image/png");
    }
    // A multipart `file` part without a type too.
    let part = reqwest::multipart::Part::bytes(PNG.to_vec()).file_name("p.png");
    let res = app
        .client
        .post(app.url("/v1/files"))
        .bearer_auth(&u.key)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    let file: Value = res.json().await.unwrap();
    assert_eq!(file["content_type"], "image/png", "multipart");
    // UTF-8 text is text; bytes of no known type stay generic; a type the
    // client names is kept.
    for (bytes, want) in [
        ("héllo\n".as_bytes().to_vec(), "text/plain; charset=utf-8"),
        (pseudo_random_bytes(1000, 3), "application/octet-stream"),
    ] {
        let file: Value = upload_with(&app, &u, bytes, &[])
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(file["content_type"], want);
    }
    let file: Value = upload_with(&app, &u, PNG.to_vec(), &[("content-type", "text/csv")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(file["content_type"], "text/csv");
}

#[tokio::test]
async fn the_allow_list_refuses_other_types_and_stores_nothing() {
    let mut settings = test_settings();
    settings.allowed_types =
        filedock::config::AllowedTypes::parse("image/*, application/pdf").unwrap();
    let app = spawn_app_with(settings).await;
    let refused = app.create_user("refused").await;
    for (bytes, declared) in [
        (b"plain text".to_vec(), Some("text/plain")),
        (b"detected as text".to_vec(), None),
        (pseudo_random_bytes(1000, 4), None),
        // A claimed image whose bytes are an executable.
        (elf(), Some("image/png")),
    ] {
        let headers: Vec<(&str, &str)> = declared.iter().map(|t| ("content-type", *t)).collect();
        let res = upload_with(&app, &refused, bytes, &headers).await;
        assert_eq!(
            error_code(res).await,
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type".into()
            ),
            "{declared:?}"
        );
    }
    let part = reqwest::multipart::Part::bytes(b"<html>".to_vec())
        .file_name("x.html")
        .mime_str("text/html")
        .unwrap();
    let res = app
        .client
        .post(app.url("/v1/files"))
        .bearer_auth(&refused.key)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "multipart"
    );
    assert_nothing_stored(&app, &refused).await;

    let allowed = app.create_user("allowed").await;
    let res = upload_with(&app, &allowed, PNG.to_vec(), &[]).await;
    assert_eq!(
        res.status(),
        StatusCode::CREATED,
        "a detected PNG is allowed"
    );
    assert_eq!(app.list_ids(&allowed).await.len(), 1);
    assert_eq!(app.blob_keys(&allowed).await.len(), 1);
}

#[tokio::test]
async fn downloads_are_inline_only_for_types_safe_to_show() {
    let app = spawn_app().await;
    let u = app.create_user("disposition").await;
    for (declared, inline) in [
        ("image/png", true),
        ("application/pdf", true),
        ("text/plain; charset=utf-8", true),
        ("image/svg+xml", false),
        ("text/html", false),
        ("application/javascript", false),
        ("application/octet-stream", false),
    ] {
        // Bytes of no type, so that the declared one is what is stored.
        let bytes = pseudo_random_bytes(100, 5);
        let file: Value = upload_with(&app, &u, bytes, &[("content-type", declared)])
            .await
            .json()
            .await
            .unwrap();
        let res = app.download(&u, file["id"].as_str().unwrap()).await;
        let h = res.headers();
        let cd = h["content-disposition"].to_str().unwrap();
        let want = if inline { "inline;" } else { "attachment;" };
        assert!(cd.starts_with(want), "{declared}: {cd}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["content-security-policy"], "sandbox");
        assert_eq!(h["cache-control"], "private");
    }
}

#[tokio::test]
async fn last_modified_is_the_upload_time_and_if_modified_since_answers_304() {
    let app = spawn_app().await;
    let u = app.create_user("modified").await;
    let file: Value = app.upload_json(&u, "m.bin", b"x".to_vec()).await;
    let id = file["id"].as_str().unwrap();
    let created: chrono::DateTime<chrono::Utc> =
        file["created_at"].as_str().unwrap().parse().unwrap();
    let res = app.download(&u, id).await;
    let last_modified = res.headers()["last-modified"].to_str().unwrap().to_owned();
    assert_eq!(
        httpdate::parse_http_date(&last_modified).unwrap(),
        std::time::SystemTime::from(
            chrono::DateTime::from_timestamp(created.timestamp(), 0).unwrap()
        )
    );
    let since = |date: &str| {
        app.client
            .get(app.url(&format!("/v1/files/{id}/content")))
            .bearer_auth(&u.key)
            .header("if-modified-since", date)
            .send()
    };
    assert_eq!(
        since(&last_modified).await.unwrap().status(),
        StatusCode::NOT_MODIFIED
    );
    let before = httpdate::fmt_http_date(
        std::time::SystemTime::from(created) - std::time::Duration::from_secs(60),
    );
    assert_eq!(since(&before).await.unwrap().status(), StatusCode::OK);
    assert_eq!(since("not a date").await.unwrap().status(), StatusCode::OK);
}
