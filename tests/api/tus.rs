//! Resumable uploads (tus 1.0, issue 13): creation, resume after a cut
//! PATCH, racing PATCHes, checksums, termination, expiry — on the embedded
//! adapters and (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use filedock::domain::sweeper::Outcome;
use reqwest::{Method, Response, StatusCode};
use sha2::{Digest, Sha256};

use crate::helpers::{
    TestApp, TestUser, assert_bucket_matches_metadata, real_backends, spawn_app, spawn_app_with,
    test_settings,
};

pub(crate) const TUS: &str = "1.0.0";
pub(crate) const OCTETS: &str = "application/offset+octet-stream";

/// Bytes that differ at every offset, so that a misplaced byte shows.
pub(crate) fn data(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
        .collect()
}

pub(crate) async fn create(app: &TestApp, user: &TestUser, len: usize) -> String {
    create_typed(app, user, len, Some("application/x-test")).await
}

/// Creates an upload of `len` bytes named `big.bin`, of type `filetype`.
pub(crate) async fn create_typed(
    app: &TestApp,
    user: &TestUser,
    len: usize,
    filetype: Option<&str>,
) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut metadata = format!("filename {}", b64.encode("big.bin"));
    if let Some(t) = filetype {
        metadata += &format!(",filetype {}", b64.encode(t));
    }
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-length", len.to_string())
        .header("upload-metadata", metadata)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    // A complete upload (an empty file) no longer expires.
    assert_eq!(res.headers().contains_key("upload-expires"), len > 0);
    location.rsplit('/').next().unwrap().to_owned()
}

pub(crate) async fn patch_body(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    offset: usize,
    body: reqwest::Body,
    checksum: Option<String>,
) -> reqwest::Result<Response> {
    let mut req = app
        .client
        .patch(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", offset.to_string());
    if let Some(c) = checksum {
        req = req.header("upload-checksum", c);
    }
    req.body(body).send().await
}

pub(crate) async fn patch(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    offset: usize,
    bytes: &[u8],
) -> Response {
    patch_body(app, user, id, offset, bytes.to_vec().into(), None)
        .await
        .unwrap()
}

/// `HEAD`: the status and `Upload-Offset`.
pub(crate) async fn head(app: &TestApp, user: &TestUser, id: &str) -> (StatusCode, Option<usize>) {
    let res = app
        .client
        .request(Method::HEAD, app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap();
    let offset = res
        .headers()
        .get("upload-offset")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (res.status(), offset)
}

pub(crate) fn offset_of(res: &Response) -> usize {
    res.headers()["upload-offset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

pub(crate) async fn content(app: &TestApp, user: &TestUser, id: &str) -> Vec<u8> {
    let res = app.download(user, id).await;
    assert_eq!(res.status(), StatusCode::OK);
    res.bytes().await.unwrap().to_vec()
}

/// What a resumable upload leaves in staging: S3 tail objects, or local staging files.
pub(crate) async fn staging_left(app: &TestApp) -> usize {
    if real_backends() {
        app.state.ports.blobs.list_keys("tus/").await.unwrap().len()
    } else {
        std::fs::read_dir(app.settings.data_dir.join("blobs.tmp"))
            .unwrap()
            .count()
    }
}

/// A size that crosses part boundaries of both blob stores (5 and 8 MiB).
pub(crate) const LEN: usize = 13 * 1024 * 1024 + 77;

#[tokio::test]
async fn a_tus_upload_in_three_patches_commits_the_same_bytes() {
    let app = spawn_app().await;
    let user = app.create_user("tus").await;
    let res = app
        .client
        .request(Method::OPTIONS, app.url("/v1/uploads"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(res.headers()["tus-version"], TUS);
    let ext = res.headers()["tus-extension"].to_str().unwrap();
    for e in [
        "creation",
        "creation-with-upload",
        "termination",
        "expiration",
        "checksum",
    ] {
        assert!(ext.split(',').any(|x| x == e), "{e} in {ext}");
    }
    assert_eq!(res.headers()["tus-checksum-algorithm"], "sha1,sha256");

    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(0)));
    let cuts = [0, 3 << 20, (9 << 20) + 5, LEN];
    for w in cuts.windows(2) {
        let res = patch(&app, &user, &id, w[0], &bytes[w[0]..w[1]]).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        assert_eq!(offset_of(&res), w[1]);
        assert_eq!(res.headers()["tus-resumable"], TUS);
        if w[1] < LEN {
            assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(w[1])));
        }
    }
    let file: serde_json::Value = app
        .client
        .get(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(file["filename"], "big.bin");
    assert_eq!(file["content_type"], "application/x-test");
    assert_eq!(file["sha256"], hex::encode(Sha256::digest(&bytes)));
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    // Complete, and answerable as such until it expires (tus_completed.rs).
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(LEN)));
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn a_patch_cut_mid_body_keeps_what_arrived_and_the_upload_resumes() {
    let app = spawn_app().await;
    let user = app.create_user("cut").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let sent = (6 << 20) + 1234;
    // The body sends `sent` bytes, then fails: the client drops the connection.
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes[..sent]
        .chunks(64 << 10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .chain([Err(std::io::Error::other("cut"))])
        .collect();
    let cut = patch_body(
        &app,
        &user,
        &id,
        0,
        reqwest::Body::wrap_stream(futures::stream::iter(chunks)),
        None,
    )
    .await;
    assert!(cut.is_err(), "the cut request cannot have an answer");
    // Resume from what HEAD says; the dying PATCH may still hold the lock (423).
    let offset = loop {
        let (status, offset) = head(&app, &user, &id).await;
        assert_eq!(status, StatusCode::OK);
        let offset = offset.unwrap();
        assert!(offset <= sent, "{offset} > {sent}: more kept than was sent");
        let res = patch(&app, &user, &id, offset, &bytes[offset..]).await;
        match res.status() {
            StatusCode::NO_CONTENT => break offset,
            StatusCode::LOCKED | StatusCode::CONFLICT => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            s => panic!("resume: {s}"),
        }
    };
    eprintln!("resumed from {offset} of {sent} sent");
    assert!(
        offset > 0,
        "the server kept none of the {sent} bytes that arrived before the cut"
    );
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0);
}

/// Racing PATCHes from one offset: each one that finds another in flight
/// asks it to let go (a lock-release request), so several may be stopped
/// part-way; at most one advances from each offset, what is stored is the
/// racers' bytes in order, and the upload finishes from `HEAD`'s offset.
#[tokio::test]
async fn of_racing_patches_at_one_offset_at_most_one_counts_and_nothing_is_lost() {
    const RACERS: usize = 8;
    let app = spawn_app().await;
    let user = app.create_user("race").await;
    let len = 3 << 20;
    let bytes = data(len);
    let id = create(&app, &user, len).await;
    let statuses: Vec<StatusCode> = futures::future::join_all(
        (0..RACERS).map(|_| async { patch(&app, &user, &id, 0, &bytes).await.status() }),
    )
    .await;
    let won = statuses
        .iter()
        .filter(|s| **s == StatusCode::NO_CONTENT)
        .count();
    let lost = statuses
        .iter()
        .filter(|s| {
            matches!(
                **s,
                StatusCode::CONFLICT | StatusCode::LOCKED | StatusCode::NOT_FOUND
            )
        })
        .count();
    assert!(won <= 1 && won + lost == RACERS, "{statuses:?}");
    let (status, offset) = head(&app, &user, &id).await;
    assert_eq!(status, StatusCode::OK);
    let offset = offset.unwrap();
    assert_eq!(won == 1, offset == len, "{statuses:?}, at {offset}");
    if offset < len {
        let res = patch(&app, &user, &id, offset, &bytes[offset..]).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    assert_eq!(app.list_ids(&user).await, vec![id.clone()]);
    assert!(content(&app, &user, &id).await == bytes);
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
}

#[tokio::test]
async fn a_patch_that_fails_its_checksum_keeps_nothing() {
    let app = spawn_app().await;
    let user = app.create_user("sum").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let first = &bytes[..(9 << 20)];
    // A part's worth and more, with the checksum of other bytes.
    let wrong = format!(
        "sha256 {}",
        b64.encode(Sha256::digest(&bytes[1..(9 << 20) + 1]))
    );
    let res = patch_body(&app, &user, &id, 0, first.to_vec().into(), Some(wrong))
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 460);
    assert_eq!(crate::helpers::error_code(res).await.1, "checksum_mismatch");
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(0)));
    let bad = patch_body(
        &app,
        &user,
        &id,
        0,
        first.to_vec().into(),
        Some("md5 AAAA".into()),
    )
    .await
    .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let right = format!(
        "sha1 {}",
        b64.encode(<sha1::Sha1 as sha2_state::Digest>::digest(first))
    );
    let res = patch_body(&app, &user, &id, 0, first.to_vec().into(), Some(right))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let rest = &bytes[first.len()..];
    let right = format!("sha256 {}", b64.encode(Sha256::digest(rest)));
    let res = patch_body(
        &app,
        &user,
        &id,
        first.len(),
        rest.to_vec().into(),
        Some(right),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(content(&app, &user, &id).await == bytes);
}

#[tokio::test]
async fn a_terminated_upload_leaves_nothing() {
    let app = spawn_app().await;
    let user = app.create_user("term").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..(6 << 20) + 9])
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let other = app.create_user("other").await;
    let del = |key: String| {
        app.client
            .delete(app.url(&format!("/v1/uploads/{id}")))
            .bearer_auth(key)
            .header("tus-resumable", TUS)
            .send()
    };
    assert_eq!(
        del(other.key.clone()).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        del(user.key.clone()).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(head(&app, &user, &id).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        patch(&app, &user, &id, 0, b"x").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
    assert_eq!(staging_left(&app).await, 0);
    assert!(
        app.state
            .ports
            .meta
            .resumable_by_id_alone(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn an_expired_upload_is_aborted_by_the_sweeper_and_a_live_one_is_not() {
    let mut settings = test_settings();
    // Every intent is stale at once: a live resumable upload must survive anyway.
    settings.sweep.intent_grace = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("exp").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..(6 << 20) + 9])
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(
        (report.resumables_expired, report.intents_abandoned),
        (0, 0)
    );
    assert_eq!(head(&app, &user, &id).await.1, Some((6 << 20) + 9));

    // Expire it, as if no PATCH had come for FILEDOCK_TUS_EXPIRY_SECS.
    let meta = &app.state.ports.meta;
    let mut upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    upload.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    assert_eq!(head(&app, &user, &id).await.0, StatusCode::NOT_FOUND);
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(
        (report.resumables_expired, report.intents_abandoned),
        (1, 1)
    );
    assert!(
        meta.resumable_by_id_alone(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
    assert_eq!(staging_left(&app).await, 0);
}

#[tokio::test]
async fn tus_requests_need_the_version_the_key_and_the_media_type() {
    let app = spawn_app().await;
    let user = app.create_user("hdr").await;
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("upload-length", "10")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(res.headers()["tus-version"], TUS);
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .header("tus-resumable", TUS)
        .header("upload-length", "10")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["tus-resumable"], TUS);
    let id = create(&app, &user, 10).await;
    let res = app
        .client
        .patch(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-offset", "0")
        .body("0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let wrong = patch(&app, &user, &id, 3, b"3456789").await;
    assert_eq!(wrong.status(), StatusCode::CONFLICT);
    assert_eq!(wrong.headers()["upload-offset"], "0", "where to resume");
    assert_eq!(
        patch(&app, &user, &id, 0, b"0123456789ab").await.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(head(&app, &user, &id).await.1, Some(0));
    assert_eq!(
        patch(&app, &user, &id, 0, b"0123456789").await.status(),
        StatusCode::NO_CONTENT
    );
    // creation-with-upload: the whole file in the POST.
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-length", "10")
        .header("content-type", OCTETS)
        .body("0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(offset_of(&res), 10);
    let id = res.headers()["location"]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(content(&app, &user, &id).await, b"0123456789");
    // An empty file is committed by its creation alone.
    let id = create(&app, &user, 0).await;
    let res = app
        .client
        .get(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<serde_json::Value>().await.unwrap()["size"], 0);
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 3);
    assert_eq!(staging_left(&app).await, 0);
}

#[tokio::test]
async fn with_cors_a_browser_may_send_and_read_the_tus_headers() {
    let mut settings = test_settings();
    settings.cors_origins = vec!["https://app.example".into()];
    let app = spawn_app_with(settings).await;
    let user = app.create_user("cors").await;
    let pre = app
        .client
        .request(Method::OPTIONS, app.url("/v1/uploads/x"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PATCH")
        .header(
            "access-control-request-headers",
            "tus-resumable,upload-offset,upload-checksum",
        )
        .send()
        .await
        .unwrap();
    assert!(pre.status().is_success(), "{}", pre.status());
    let allowed = |name: &str| pre.headers()[name].to_str().unwrap().to_ascii_lowercase();
    assert!(allowed("access-control-allow-methods").contains("patch"));
    for h in ["tus-resumable", "upload-offset", "upload-checksum"] {
        assert!(allowed("access-control-allow-headers").contains(h), "{h}");
    }
    let id = create(&app, &user, 10).await;
    let res = app
        .client
        .request(Method::HEAD, app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap();
    let exposed = res.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for h in [
        "upload-offset",
        "upload-length",
        "upload-expires",
        "tus-resumable",
        "location",
    ] {
        assert!(exposed.contains(h), "{h} in {exposed}");
    }
}

/// A resumable upload's type is decided as a plain upload's: detected from
/// its bytes when the client names none, and held to FILEDOCK_ALLOWED_TYPES,
/// so a claimed `image/png` carrying an executable is refused with nothing
/// kept.
#[tokio::test]
async fn a_resumable_upload_type_is_detected_and_held_to_the_allow_list() {
    const PNG_START: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    // An ELF header (64 bytes): what `infer` needs to see an executable.
    let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
    elf.resize(64, 0);
    let mut settings = test_settings();
    settings.allowed_types = filedock::config::AllowedTypes::parse("image/*").unwrap();
    let app = spawn_app_with(settings).await;
    let user = app.create_user("typed").await;

    let id = create_typed(&app, &user, PNG_START.len(), None).await;
    let done = patch(&app, &user, &id, 0, PNG_START).await;
    assert_eq!(done.status(), StatusCode::NO_CONTENT);
    let stored = app.download(&user, &id).await;
    assert_eq!(
        stored.headers()["content-type"],
        "image/png",
        "detected from the bytes"
    );

    let id = create_typed(&app, &user, elf.len(), Some("image/png")).await;
    let refused = patch(&app, &user, &id, 0, &elf).await;
    assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        app.download(&user, &id).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        assert_bucket_matches_metadata(&app.state).await,
        1,
        "only the PNG"
    );
    assert_eq!(staging_left(&app).await, 0);
    assert!(
        app.state
            .ports
            .meta
            .resumable_by_id_alone(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

/// An upload that ends on its creation (an empty file) and whose file is
/// refused answers the refusal, not 201 with a complete offset: the client
/// must not take it for stored.
#[tokio::test]
async fn an_upload_that_ends_at_its_creation_answers_its_refusal() {
    let mut settings = test_settings();
    settings.allowed_types = filedock::config::AllowedTypes::parse("image/*").unwrap();
    let app = spawn_app_with(settings).await;
    let user = app.create_user("empty").await;
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-length", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
}
