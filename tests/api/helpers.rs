//! `spawn_app`: a filedock on port 0 with its own data dir, database name,
//! Redis key prefix and S3 key prefix, so tests run in parallel.

pub use filedock::testing::{
    Server, create_user_at, free_port, metric_at, metric_in, pseudo_random_bytes, script_calls,
    sha256_hex,
};
use filedock::{
    blob::{BlobError, BlobStore, ByteRange, ByteStream, ListedBlob},
    config::{S3Settings, Settings},
    http::AppState,
    startup::Application,
    testing::{create_user_json, upload_and_parse, upload_raw_at},
    vocab::BlobKey,
};
use reqwest::{Response, StatusCode};
use secrecy::SecretString;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ADMIN_KEY: &str = "test-admin-key";

/// Which backends the suite runs against.
pub fn real_backends() -> bool {
    std::env::var("FILEDOCK_TEST_BACKEND").is_ok_and(|v| v == "real")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} must be set when FILEDOCK_TEST_BACKEND=real (scripts/test.sh sets it)")
    })
}

/// How long a test's RabbitMQ queues outlive their last consumer.
const AMQP_QUEUE_EXPIRY: std::time::Duration = std::time::Duration::from_secs(120);

/// RabbitMQ's address when the tests run on it (`FILEDOCK_TEST_QUEUE_BROKER=rabbitmq`;
/// `FILEDOCK_TEST_AMQP_URL`, or the machine's broker on 5672).
pub fn test_amqp_url() -> Option<String> {
    (std::env::var("FILEDOCK_TEST_QUEUE_BROKER").as_deref() == Ok("rabbitmq")).then(|| {
        std::env::var("FILEDOCK_TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
    })
}

/// Settings for a fresh, isolated instance.
pub fn test_settings() -> Settings {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("filedock-test-{run}"));
    let mut s = Settings::embedded(dir);
    s.bind = "127.0.0.1:0".into();
    s.admin_key = Some(SecretString::from(ADMIN_KEY));
    // A test's server stops at once (the drain's own tests set it).
    s.drain_ready_grace = std::time::Duration::ZERO;
    // scripts/test.sh reruns the platform tests with FILEDOCK_TEST_COORDINATION=queue.
    if let Ok(c) = std::env::var("FILEDOCK_TEST_COORDINATION") {
        s.coordination = c.parse().expect("lock or queue");
    }
    if real_backends() {
        s.mongodb_uri = Some(env("FILEDOCK_TEST_MONGODB_URI").into());
        s.mongodb_db = format!("t_{}", &run[..16]);
        s.redis_url = Some(env("FILEDOCK_TEST_REDIS_URL").into());
        // scripts/test.sh runs the lock tests again on a Redis Cluster.
        // And with Sentinel (FILEDOCK_TEST_REDIS_SENTINEL_MASTER names the master).
        if let Ok(mode) = std::env::var("FILEDOCK_TEST_REDIS_MODE") {
            s.redis_mode = mode.parse().expect("single, cluster or sentinel");
            s.redis_sentinel_master = std::env::var("FILEDOCK_TEST_REDIS_SENTINEL_MASTER").ok();
        }
        s.redis_prefix = format!("t{}:", &run[..16]);
        // scripts/test.sh reruns the queue-mode tests on RabbitMQ.
        if let Some(url) = test_amqp_url() {
            s.queue_broker = filedock::config::QueueBroker::Rabbitmq;
            s.amqp_url = Some(url.into());
            s.amqp_queue_expiry = Some(AMQP_QUEUE_EXPIRY);
        }
        s.s3 = Some(S3Settings {
            endpoint: env("FILEDOCK_TEST_S3_ENDPOINT"),
            bucket: "filedock-test".into(),
            region: "us-east-1".into(),
            access_key: env("FILEDOCK_TEST_S3_ACCESS_KEY").into(),
            secret_key: env("FILEDOCK_TEST_S3_SECRET_KEY").into(),
            key_prefix: format!("t{}/", &run[..16]),
            create_bucket: true,
            part_size: 5 * 1024 * 1024,
            part_concurrency: 4,
        });
    }
    s
}

pub struct TestApp {
    pub base: String,
    /// Where `/metrics` is served when `FILEDOCK_METRICS_ADDR` is set.
    pub metrics_base: Option<String>,
    pub client: reqwest::Client,
    pub state: AppState,
    pub settings: Settings,
    shutdown: CancellationToken,
    server: JoinHandle<anyhow::Result<()>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(test_settings()).await
}

pub async fn spawn_app_with(settings: Settings) -> TestApp {
    spawn_app_with_state(AppState::build(settings).await.expect("app builds")).await
}

/// A user of the app under test.
pub struct TestUser {
    pub id: String,
    pub key: String,
}

impl TestUser {
    /// The user's id, as the ports take it.
    pub fn user_id(&self) -> filedock::vocab::UserId {
        self.id.parse().expect("a user id")
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Begins stopping the server, as SIGTERM does (see [`Self::stop`]).
    pub fn begin_stop(&self) {
        self.shutdown.cancel();
    }

    /// Stops the server and waits until it has let go of its stores.
    pub async fn stop(self) -> Settings {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
        self.settings
    }

    pub async fn create_user(&self, name: &str) -> TestUser {
        let body = create_user_json(&self.client, &self.base, ADMIN_KEY, name).await;
        TestUser {
            id: body["id"].as_str().unwrap().into(),
            key: body["api_key"].as_str().unwrap().into(),
        }
    }

    pub async fn upload_raw(&self, user: &TestUser, filename: &str, bytes: Vec<u8>) -> Response {
        upload_raw_at(&self.client, &self.base, &user.key, filename, bytes).await
    }

    /// Uploads `bytes` raw and parses the answer's JSON body.
    pub async fn upload_json(&self, user: &TestUser, filename: &str, bytes: Vec<u8>) -> Value {
        upload_and_parse(&self.client, &self.base, &user.key, filename, bytes)
            .await
            .1
    }

    pub async fn upload_multipart(
        &self,
        user: &TestUser,
        filename: &str,
        bytes: Vec<u8>,
    ) -> Response {
        let part = reqwest::multipart::Part::bytes(bytes)
            .file_name(filename.to_owned())
            .mime_str("text/plain")
            .unwrap();
        self.client
            .post(self.url("/v1/files"))
            .bearer_auth(&user.key)
            .multipart(
                reqwest::multipart::Form::new()
                    .text("note", "ignored")
                    .part("file", part),
            )
            .send()
            .await
            .unwrap()
    }

    pub async fn list_ids(&self, user: &TestUser) -> Vec<String> {
        self.list_pages(user, "/v1/files", "files", 37)
            .await
            .concat()
            .iter()
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Every page of the list at `path` (whose items are under `field`),
    /// `limit` a page, following `next_cursor` to the end.
    pub async fn list_pages(
        &self,
        user: &TestUser,
        path: &str,
        field: &str,
        limit: usize,
    ) -> Vec<Vec<Value>> {
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut req = self
                .client
                .get(self.url(path))
                .bearer_auth(&user.key)
                .query(&[("limit", limit.to_string())]);
            if let Some(c) = &cursor {
                req = req.query(&[("cursor", c)]);
            }
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{path}");
            let body: Value = res.json().await.unwrap();
            pages.push(body[field].as_array().unwrap().clone());
            match body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return pages,
            }
        }
    }

    pub async fn download(&self, user: &TestUser, id: &str) -> Response {
        self.client
            .get(self.url(&format!("/v1/files/{id}/content")))
            .bearer_auth(&user.key)
            .send()
            .await
            .unwrap()
    }

    /// Every blob key stored for `user`.
    pub async fn blob_keys(&self, user: &TestUser) -> Vec<String> {
        self.state
            .ports
            .blobs
            .list_keys(&format!("files/{}/", user.id))
            .await
            .unwrap()
    }

    /// Upload intents left behind (should be none once uploads finish).
    pub async fn intents(&self) -> usize {
        self.state
            .ports
            .meta
            .intents(chrono::Utc::now() + chrono::Duration::days(3650), 10_000)
            .await
            .unwrap()
            .len()
    }

    /// A counter's value in `/metrics`, summed over label sets matching `labels`.
    pub async fn metric(&self, name: &str, labels: &str) -> f64 {
        metric_at(&self.base, name, labels).await
    }
}

pub async fn error_code(res: Response) -> (StatusCode, String) {
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"]["code"]
            .as_str()
            .unwrap_or("<no code>")
            .to_owned(),
    )
}

/// Serves `state` (built from `settings`, perhaps with wrapped adapters).
pub async fn spawn_app_with_state(state: AppState) -> TestApp {
    let settings = (*state.settings).clone();
    let app = Application::with_state(state).await.expect("app binds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let metrics_base = app.metrics_addr().map(|a| format!("http://{a}"));
    let state = app.state().clone();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let app = TestApp {
        base,
        metrics_base,
        client: reqwest::Client::new(),
        state,
        settings,
        shutdown,
        server,
    };
    // The reruns on RabbitMQ must run on it, not on the lock path its
    // breaker falls back to.
    if test_amqp_url().is_some()
        && app.settings.coordination == filedock::config::Coordination::Queue
    {
        let stats: Value = app
            .client
            .get(app.url("/v1/admin/queue"))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let warnings = stats["warnings"].to_string();
        assert!(
            !warnings.contains(filedock::coord::queue::rabbit::NOT_LINKED),
            "a test app in queue mode is not linked to RabbitMQ: {stats}"
        );
    }
    app
}

/// A blob store whose deletes fail while `fail` is set, as an unreachable
/// S3 would; everything else goes to the real store underneath.
pub struct FailingDeletes {
    pub inner: std::sync::Arc<dyn BlobStore>,
    pub fail: std::sync::atomic::AtomicBool,
    pub delete_calls: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl BlobStore for FailingDeletes {
    fn bucket(&self) -> &str {
        self.inner.bucket()
    }
    async fn put(&self, key: &BlobKey, body: ByteStream<'_>) -> Result<u64, BlobError> {
        self.inner.put(key, body).await
    }
    async fn get(
        &self,
        key: &BlobKey,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, BlobError> {
        self.inner.get(key, range).await
    }
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        self.delete_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BlobError::Unavailable(
                "injected: blob store unreachable".into(),
            ));
        }
        self.inner.delete(key).await
    }
    async fn head(&self, key: &BlobKey) -> Result<Option<u64>, BlobError> {
        self.inner.head(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, BlobError> {
        self.inner.list(prefix).await
    }
    async fn ping(&self) -> Result<(), BlobError> {
        self.inner.ping().await
    }
}

/// The environment that points the `filedock` binary at `settings`' backends.
pub fn binary_env(s: &Settings) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "FILEDOCK_DATA_DIR".to_owned(),
            s.data_dir.display().to_string(),
        ),
        ("FILEDOCK_ADMIN_KEY".into(), ADMIN_KEY.into()),
        ("FILEDOCK_SWEEP_INTERVAL_SECS".into(), "0".into()),
        ("FILEDOCK_DRAIN_READY_GRACE_SECS".into(), "0".into()),
        ("RUST_LOG".into(), "warn".into()),
    ];
    if real_backends() {
        let s3 = s.s3.as_ref().unwrap();
        let var = |n: &str| std::env::var(n).unwrap();
        env.extend([
            (
                "FILEDOCK_MONGODB_URI".to_owned(),
                var("FILEDOCK_TEST_MONGODB_URI"),
            ),
            ("FILEDOCK_MONGODB_DB".into(), s.mongodb_db.clone()),
            ("FILEDOCK_REDIS_URL".into(), var("FILEDOCK_TEST_REDIS_URL")),
            (
                "FILEDOCK_REDIS_MODE".into(),
                std::env::var("FILEDOCK_TEST_REDIS_MODE").unwrap_or_else(|_| "single".into()),
            ),
            (
                "FILEDOCK_REDIS_SENTINEL_MASTER".into(),
                std::env::var("FILEDOCK_TEST_REDIS_SENTINEL_MASTER").unwrap_or_default(),
            ),
            ("FILEDOCK_REDIS_PREFIX".into(), s.redis_prefix.clone()),
            ("FILEDOCK_S3_ENDPOINT".into(), s3.endpoint.clone()),
            ("FILEDOCK_S3_BUCKET".into(), s3.bucket.clone()),
            (
                "FILEDOCK_S3_ACCESS_KEY".into(),
                var("FILEDOCK_TEST_S3_ACCESS_KEY"),
            ),
            (
                "FILEDOCK_S3_SECRET_KEY".into(),
                var("FILEDOCK_TEST_S3_SECRET_KEY"),
            ),
            ("FILEDOCK_S3_KEY_PREFIX".into(), s3.key_prefix.clone()),
        ]);
        if let Some(url) = test_amqp_url() {
            env.extend([
                ("FILEDOCK_QUEUE_BROKER".to_owned(), "rabbitmq".to_owned()),
                ("FILEDOCK_AMQP_URL".into(), url),
                (
                    "FILEDOCK_AMQP_QUEUE_EXPIRY_SECS".into(),
                    AMQP_QUEUE_EXPIRY.as_secs().to_string(),
                ),
            ]);
        }
    }
    env
}

/// Starts the `filedock` binary on `settings`' backends and waits until it answers.
pub async fn spawn_binary(settings: &Settings, extra_env: &[(&str, &str)]) -> Server {
    spawn_binary_on(settings, extra_env, free_port()).await
}

/// [`spawn_binary`] on `port` (one an instance keeps across its restarts).
pub async fn spawn_binary_on(settings: &Settings, extra_env: &[(&str, &str)], port: u16) -> Server {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .envs(binary_env(settings))
        .envs(extra_env.iter().copied())
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Server::wait_until_up(child, port, 200, std::time::Duration::from_millis(50)).await
}

/// Sends `server` SIGTERM and waits for it to exit (its drain), at most
/// `within`: how it exited, and how long that took; SIGKILLed and a panic
/// past `within`.
pub async fn terminate(
    server: &mut Server,
    within: std::time::Duration,
) -> (std::process::ExitStatus, std::time::Duration) {
    let began = std::time::Instant::now();
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return (status, began.elapsed());
        }
        if began.elapsed() > within {
            let _ = server.child.kill();
            panic!("{} did not end its drain in {within:?}", server.base);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The objects without a file record and the file records without an
/// object (their keys), and how many records there are.
pub async fn bucket_against_metadata(state: &AppState) -> (Vec<String>, Vec<String>, usize) {
    use std::collections::HashSet;
    let objects: HashSet<String> = state
        .ports
        .blobs
        .list_keys("files/")
        .await
        .unwrap()
        .into_iter()
        .collect();
    let records: HashSet<String> = state
        .ports
        .meta
        .all_files(None, 100_000)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.key.to_string())
        .collect();
    let strays = objects.difference(&records).cloned().collect();
    let missing = records.difference(&objects).cloned().collect();
    (strays, missing, records.len())
}

/// Asserts that every object in the bucket has a committed file record, every
/// record has its object, and no upload intent is left; returns the file count.
pub async fn assert_bucket_matches_metadata(state: &AppState) -> usize {
    let (strays, missing, records) = bucket_against_metadata(state).await;
    assert!(
        strays.is_empty(),
        "objects without a file record: {strays:?}"
    );
    assert!(
        missing.is_empty(),
        "file records without an object: {missing:?}"
    );
    let far = filedock::meta::now() + chrono::Duration::days(1);
    assert!(
        state.ports.meta.intents(far, 10).await.unwrap().is_empty(),
        "an upload intent was left behind"
    );
    records
}
