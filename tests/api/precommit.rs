//! The pre-commit hook (`FILEDOCK_PRECOMMIT_HOOK_URL`, issue 46 item 2;
//! README "Pre-commit hook"): once an upload's bytes are stored and before
//! its commit, filedock POSTs its metadata and a short-lived read URL of its
//! bytes, signed as webhooks are, to a receiver in the test process (which
//! verifies each call with the `standardwebhooks` crate). A 2xx commits; a
//! 4xx answers the client `422 rejected_by_hook` with the hook's reason and
//! nothing is stored (no file, no usage, no event, no blob, no intent); a
//! timeout or a 5xx follows `FILEDOCK_PRECOMMIT_HOOK_FAILURE` (`reject`:
//! 503; `allow`: it commits). Plain uploads and a resumable upload's last
//! PATCH alike. On the embedded adapters and (`FILEDOCK_TEST_BACKEND=real`)
//! on MongoDB, S3 and Redis. Every request and every wait is bounded.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use base64::Engine;
use filedock::{
    config::{HookFailure, LockScope, PrecommitSettings, Settings},
    http::AppState,
};
use reqwest::{Response, StatusCode, Url};
use secrecy::SecretString;
use serde_json::Value;

use crate::{
    events::all_events,
    helpers::*,
    support::webhook_receiver::{Delivery, Reply, WebhookReceiver, random_secret, summary},
    tus::{TUS, data, head, patch, staging_left},
    tus_limits::counts,
};

/// The longest a whole test may take.
const TEST_BOUND: Duration = Duration::from_secs(240);
/// The longest one HTTP request of a test may take.
const REQUEST_BOUND: Duration = Duration::from_secs(60);
/// The longest wait for a hook call that should come.
const WAIT: Duration = Duration::from_secs(20);
/// The filenames the refusing hook refuses contain this.
const REFUSED: &str = "evil";

/// Runs `test` at most [`TEST_BOUND`].
async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, test)
        .await
        .expect("the test ran past its bound")
}

/// A fresh instance's settings asking `rx` before each commit, each call
/// given `timeout`, its failures meaning `on_failure`.
fn hook_settings(rx: &WebhookReceiver, timeout: Duration, on_failure: HookFailure) -> Settings {
    let mut s = test_settings();
    // No FILEDOCK_PUBLIC_URL: the read URLs are built on FILEDOCK_BIND's
    // address (README), so it must be one the hook reaches, not port 0.
    s.bind = format!("127.0.0.1:{}", free_port());
    // `/v1/me` as the store has it.
    s.auth_cache_ttl = Duration::ZERO;
    s.precommit = Some(PrecommitSettings {
        url: rx.url(),
        secret: SecretString::from(rx.secret()),
        timeout,
        on_failure,
    });
    s
}

/// Serves `settings` with a client whose every request is bounded.
async fn spawn_bounded(settings: Settings) -> TestApp {
    let mut app = spawn_app_with(settings).await;
    app.client = reqwest::Client::builder()
        .timeout(REQUEST_BOUND)
        .build()
        .unwrap();
    app
}

/// An instance asking `rx` (10 s a call, failures as `on_failure` says).
async fn hooked_app(rx: &WebhookReceiver, on_failure: HookFailure) -> TestApp {
    spawn_bounded(hook_settings(rx, Duration::from_secs(10), on_failure)).await
}

/// A client with no API key, as the hook is.
fn keyless() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_BOUND)
        .build()
        .unwrap()
}

/// `POST /v1/files?filename=` with `content_type` and `bytes`.
async fn upload(
    app: &TestApp,
    user: &TestUser,
    filename: &str,
    content_type: &str,
    bytes: &[u8],
) -> Response {
    app.client
        .post(app.url("/v1/files"))
        .query(&[("filename", filename)])
        .bearer_auth(&user.key)
        .header("content-type", content_type)
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap()
}

/// The status, error code and message of an error answer.
async fn error_of(res: Response) -> (StatusCode, String, String) {
    let status = res.status();
    let text = res.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let field = |f: &str| {
        body["error"][f]
            .as_str()
            .unwrap_or_else(|| panic!("no error.{f} in a {status} answer: {text}"))
            .to_owned()
    };
    (status, field("code"), field("message"))
}

/// The message of a refusal by the hook with `reason`.
fn refused_with(reason: &str) -> String {
    format!("the pre-commit hook rejected this upload: {reason}")
}

/// Every call the hook got, each verified (a signing bug shows here).
fn calls(rx: &WebhookReceiver) -> Vec<Delivery> {
    if let Err(e) = rx.all_verified() {
        panic!("a pre-commit call did not verify: {e}");
    }
    rx.requests()
}

/// Waits until the hook got `n` calls, at most [`WAIT`].
async fn wait_calls(rx: &WebhookReceiver, n: usize) {
    if let Err(e) = rx.wait_for(|log| log.len() >= n, WAIT).await {
        panic!("the hook did not get {n} calls: {e}");
    }
}

/// `GET` of a read URL with no key.
async fn read(url: &str) -> Response {
    keyless().get(url).send().await.unwrap()
}

/// `read_url` with its query parameter `name` set to `value`.
fn with_param(read_url: &str, name: &str, value: &str) -> String {
    let mut url = Url::parse(read_url).unwrap();
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| match k == name {
            true => (k.into_owned(), value.to_owned()),
            false => (k.into_owned(), v.into_owned()),
        })
        .collect();
    url.query_pairs_mut().clear().extend_pairs(pairs);
    url.to_string()
}

/// The query parameter `name` of `url`.
fn param(url: &str, name: &str) -> String {
    Url::parse(url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {url}"))
        .1
        .into_owned()
}

/// `s` with its character at `at` changed to another of base64url's.
fn one_char_changed(s: &str, at: usize) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    chars.into_iter().collect()
}

/// Asserts the call `d` is a verified `upload.precommit` call about file
/// `file_id` of `user` with these metadata, and returns its read URL.
#[allow(clippy::too_many_arguments)]
fn assert_call(
    app: &TestApp,
    d: &Delivery,
    user: &TestUser,
    file_id: &str,
    filename: &str,
    bytes: &[u8],
    content_type: &str,
) -> String {
    let shown = String::from_utf8_lossy(&d.body).into_owned();
    assert!(
        d.verified.is_ok(),
        "not verified: {:?}: {shown}",
        d.verified
    );
    assert_eq!((d.method.as_str(), d.path.as_str()), ("POST", "/hooks"));
    assert_eq!(d.content_type, "application/json");
    assert_eq!(d.webhook_id, format!("precommit_{file_id}"), "{shown}");
    let ts: i64 = d.webhook_timestamp.parse().expect("a unix timestamp");
    let now = chrono::Utc::now().timestamp();
    assert!(
        (now - 120..=now + 1).contains(&ts),
        "webhook-timestamp {ts}"
    );
    assert_eq!(d.kind.as_deref(), Some("upload.precommit"), "{shown}");
    assert_eq!(d.data_str("owner_id"), Some(user.id.as_str()), "{shown}");
    assert_eq!(d.data_str("file_id"), Some(file_id), "{shown}");
    assert_eq!(d.data_str("filename"), Some(filename), "{shown}");
    assert_eq!(d.data_u64("size"), Some(bytes.len() as u64), "{shown}");
    assert_eq!(
        d.data_str("sha256"),
        Some(sha256_hex(bytes).as_str()),
        "{shown}"
    );
    assert_eq!(d.data_str("content_type"), Some(content_type), "{shown}");
    let read_url = d.data_str("read_url").expect("a read_url").to_owned();
    assert!(
        read_url.starts_with(&app.url(&format!("/v1/precommit/{file_id}?"))),
        "the read URL {read_url} is not on {}",
        app.base
    );
    assert_eq!(param(&read_url, "user"), user.id);
    // About five minutes from now, and the URL's own expiry.
    let expires_at = d.data_str("read_url_expires_at").expect("an expiry");
    let expires_at = chrono::DateTime::parse_from_rfc3339(expires_at).unwrap();
    let left = expires_at.timestamp() - now;
    assert!((240..=301).contains(&left), "expires in {left} s: {shown}");
    assert_eq!(
        param(&read_url, "expires"),
        expires_at.timestamp().to_string()
    );
    let body = d.json.as_ref().unwrap();
    assert!(body["timestamp"].is_string(), "{shown}");
    assert_eq!(
        body.as_object().unwrap().len(),
        3,
        "type, timestamp, data: {shown}"
    );
    read_url
}

/// Asserts `read_url` serves exactly `bytes`, with no key.
async fn assert_reads(read_url: &str, bytes: &[u8]) {
    let res = read(read_url).await;
    assert_eq!(res.status(), StatusCode::OK, "GET {read_url}");
    let h = res.headers();
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["content-length"], bytes.len().to_string().as_str());
    let got = res.bytes().await.unwrap();
    assert!(
        got == bytes,
        "the read URL served {} other bytes",
        got.len()
    );
}

/// The hook, reading the read URL of call `d` during the call (before it
/// answered; [`WebhookReceiver::read_urls_first`]), read exactly `bytes`.
fn assert_read_during(rx: &WebhookReceiver, d: &Delivery, bytes: &[u8]) {
    match &rx.read_during(d) {
        Some(Ok(read)) => assert!(
            read == bytes,
            "the hook read {} other bytes during its call",
            read.len()
        ),
        other => panic!("the hook could not read the bytes during its call: {other:?}"),
    }
}

/// The events of `user` whose type starts with `file.`.
async fn file_events(app: &TestApp, user: &TestUser) -> Vec<Value> {
    all_events(app, user, 100)
        .await
        .into_iter()
        .filter(|e| e["type"].as_str().unwrap_or_default().starts_with("file."))
        .collect()
}

/// `/v1/me`'s usage.
async fn usage(app: &TestApp, user: &TestUser) -> Value {
    let (status, me) = app.json("GET", "/v1/me", user, None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    me["usage"].clone()
}

/// Nothing of `user`'s is stored: no file listed, no usage, no upload open
/// or reserved, no file event, no blob, no intent; and `read_url` (the one
/// the hook got, if any) now answers 404.
async fn assert_nothing_stored(app: &TestApp, user: &TestUser, read_url: Option<&str>) {
    assert_eq!(
        app.list_ids(user).await,
        Vec::<String>::new(),
        "files listed"
    );
    let u = usage(app, user).await;
    for (field, want) in [
        ("used_bytes", 0),
        ("file_count", 0),
        ("reserved_bytes", 0),
        ("open_uploads", 0),
        ("uploads_in_flight", 0),
    ] {
        assert_eq!(u[field], want, "{field} in {u}");
    }
    let events = file_events(app, user).await;
    assert!(events.is_empty(), "file events were written: {events:?}");
    assert_eq!(
        app.blob_keys(user).await,
        Vec::<String>::new(),
        "blobs left"
    );
    assert_eq!(app.intents().await, 0, "upload intents left");
    if let Some(url) = read_url {
        let res = read(url).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::NOT_FOUND, "not_found".to_owned()),
            "the read URL of bytes that should be gone"
        );
    }
}

/// `user`'s file `id` is there, with `bytes`, and committed once.
async fn assert_committed(app: &TestApp, user: &TestUser, id: &str, bytes: &[u8]) {
    let res = app.download(user, id).await;
    assert_eq!(res.status(), StatusCode::OK, "GET the content of {id}");
    let got = res.bytes().await.unwrap();
    assert!(got == bytes, "the file has {} other bytes", got.len());
    assert_eq!(
        app.list_ids(user).await,
        [id.to_owned()],
        "exactly one file"
    );
    let u = usage(app, user).await;
    assert_eq!(
        (
            &u["used_bytes"],
            &u["file_count"],
            &u["reserved_bytes"],
            &u["open_uploads"]
        ),
        (&bytes.len().into(), &1.into(), &0.into(), &0.into()),
        "{u}"
    );
    let events = file_events(app, user).await;
    let created: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "file.created")
        .collect();
    assert_eq!(created.len(), 1, "one file.created: {events:?}");
    assert_eq!(created[0]["data"]["file_id"], id, "{events:?}");
}

/// A counter of the hook's calls by outcome.
async fn hook_calls(app: &TestApp, outcome: &str) -> f64 {
    app.metric(
        "filedock_precommit_calls_total",
        &format!("outcome=\"{outcome}\""),
    )
    .await
}

// ---- plain uploads ----

/// Accepted: one verified call with the upload's metadata; its read URL
/// serves exactly the bytes with no key, and no changed or made-up one.
#[tokio::test]
async fn an_accepted_upload_commits_after_one_signed_call_with_a_read_url_of_its_bytes() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        let ann = app.create_user("ann").await;
        let bytes = b"hello, pre-commit hook".repeat(100);
        let res = upload(&app, &ann, "hello.txt", "text/plain", &bytes).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let file: Value = res.json().await.unwrap();
        let id = file["id"].as_str().unwrap().to_owned();
        assert_eq!(file["sha256"], sha256_hex(&bytes));
        let content_type = file["content_type"].as_str().unwrap().to_owned();

        let got = calls(&rx);
        assert_eq!(got.len(), 1, "one call:\n{}", summary(&got));
        assert!(got[0].accepted());
        let read_url = assert_call(&app, &got[0], &ann, &id, "hello.txt", &bytes, &content_type);
        assert_read_during(&rx, &got[0], &bytes);
        assert_reads(&read_url, &bytes).await;
        assert_committed(&app, &ann, &id, &bytes).await;

        // Changed, it is not one signed.
        let sig = param(&read_url, "signature");
        let expires = param(&read_url, "expires");
        let changed = [
            (
                "the signature",
                with_param(&read_url, "signature", &one_char_changed(&sig, 5)),
            ),
            (
                "the signature cut",
                with_param(&read_url, "signature", &sig[..sig.len() - 2]),
            ),
            (
                "the signature not base64",
                with_param(&read_url, "signature", "*not-base64*"),
            ),
            (
                "the expiry",
                with_param(
                    &read_url,
                    "expires",
                    &(expires.parse::<i64>().unwrap() + 1).to_string(),
                ),
            ),
            (
                "another owner",
                with_param(&read_url, "user", &uuid::Uuid::now_v7().to_string()),
            ),
        ];
        for (what, url) in changed {
            let res = read(&url).await;
            assert_eq!(
                error_code(res).await,
                (StatusCode::FORBIDDEN, "link_invalid".to_owned()),
                "{what} changed: {url}"
            );
        }
        // Another file's id in a URL shaped as the hook's: its signature
        // does not match.
        let other = uuid::Uuid::now_v7().to_string();
        let made_up = read_url.replacen(&id, &other, 1);
        assert_ne!(made_up, read_url);
        let res = read(&made_up).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::FORBIDDEN, "link_invalid".to_owned()),
            "an unknown file id: {made_up}"
        );
        // Nor is a download link's signature a read URL's, nor the
        // reverse: a read URL's query on the download link route.
        let as_download = read_url.replacen("/v1/precommit/", "/v1/links/", 1);
        let res = read(&as_download).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{as_download}");
        // The read URL needs no key, and a key does not replace its
        // signature.
        let res = app
            .client
            .get(with_param(
                &read_url,
                "signature",
                &one_char_changed(&sig, 5),
            ))
            .bearer_auth(&ann.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN);

        // Once the file is deleted, its bytes are gone: 404.
        let (status, _) = app
            .json("DELETE", format!("/v1/files/{id}"), &ann, None)
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let res = read(&read_url).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::NOT_FOUND, "not_found".to_owned())
        );
        assert_eq!(hook_calls(&app, "accepted").await, 1.0);
        assert_eq!(calls(&rx).len(), 1, "the reads asked nothing");
    })
    .await;
}

/// Without a hook, no read URL is valid.
#[tokio::test]
async fn without_a_hook_no_read_url_is_valid() {
    bounded(async {
        let app = spawn_bounded(test_settings()).await;
        let ann = app.create_user("ann").await;
        let res = upload(&app, &ann, "a.txt", "text/plain", b"abc").await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let id = res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let url = app.url(&format!(
            "/v1/precommit/{id}?user={}&expires={}&signature=AAAA",
            ann.id,
            chrono::Utc::now().timestamp() + 60
        ));
        assert_eq!(
            error_code(read(&url).await).await,
            (StatusCode::FORBIDDEN, "link_invalid".to_owned())
        );
    })
    .await;
}

/// Refused with a JSON reason: 422 `rejected_by_hook` with it, and nothing
/// stored; the read URL the hook got now answers 404. A plain-text body
/// is the reason as it is (trimmed, its first 500 characters), an empty
/// one `answered` and the status. Another upload is still accepted.
#[tokio::test]
async fn a_refused_upload_is_answered_422_with_the_reason_and_nothing_is_stored() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        let long = "x".repeat(600);
        rx.reply_to_filenames([
            (
                format!("{REFUSED}.exe"),
                Reply::reason(StatusCode::UNPROCESSABLE_ENTITY, "no executables"),
            ),
            (
                format!("{REFUSED}.txt"),
                Reply::text(StatusCode::BAD_REQUEST, "  not today, thank you \n"),
            ),
            (format!("{REFUSED}.bin"), Reply::empty(StatusCode::CONFLICT)),
            (
                format!("{REFUSED}.long"),
                Reply::text(StatusCode::BAD_REQUEST, &long),
            ),
            (
                format!("{REFUSED}.json"),
                Reply::text(StatusCode::GONE, r#"{"why":"no reason field"}"#),
            ),
        ]);
        let cases = [
            ("evil.exe", "no executables".to_owned()),
            ("evil.txt", "not today, thank you".to_owned()),
            ("evil.bin", "answered 409".to_owned()),
            ("evil.long", "x".repeat(500)),
            ("evil.json", r#"{"why":"no reason field"}"#.to_owned()),
        ];
        for (i, (name, reason)) in cases.iter().enumerate() {
            let user = app.create_user(&format!("u{i}")).await;
            let bytes = format!("MZ {name} {i}").into_bytes();
            let res = upload(&app, &user, name, "application/octet-stream", &bytes).await;
            assert_eq!(
                error_of(res).await,
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "rejected_by_hook".to_owned(),
                    refused_with(reason)
                ),
                "{name}"
            );
            let got = calls(&rx);
            assert_eq!(got.len(), i + 1, "one call per upload:\n{}", summary(&got));
            let d = &got[i];
            assert!(d.refused(), "{name}");
            assert_eq!(d.data_str("filename"), Some(*name));
            assert_eq!(d.data_str("owner_id"), Some(user.id.as_str()));
            assert_eq!(d.data_str("sha256"), Some(sha256_hex(&bytes).as_str()));
            assert_eq!(d.data_u64("size"), Some(bytes.len() as u64));
            assert_read_during(&rx, d, &bytes);
            let file_id = d.data_str("file_id").unwrap();
            assert_eq!(d.webhook_id, format!("precommit_{file_id}"));
            assert_nothing_stored(&app, &user, d.data_str("read_url")).await;
            // Nor is it found by the id it would have had.
            let (status, _) = app
                .json("GET", format!("/v1/files/{file_id}"), &user, None)
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{name}");
        }
        assert_eq!(hook_calls(&app, "rejected").await, cases.len() as f64);

        // The hook decides per upload: another of the same user commits.
        let ann = app.create_user("ann").await;
        let res = upload(&app, &ann, "evil.exe", "application/octet-stream", b"MZ").await;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let res = upload(&app, &ann, "fine.txt", "text/plain", b"fine").await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let id = res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_committed(&app, &ann, &id, b"fine").await;
        assert_eq!(calls(&rx).len(), cases.len() + 2);
    })
    .await;
}

/// On each commit path (one transaction each, group commit) and lock
/// scope (with `upload` the category lock is held through the call): a
/// refusal, raw or multipart, and a failure under `reject` store nothing,
/// and the same user's next upload commits (whatever held a lock let go).
#[tokio::test]
async fn every_commit_path_and_lock_scope_lets_go_of_a_refused_upload() {
    bounded(async {
        for (group_commit, scope) in [
            (true, LockScope::Commit),
            (false, LockScope::Commit),
            (true, LockScope::Upload),
            (false, LockScope::Upload),
        ] {
            let what = format!("group commit {group_commit}, scope {scope:?}");
            let rx = WebhookReceiver::start().await;
            let mut settings = hook_settings(&rx, Duration::from_secs(10), HookFailure::Reject);
            settings.upload_group_commit = group_commit;
            settings.lock.scope = scope;
            // A lock left held shows as a 429 after 2 s, not a hang.
            settings.lock.wait_timeout = Duration::from_secs(2);
            let app = spawn_bounded(settings).await;
            let ann = app.create_user("ann").await;
            rx.reply_to_filenames([(
                REFUSED,
                Reply::reason(StatusCode::UNPROCESSABLE_ENTITY, "no"),
            )]);
            let res = upload(&app, &ann, "evil.txt", "text/plain", b"raw").await;
            assert_eq!(error_of(res).await.1, "rejected_by_hook", "{what}: raw");
            let res = app
                .upload_multipart(&ann, "evil.txt", b"multipart".to_vec())
                .await;
            assert_eq!(
                error_of(res).await.1,
                "rejected_by_hook",
                "{what}: multipart"
            );
            rx.fail_all();
            let res = upload(&app, &ann, "fine.txt", "text/plain", b"failed").await;
            assert_eq!(
                error_of(res).await.1,
                "dependency_unavailable",
                "{what}: failed"
            );
            assert_eq!(calls(&rx).len(), 3, "{what}");
            assert_nothing_stored(&app, &ann, None).await;
            rx.answer_ok();
            // A lock left held would make this a 429 lock_timeout.
            let res = upload(&app, &ann, "fine.txt", "text/plain", b"fine").await;
            assert_eq!(res.status(), StatusCode::CREATED, "{what}");
            let id = res.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            assert_committed(&app, &ann, &id, b"fine").await;
        }
    })
    .await;
}

/// A hook slower than `FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS`: under
/// `reject` a 503 after about the timeout and nothing stored; under
/// `allow` the upload commits.
#[tokio::test]
async fn a_hook_that_times_out_rejects_or_allows_as_the_policy_says() {
    bounded(async {
        for policy in [HookFailure::Reject, HookFailure::Allow] {
            let rx = WebhookReceiver::start().await;
            rx.slow(Duration::from_secs(5));
            let app = spawn_bounded(hook_settings(&rx, Duration::from_secs(1), policy)).await;
            let ann = app.create_user("ann").await;
            let bytes = b"slowly checked".to_vec();
            let began = Instant::now();
            let res = upload(&app, &ann, "slow.txt", "text/plain", &bytes).await;
            let took = began.elapsed();
            assert!(
                took >= Duration::from_millis(900) && took < Duration::from_secs(4),
                "{policy:?}: answered after {took:?}, not after the 1 s timeout"
            );
            let got = calls(&rx);
            assert_eq!(got.len(), 1, "{policy:?}: one call:\n{}", summary(&got));
            let read_url = got[0].data_str("read_url").unwrap().to_owned();
            match policy {
                HookFailure::Reject => {
                    assert_eq!(
                        res.headers()
                            .get("retry-after")
                            .map(|v| v.to_str().unwrap()),
                        Some("1")
                    );
                    assert_eq!(
                        error_of(res).await,
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "dependency_unavailable".to_owned(),
                            "the pre-commit hook is unavailable".to_owned()
                        )
                    );
                    assert_nothing_stored(&app, &ann, Some(&read_url)).await;
                    assert_eq!(hook_calls(&app, "failed_rejected").await, 1.0);
                }
                HookFailure::Allow => {
                    assert_eq!(res.status(), StatusCode::CREATED);
                    let id = res.json::<Value>().await.unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_owned();
                    assert_eq!(got[0].data_str("file_id"), Some(id.as_str()));
                    assert_committed(&app, &ann, &id, &bytes).await;
                    assert_reads(&read_url, &bytes).await;
                    assert_eq!(hook_calls(&app, "failed_allowed").await, 1.0);
                }
            }
            // filedock gave up before the slow answer came.
            assert!(!got[0].answered, "{policy:?}: answered before the timeout");
        }
    })
    .await;
}

/// A 5xx, a 4xx that says the call itself failed (401, 404, 429: not a
/// verdict on the upload), or no hook listening at all: under `reject` a
/// 503 and nothing stored; under `allow` the upload commits.
#[tokio::test]
async fn a_hook_answering_5xx_or_away_rejects_or_allows_as_the_policy_says() {
    bounded(async {
        let failures = [
            Some(StatusCode::INTERNAL_SERVER_ERROR),
            Some(StatusCode::UNAUTHORIZED),
            Some(StatusCode::NOT_FOUND),
            Some(StatusCode::TOO_MANY_REQUESTS),
            None,
        ];
        for policy in [HookFailure::Reject, HookFailure::Allow] {
            let rx = WebhookReceiver::start().await;
            let app = hooked_app(&rx, policy).await;
            for (n, failure) in failures.iter().enumerate() {
                let user = app.create_user(&format!("u{n}")).await;
                let before = calls(&rx).len();
                match failure {
                    Some(status) => {
                        rx.reply_to_filenames([("x.txt", Reply::reason(*status, "no"))])
                    }
                    None => rx.down().await,
                }
                let bytes = format!("checked by nobody {n}").into_bytes();
                let res = upload(&app, &user, "x.txt", "text/plain", &bytes).await;
                let what = format!("{policy:?}, {failure:?}");
                let got = calls(&rx);
                // Away, the hook heard nothing; else this upload's one call.
                let expected = before + usize::from(failure.is_some());
                assert_eq!(got.len(), expected, "{what}: the calls:\n{}", summary(&got));
                let read_url = match failure {
                    Some(_) => got[before].data_str("read_url").map(str::to_owned),
                    None => None,
                };
                rx.up().await;
                rx.answer_ok();
                match policy {
                    HookFailure::Reject => {
                        assert_eq!(
                            error_of(res).await,
                            (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "dependency_unavailable".to_owned(),
                                "the pre-commit hook is unavailable".to_owned()
                            ),
                            "{what}"
                        );
                        assert_nothing_stored(&app, &user, read_url.as_deref()).await;
                    }
                    HookFailure::Allow => {
                        assert_eq!(res.status(), StatusCode::CREATED, "{what}");
                        let id = res.json::<Value>().await.unwrap()["id"]
                            .as_str()
                            .unwrap()
                            .to_owned();
                        assert_committed(&app, &user, &id, &bytes).await;
                    }
                }
            }
            let outcome = match policy {
                HookFailure::Reject => "failed_rejected",
                HookFailure::Allow => "failed_allowed",
            };
            let n = failures.len() as f64;
            assert_eq!(hook_calls(&app, outcome).await, n, "{policy:?}");
        }
    })
    .await;
}

/// A replay of an accepted upload's `Idempotency-Key` is not asked (even
/// with the hook failing under `reject`); a key whose upload was refused
/// is free: the same request, accepted then, commits.
#[tokio::test]
async fn an_idempotency_key_replay_does_not_ask_the_hook_again() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        let app = hooked_app(&rx, HookFailure::Reject).await;
        let ann = app.create_user("ann").await;
        let keyed = |key: &'static str, name: &'static str, body: &'static [u8]| {
            app.client
                .post(app.url("/v1/files"))
                .query(&[("filename", name)])
                .bearer_auth(&ann.key)
                .header("idempotency-key", key)
                .header("content-type", "text/plain")
                .body(body)
                .send()
        };
        let first = keyed("k1", "a.txt", b"body A").await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let id = first.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(calls(&rx).len(), 1);
        let replay = keyed("k1", "a.txt", b"body A").await.unwrap();
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.json::<Value>().await.unwrap()["id"], id.as_str());
        assert_eq!(
            calls(&rx).len(),
            1,
            "the replay asked the hook:\n{}",
            summary(&rx.requests())
        );
        // Even with the hook failing (it would answer 503 if asked).
        rx.fail_all();
        let replay = keyed("k1", "a.txt", b"body A").await.unwrap();
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(
            calls(&rx).len(),
            1,
            "the replay asked the hook:\n{}",
            summary(&rx.requests())
        );
        assert_committed(&app, &ann, &id, b"body A").await;

        // Refused, a key is not used up.
        rx.reply_to_filenames([(
            REFUSED,
            Reply::reason(StatusCode::UNPROCESSABLE_ENTITY, "no"),
        )]);
        let refused = keyed("k2", "evil.txt", b"body B").await.unwrap();
        assert_eq!(error_of(refused).await.1, "rejected_by_hook");
        assert_eq!(calls(&rx).len(), 2);
        rx.answer_ok();
        let again = keyed("k2", "evil.txt", b"body B").await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert!(
            again.headers().get("idempotent-replayed").is_none(),
            "a replay of a refusal"
        );
        let second = again.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(calls(&rx).len(), 3);
        let mut ids = app.list_ids(&ann).await;
        ids.sort();
        let mut want = vec![id, second];
        want.sort();
        assert_eq!(ids, want);
    })
    .await;
}

// ---- resumable uploads ----

/// Creates a resumable upload of `len` bytes named `filename`.
async fn tus_create(app: &TestApp, user: &TestUser, filename: &str, len: usize) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let metadata = format!(
        "filename {},filetype {}",
        b64.encode(filename),
        b64.encode("application/x-test")
    );
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
    assert_eq!(
        res.status(),
        StatusCode::CREATED,
        "{}",
        res.text().await.unwrap()
    );
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    location.rsplit('/').next().unwrap().to_owned()
}

/// Sends every byte of `bytes` but the last `last` in PATCHes of at most
/// `chunk`, each answered 204; then the rest in a last PATCH, answered
/// as it is.
async fn tus_send(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    bytes: &[u8],
    chunk: usize,
    last: usize,
) -> Response {
    let mut offset = 0;
    let end = bytes.len() - last;
    while offset < end {
        let to = (offset + chunk).min(end);
        let res = patch(app, user, id, offset, &bytes[offset..to]).await;
        assert_eq!(
            res.status(),
            StatusCode::NO_CONTENT,
            "the PATCH at {offset}"
        );
        offset = to;
    }
    patch(app, user, id, offset, &bytes[offset..]).await
}

/// The sizes of the resumable uploads: one part, and (on S3 past its part
/// size; on the embedded store past its 8 MiB too) several.
fn tus_sizes(app: &TestApp) -> [(usize, &'static str); 2] {
    let part = app
        .settings
        .s3
        .as_ref()
        .map_or(8 * 1024 * 1024, |s3| s3.part_size)
        .max(8 * 1024 * 1024);
    [(1000, "small"), (part + 1024 * 1024 + 13, "multipart")]
}

/// Accepted: the last PATCH is 204 after one call, with the upload's own
/// id; the file is there.
#[tokio::test]
async fn a_resumable_upload_the_hook_accepts_commits_at_its_last_patch() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        for (n, (len, what)) in tus_sizes(&app).into_iter().enumerate() {
            let user = app.create_user(what).await;
            let bytes = data(len);
            let id = tus_create(&app, &user, &format!("{what}.bin"), len).await;
            // In two PATCHes: only the last asks.
            let half = len / 2;
            let res = patch(&app, &user, &id, 0, &bytes[..half]).await;
            assert_eq!(res.status(), StatusCode::NO_CONTENT, "{what}");
            assert_eq!(calls(&rx).len(), n, "{what}: asked before the last bytes");
            let res = patch(&app, &user, &id, half, &bytes[half..]).await;
            assert_eq!(res.status(), StatusCode::NO_CONTENT, "{what}");
            assert_eq!(res.headers()["upload-offset"], len.to_string().as_str());
            let got = calls(&rx);
            assert_eq!(got.len(), n + 1, "{what}: one call:\n{}", summary(&got));
            let (status, file) = app
                .json("GET", format!("/v1/files/{id}"), &user, None)
                .await;
            assert_eq!(status, StatusCode::OK, "{what}: {file}");
            let content_type = file["content_type"].as_str().unwrap();
            let read_url = assert_call(
                &app,
                &got[n],
                &user,
                &id,
                &format!("{what}.bin"),
                &bytes,
                content_type,
            );
            assert_read_during(&rx, &got[n], &bytes);
            assert_reads(&read_url, &bytes).await;
            assert_committed(&app, &user, &id, &bytes).await;
            assert_eq!(
                head(&app, &user, &id).await,
                (StatusCode::OK, Some(len)),
                "{what}"
            );
            assert_eq!(
                calls(&rx).len(),
                n + 1,
                "{what}: the HEAD of a committed upload asked"
            );
        }
    })
    .await;
}

/// Refused: the last PATCH answers 422 `rejected_by_hook`; the upload is
/// ended (HEAD 404), its reservation given back, nothing stored, no event.
#[tokio::test]
async fn a_resumable_upload_the_hook_refuses_is_ended_and_nothing_is_stored() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        rx.reply_to_filenames([(
            REFUSED,
            Reply::reason(StatusCode::UNPROCESSABLE_ENTITY, "no executables"),
        )]);
        for (n, (len, what)) in tus_sizes(&app).into_iter().enumerate() {
            let user = app.create_user(what).await;
            let bytes = data(len);
            let id = tus_create(&app, &user, &format!("{REFUSED}-{what}.exe"), len).await;
            assert_eq!(
                counts(&app, &user).await,
                (0, len as i64, 1),
                "{what}: reserved"
            );
            let res = tus_send(&app, &user, &id, &bytes, 6 * 1024 * 1024, (len / 3).max(1)).await;
            assert_eq!(
                error_of(res).await,
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "rejected_by_hook".to_owned(),
                    refused_with("no executables")
                ),
                "{what}"
            );
            let got = calls(&rx);
            assert_eq!(got.len(), n + 1, "{what}: one call:\n{}", summary(&got));
            assert!(got[n].refused());
            assert_eq!(got[n].webhook_id, format!("precommit_{id}"));
            assert_eq!(got[n].data_str("file_id"), Some(id.as_str()));
            assert_eq!(got[n].data_str("sha256"), Some(sha256_hex(&bytes).as_str()));
            assert_eq!(got[n].data_u64("size"), Some(len as u64));
            assert_read_during(&rx, &got[n], &bytes);
            assert_eq!(
                head(&app, &user, &id).await.0,
                StatusCode::NOT_FOUND,
                "{what}"
            );
            let (status, _) = app
                .json("GET", format!("/v1/files/{id}"), &user, None)
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{what}");
            assert_nothing_stored(&app, &user, got[n].data_str("read_url")).await;
            assert_eq!(staging_left(&app).await, 0, "{what}: staging left");
            // A PATCH at its end finds nothing either.
            let res = patch(&app, &user, &id, len, b"").await;
            assert_eq!(res.status(), StatusCode::NOT_FOUND, "{what}");
            assert_eq!(calls(&rx).len(), n + 1, "{what}: asked again after its end");
        }
    })
    .await;
}

/// The hook away under `reject`: the last PATCH answers 503 and the upload
/// stays, its bytes stored and its reservation held; once the hook answers
/// 2xx, a HEAD (or a PATCH at the end) commits it, once.
#[tokio::test]
async fn a_resumable_upload_whose_hook_is_away_commits_at_the_next_head_or_patch() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        for (len, what) in tus_sizes(&app) {
            for retry_by_head in [true, false] {
                let how = if retry_by_head { "HEAD" } else { "PATCH" };
                let what = format!("{what}, retried by {how}");
                let user = app.create_user(&what).await;
                let bytes = data(len);
                let id = tus_create(&app, &user, "later.bin", len).await;
                // Down (connection refused) for one, 500 for the other.
                match retry_by_head {
                    true => rx.down().await,
                    false => rx.fail_all(),
                }
                let before = calls(&rx).len();
                let res =
                    tus_send(&app, &user, &id, &bytes, 6 * 1024 * 1024, (len / 3).max(1)).await;
                assert_eq!(
                    error_of(res).await,
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "dependency_unavailable".to_owned(),
                        "the pre-commit hook is unavailable".to_owned()
                    ),
                    "{what}"
                );
                // Still away: not committed, its reservation still held.
                let (status, offset) = head(&app, &user, &id).await;
                assert!(
                    !(status == StatusCode::OK && offset == Some(len)),
                    "{what}: the HEAD says complete with the hook away ({status}, {offset:?})"
                );
                assert_eq!(app.list_ids(&user).await, Vec::<String>::new(), "{what}");
                assert!(file_events(&app, &user).await.is_empty(), "{what}");
                assert_eq!(
                    counts(&app, &user).await,
                    (0, len as i64, 1),
                    "{what}: reserved"
                );
                // Back.
                rx.up().await;
                rx.answer_ok();
                let asked = calls(&rx).len();
                match retry_by_head {
                    true => {
                        assert_eq!(
                            head(&app, &user, &id).await,
                            (StatusCode::OK, Some(len)),
                            "{what}"
                        );
                    }
                    false => {
                        let res = patch(&app, &user, &id, len, b"").await;
                        assert_eq!(res.status(), StatusCode::NO_CONTENT, "{what}");
                        assert_eq!(res.headers()["upload-offset"], len.to_string().as_str());
                    }
                }
                let got = calls(&rx);
                assert_eq!(
                    got.len(),
                    asked + 1,
                    "{what}: one more call:\n{}",
                    summary(&got)
                );
                let last = got.last().unwrap();
                assert!(last.accepted(), "{what}");
                let (status, file) = app
                    .json("GET", format!("/v1/files/{id}"), &user, None)
                    .await;
                assert_eq!(status, StatusCode::OK, "{what}: {file}");
                let read_url = assert_call(
                    &app,
                    last,
                    &user,
                    &id,
                    "later.bin",
                    &bytes,
                    file["content_type"].as_str().unwrap(),
                );
                assert_read_during(&rx, last, &bytes);
                assert_reads(&read_url, &bytes).await;
                assert_committed(&app, &user, &id, &bytes).await;
                // Every call about it, failed or not, had its one id.
                for d in &got[before..] {
                    assert_eq!(d.webhook_id, format!("precommit_{id}"), "{what}");
                }
                // Committed: asked no more.
                assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(len)));
                let res = patch(&app, &user, &id, len, b"").await;
                assert_eq!(res.status(), StatusCode::NO_CONTENT, "{what}");
                assert_eq!(
                    calls(&rx).len(),
                    got.len(),
                    "{what}: asked after its commit"
                );
            }
        }
    })
    .await;
}

// ---- settings ----

/// Start-up refuses a hook URL without `FILEDOCK_WEBHOOK_SECRET`, one not
/// `http(s)://`, a timeout of 0 and a policy other than reject or allow;
/// defaults: 10 s, reject. A secret that is not one is refused when the
/// app is built, and not repeated.
#[tokio::test]
async fn start_up_refuses_a_hook_without_a_secret_or_with_a_bad_policy() {
    bounded(async {
        let lookup = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            Settings::from_lookup(move |n| {
                vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
            })
        };
        let url = ("FILEDOCK_PRECOMMIT_HOOK_URL", "http://127.0.0.1:9/hook");
        let err = lookup(&[url]).unwrap_err().to_string();
        assert!(err.contains("FILEDOCK_WEBHOOK_SECRET"), "{err}");

        let secret = random_secret();
        let with_secret = ("FILEDOCK_WEBHOOK_SECRET", secret.as_str());
        for bad in ["maybe", "Reject", "ALLOW", "deny", " "] {
            let err =
                lookup(&[url, with_secret, ("FILEDOCK_PRECOMMIT_HOOK_FAILURE", bad)]).unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("FILEDOCK_PRECOMMIT_HOOK_FAILURE"),
                "{bad:?}: {err}"
            );
        }
        let err = lookup(&[
            ("FILEDOCK_PRECOMMIT_HOOK_URL", "ftp://127.0.0.1:9/hook"),
            with_secret,
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("FILEDOCK_PRECOMMIT_HOOK_URL"), "{err}");
        let err = lookup(&[
            url,
            with_secret,
            ("FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS", "0"),
        ])
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS"),
            "{err}"
        );

        let s = lookup(&[url, with_secret]).unwrap();
        let p = s.precommit.expect("the hook is on");
        assert_eq!(p.url, "http://127.0.0.1:9/hook");
        assert_eq!(
            (p.timeout, p.on_failure),
            (Duration::from_secs(10), HookFailure::Reject)
        );
        assert!(
            s.webhooks.is_none(),
            "the secret alone turns no webhooks on"
        );
        let s = lookup(&[
            url,
            with_secret,
            ("FILEDOCK_PRECOMMIT_HOOK_FAILURE", "allow"),
            ("FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS", "0.5"),
        ])
        .unwrap();
        let p = s.precommit.expect("the hook is on");
        assert_eq!(
            (p.timeout, p.on_failure),
            (Duration::from_millis(500), HookFailure::Allow)
        );
        assert!(lookup(&[]).unwrap().precommit.is_none(), "off by default");
        assert!(lookup(&[with_secret]).unwrap().precommit.is_none());

        // The secret is checked when the app is built.
        for bad in [
            "whsec_not*base64".to_owned(),
            secret.trim_start_matches("whsec_").to_owned(),
        ] {
            let mut settings = test_settings();
            settings.precommit = Some(PrecommitSettings {
                url: "http://127.0.0.1:9/hook".into(),
                secret: SecretString::from(bad.clone()),
                timeout: Duration::from_secs(1),
                on_failure: HookFailure::Reject,
            });
            match AppState::build(settings).await {
                Ok(_) => panic!("an app was built with the hook secret {bad:?}"),
                Err(e) => {
                    let text = format!("{e:#}");
                    assert!(text.contains("FILEDOCK_WEBHOOK_SECRET"), "{text}");
                    assert!(!text.contains(&bad), "the error repeats the secret: {text}");
                }
            }
        }
    })
    .await;
}

/// The call's `data` has exactly the fields README and `PrecommitCall`
/// document, no other (the values are checked by the tests above).
#[tokio::test]
async fn the_call_s_data_has_exactly_the_documented_fields() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        let app = hooked_app(&rx, HookFailure::Reject).await;
        let ann = app.create_user("ann").await;
        let res = upload(&app, &ann, "a.csv", "text/csv", b"a,b\n1,2\n").await;
        assert_eq!(res.status(), StatusCode::CREATED);
        wait_calls(&rx, 1).await;
        let got = calls(&rx);
        let data = got[0].json.as_ref().unwrap()["data"]
            .as_object()
            .unwrap()
            .clone();
        let mut fields: Vec<&str> = data.keys().map(String::as_str).collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "content_type",
                "file_id",
                "filename",
                "owner_id",
                "read_url",
                "read_url_expires_at",
                "sha256",
                "size"
            ]
        );
        // A committed upload's read URL still reads its bytes (until the
        // file is deleted).
        assert_reads(got[0].data_str("read_url").unwrap(), b"a,b\n1,2\n").await;
    })
    .await;
}

/// Asked outside the commit's lock (README: "a slow answer holds up none of
/// the user's other commits"): one user's uploads at once, each call slow,
/// take about one call, not one call each.
#[tokio::test]
async fn a_slow_hook_does_not_hold_up_the_same_user_s_other_commits() {
    bounded(async {
        const UPLOADS: usize = 3;
        let delay = Duration::from_secs(2);
        let rx = WebhookReceiver::start().await;
        rx.slow(delay);
        let app = hooked_app(&rx, HookFailure::Reject).await;
        let ann = app.create_user("ann").await;
        let began = Instant::now();
        let answers = futures::future::join_all((0..UPLOADS).map(|i| {
            let bytes = format!("upload {i}").into_bytes();
            let app = &app;
            let ann = &ann;
            async move {
                let name = format!("f{i}.txt");
                upload(app, ann, &name, "text/plain", &bytes).await.status()
            }
        }))
        .await;
        let took = began.elapsed();
        assert!(
            answers.iter().all(|s| *s == StatusCode::CREATED),
            "{answers:?}"
        );
        let got = calls(&rx);
        assert_eq!(got.len(), UPLOADS, "{}", summary(&got));
        // All the calls were out at once: the last came before the first
        // was answered.
        let first_answered = got[0].at + delay;
        assert!(
            got.iter().all(|d| d.at < first_answered),
            "the calls were made one after another:\n{}",
            summary(&got)
        );
        assert!(
            took < delay * 2,
            "{UPLOADS} uploads took {took:?} with a hook taking {delay:?}"
        );
        assert_eq!(app.list_ids(&ann).await.len(), UPLOADS);
    })
    .await;
}

/// `POST /v1/uploads` with Upload-Length and the content type
/// `application/offset+octet-stream`: the creation brings `bytes`.
async fn tus_create_with(app: &TestApp, user: &TestUser, filename: &str, bytes: &[u8]) -> Response {
    let b64 = base64::engine::general_purpose::STANDARD;
    app.client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-length", bytes.len().to_string())
        .header(
            "upload-metadata",
            format!("filename {}", b64.encode(filename)),
        )
        .header("content-type", "application/offset+octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap()
}

/// A creation that brings the whole body (creation-with-upload), and an
/// empty file (complete on its creation), are asked by the creation:
/// accepted 201 and committed; refused 422 with nothing stored; the hook
/// away under `reject` 503, and nothing stays (the client never learnt
/// the upload's address).
#[tokio::test]
async fn a_tus_creation_that_completes_the_upload_is_asked() {
    bounded(async {
        let rx = WebhookReceiver::start().await;
        rx.read_urls_first();
        let app = hooked_app(&rx, HookFailure::Reject).await;
        for bytes in [data(3000), Vec::new()] {
            let what = format!("{} bytes", bytes.len());
            // Accepted.
            let user = app.create_user("ok").await;
            let before = calls(&rx).len();
            let res = tus_create_with(&app, &user, "whole.bin", &bytes).await;
            assert_eq!(res.status(), StatusCode::CREATED, "{what}");
            assert_eq!(
                res.headers()["upload-offset"],
                bytes.len().to_string().as_str()
            );
            let id = res.headers()["location"]
                .to_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned();
            let got = calls(&rx);
            assert_eq!(
                got.len(),
                before + 1,
                "{what}: one call:\n{}",
                summary(&got)
            );
            let (status, file) = app
                .json("GET", format!("/v1/files/{id}"), &user, None)
                .await;
            assert_eq!(status, StatusCode::OK, "{what}: {file}");
            let ct = file["content_type"].as_str().unwrap();
            assert_call(&app, &got[before], &user, &id, "whole.bin", &bytes, ct);
            assert_read_during(&rx, &got[before], &bytes);
            assert_committed(&app, &user, &id, &bytes).await;

            // Refused.
            rx.reply_to_filenames([(
                REFUSED,
                Reply::reason(StatusCode::UNPROCESSABLE_ENTITY, "not this one"),
            )]);
            let user = app.create_user("refused").await;
            let res = tus_create_with(&app, &user, "evil.bin", &bytes).await;
            assert_eq!(
                error_of(res).await,
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "rejected_by_hook".to_owned(),
                    refused_with("not this one")
                ),
                "{what}"
            );
            let got = calls(&rx);
            let d = got.last().unwrap();
            assert!(d.refused(), "{what}");
            assert_read_during(&rx, d, &bytes);
            let id = d.data_str("file_id").unwrap().to_owned();
            assert_eq!(
                head(&app, &user, &id).await.0,
                StatusCode::NOT_FOUND,
                "{what}"
            );
            assert_nothing_stored(&app, &user, d.data_str("read_url")).await;

            // Away under reject.
            rx.answer_ok();
            rx.down().await;
            let user = app.create_user("away").await;
            let res = tus_create_with(&app, &user, "later.bin", &bytes).await;
            assert_eq!(
                error_of(res).await,
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "dependency_unavailable".to_owned(),
                    "the pre-commit hook is unavailable".to_owned()
                ),
                "{what}"
            );
            rx.up().await;
            assert_nothing_stored(&app, &user, None).await;
            assert_eq!(staging_left(&app).await, 0, "{what}: staging left");
        }
    })
    .await;
}
