//! Typed settings: defaults overridden by `FILEDOCK_*` environment variables.

pub mod media;
mod table;

pub use media::AllowedTypes;

pub use table::{SETTINGS, Setting};

use std::{path::PathBuf, str::FromStr, time::Duration};

use anyhow::{Context, bail};
use secrecy::SecretString;

/// Connections served at once unless `FILEDOCK_MAX_CONNECTIONS` says
/// otherwise: well below the usual 1024-descriptor limit less what the
/// stores, blobs and logs use.
pub const DEFAULT_MAX_CONNECTIONS: usize = 768;

/// Everything the service can be told. Built by [`Settings::from_env`] or, in
/// tests, by [`Settings::embedded`] plus field updates.
#[derive(Clone, Debug)]
pub struct Settings {
    pub bind: String,
    /// Where `/metrics` is served instead of on `bind` (a port scrapers can
    /// reach and clients cannot); `None` serves it on `bind`.
    pub metrics_addr: Option<String>,
    pub data_dir: PathBuf,
    pub env: Environment,
    pub admin_key: Option<SecretString>,
    pub max_upload_bytes: u64,
    /// Per-user byte quota; `None` is unlimited.
    pub user_quota_bytes: Option<u64>,
    pub mongodb_uri: Option<SecretString>,
    pub mongodb_db: String,
    pub redis_url: Option<SecretString>,
    /// Prefix for every Redis key this instance writes (tests isolate with it).
    pub redis_prefix: String,
    pub s3: Option<S3Settings>,
    pub lock: LockSettings,
    pub txn_retry: TxnRetryPolicy,
    pub sweep: SweepSettings,
    pub coordination: Coordination,
    /// Queue mode: a waiter waits this long plus 2 s per operation ahead of
    /// it (at most 5 min, or this if longer); then its operation is cancelled.
    pub queue_wait: Duration,
    /// How long an authenticated key is remembered (zero: ask the store every time).
    pub auth_cache_ttl: Duration,
    /// After SIGTERM, how long in-flight requests may take to finish.
    pub shutdown_grace: Duration,
    /// Uploads one user may have in flight on one instance.
    pub max_uploads_per_user: usize,
    /// Commit a user's uploads that are ready together, in one transaction
    /// (group commit); off, each upload commits in a transaction of its own.
    pub upload_group_commit: bool,
    /// The most uploads one group commit takes.
    pub upload_group_max: usize,
    /// An upload whose client sends nothing for this long is abandoned.
    pub body_idle_timeout: Duration,
    /// A resumable (tus) upload that gets no PATCH for this long expires
    /// (`Upload-Expires`) and the sweeper aborts it.
    pub tus_expiry: Duration,
    /// A connection that has not sent a whole request head in this long is
    /// closed (slow-header clients), and so is one that has had no request
    /// in progress for this long (idle keep-alive, HTTP/2 included).
    pub header_timeout: Duration,
    /// Accept cleartext HTTP/2 with prior knowledge (h2c); off: HTTP/1 only.
    pub h2c: bool,
    /// Connections served at once; past it new ones wait to be accepted.
    pub max_connections: usize,
    pub cors_origins: Vec<String>,
    /// The types an upload may have (declared or detected); empty allows any.
    pub allowed_types: AllowedTypes,
    /// The key of signed links; `None`: a random one per process.
    pub link_secret: Option<SecretString>,
    /// The base URL signed links are built on; `None`: the request's `Host`.
    pub public_url: Option<String>,
    /// How a signed link serves its file.
    pub signed_links: SignedLinks,
    pub log_json: bool,
    /// Allow `production` to run on embedded adapters.
    pub allow_embedded_in_production: bool,
}

#[derive(Clone, Debug)]
pub struct S3Settings {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key: SecretString,
    pub secret_key: SecretString,
    /// Prefix for every object key (tests isolate with it).
    pub key_prefix: String,
    pub create_bucket: bool,
    pub part_size: usize,
    pub part_concurrency: usize,
}

#[derive(Clone, Debug)]
pub struct LockSettings {
    pub strategy: LockStrategy,
    pub scope: LockScope,
    pub ttl: Duration,
    pub wait_timeout: Duration,
}

/// The orphan sweeper.
#[derive(Clone, Debug)]
pub struct SweepSettings {
    /// Between background passes; zero turns the background sweeper off.
    pub interval: Duration,
    /// An upload intent not refreshed for this long is abandoned: its upload
    /// died (a live one refreshes it while it streams).
    pub intent_grace: Duration,
    /// Between delete attempts of one orphan.
    pub retry_interval: Duration,
    /// Failed deletes before an orphan is marked `failed` (dead letter).
    pub max_retries: i32,
}

/// Retry a whole transaction on `WriteConflict`: at most `max_attempts`
/// attempts, sleeping `attempt² × base_delay` before each (0, 50, 200 ms
/// with the defaults). [`crate::meta::retry::with_txn_retry`] applies it.
#[derive(Clone, Copy, Debug)]
pub struct TxnRetryPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
}

impl Default for TxnRetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(50),
        }
    }
}

impl TxnRetryPolicy {
    /// The sleep before attempt `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.base_delay * attempt * attempt
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Environment {
    Development,
    Production,
}

/// How a waiter learns that a lock came free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockStrategy {
    /// Queue in arrival order; the releaser wakes the next waiter.
    Notify,
    /// The original design's loop: retry after 100 ms × 1.5ⁿ, capped at 2 s.
    Backoff,
}

/// How writes to sessions and agents are serialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coordination {
    /// Take the resource's lock and apply directly.
    Lock,
    /// Enqueue on an ordered per-key queue and wait for the result.
    Queue,
}

impl FromStr for Coordination {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "lock" => Ok(Self::Lock),
            "queue" => Ok(Self::Queue),
            other => bail!("expected lock or queue, got {other:?}"),
        }
    }
}

/// How a signed link serves its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignedLinks {
    /// filedock streams it, with its own headers.
    Proxy,
    /// A redirect to a presigned S3 GET (proxied on local files).
    Redirect,
}

impl FromStr for SignedLinks {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "proxy" => Ok(Self::Proxy),
            "redirect" => Ok(Self::Redirect),
            other => bail!("expected proxy or redirect, got {other:?}"),
        }
    }
}

/// What the per-user upload lock covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockScope {
    /// Only the metadata transaction; bytes stream without the lock.
    Commit,
    /// The whole upload, as in the original design.
    Upload,
}

impl FromStr for Environment {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "development" | "dev" => Ok(Self::Development),
            "production" | "prod" => Ok(Self::Production),
            other => bail!("expected development or production, got {other:?}"),
        }
    }
}

impl FromStr for LockStrategy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "notify" => Ok(Self::Notify),
            "backoff" => Ok(Self::Backoff),
            other => bail!("expected notify or backoff, got {other:?}"),
        }
    }
}

impl FromStr for LockScope {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "commit" => Ok(Self::Commit),
            "upload" => Ok(Self::Upload),
            other => bail!("expected commit or upload, got {other:?}"),
        }
    }
}

impl Settings {
    /// Embedded defaults: local files, embedded store, in-process locks.
    pub fn embedded(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            metrics_addr: None,
            data_dir: data_dir.into(),
            env: Environment::Development,
            admin_key: None,
            max_upload_bytes: 10 * 1024 * 1024 * 1024,
            user_quota_bytes: None,
            mongodb_uri: None,
            mongodb_db: "filedock".into(),
            redis_url: None,
            redis_prefix: String::new(),
            s3: None,
            lock: LockSettings {
                strategy: LockStrategy::Notify,
                scope: LockScope::Commit,
                ttl: Duration::from_secs(300),
                wait_timeout: Duration::from_secs(30),
            },
            txn_retry: TxnRetryPolicy::default(),
            sweep: SweepSettings {
                interval: Duration::from_secs(600),
                intent_grace: Duration::from_secs(6 * 3600),
                retry_interval: Duration::from_secs(3600),
                max_retries: 3,
            },
            coordination: Coordination::Lock,
            queue_wait: Duration::from_secs(30),
            auth_cache_ttl: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            max_uploads_per_user: 2048,
            upload_group_commit: true,
            upload_group_max: 32,
            body_idle_timeout: Duration::from_secs(60),
            tus_expiry: Duration::from_secs(24 * 3600),
            header_timeout: Duration::from_secs(30),
            h2c: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            cors_origins: Vec::new(),
            allowed_types: AllowedTypes::default(),
            link_secret: None,
            public_url: None,
            signed_links: SignedLinks::Proxy,
            log_json: false,
            allow_embedded_in_production: false,
        }
    }

    /// Defaults overridden by the process environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// Defaults overridden by `lookup(name)`; `from_env` with a seam for tests.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let get = |name: &str| lookup(&format!("FILEDOCK_{name}"));
        let mut s = Self::embedded(get("DATA_DIR").unwrap_or_else(|| "./data".into()));
        if let Some(v) = get("BIND") {
            s.bind = v;
        }
        s.metrics_addr = get("METRICS_ADDR");
        parse_into(&get, "ENV", &mut s.env)?;
        s.admin_key = get("ADMIN_KEY").map(SecretString::from);
        parse_into(&get, "MAX_UPLOAD_BYTES", &mut s.max_upload_bytes)?;
        s.user_quota_bytes = get("USER_QUOTA_BYTES")
            .map(|v| v.parse().context("FILEDOCK_USER_QUOTA_BYTES"))
            .transpose()?;
        s.mongodb_uri = get("MONGODB_URI").map(SecretString::from);
        if let Some(v) = get("MONGODB_DB") {
            s.mongodb_db = v;
        }
        s.redis_url = get("REDIS_URL").map(SecretString::from);
        if let Some(v) = get("REDIS_PREFIX") {
            s.redis_prefix = v;
        }
        if let Some(endpoint) = get("S3_ENDPOINT") {
            let mut s3 = S3Settings {
                endpoint,
                bucket: get("S3_BUCKET").unwrap_or_else(|| "filedock".into()),
                region: get("S3_REGION").unwrap_or_else(|| "us-east-1".into()),
                access_key: get("S3_ACCESS_KEY")
                    .context("FILEDOCK_S3_ACCESS_KEY is required with FILEDOCK_S3_ENDPOINT")?
                    .into(),
                secret_key: get("S3_SECRET_KEY")
                    .context("FILEDOCK_S3_SECRET_KEY is required with FILEDOCK_S3_ENDPOINT")?
                    .into(),
                key_prefix: get("S3_KEY_PREFIX").unwrap_or_default(),
                create_bucket: true,
                part_size: 8 * 1024 * 1024,
                part_concurrency: 4,
            };
            parse_into(&get, "S3_CREATE_BUCKET", &mut s3.create_bucket)?;
            parse_into(&get, "S3_PART_SIZE", &mut s3.part_size)?;
            parse_into(&get, "S3_PART_CONCURRENCY", &mut s3.part_concurrency)?;
            if s3.part_size < 5 * 1024 * 1024 {
                bail!("FILEDOCK_S3_PART_SIZE must be at least 5 MiB (the S3 minimum)");
            }
            s.s3 = Some(s3);
        }
        parse_into(&get, "LOCK_STRATEGY", &mut s.lock.strategy)?;
        parse_into(&get, "LOCK_SCOPE", &mut s.lock.scope)?;
        parse_into(&get, "COORDINATION", &mut s.coordination)?;
        parse_secs(&get, "QUEUE_WAIT_SECS", &mut s.queue_wait)?;
        parse_secs(&get, "AUTH_CACHE_SECS", &mut s.auth_cache_ttl)?;
        parse_secs(&get, "SHUTDOWN_GRACE_SECS", &mut s.shutdown_grace)?;
        parse_into(&get, "MAX_UPLOADS_PER_USER", &mut s.max_uploads_per_user)?;
        parse_into(&get, "UPLOAD_GROUP_COMMIT", &mut s.upload_group_commit)?;
        parse_into(&get, "UPLOAD_GROUP_MAX", &mut s.upload_group_max)?;
        parse_secs(&get, "BODY_IDLE_TIMEOUT_SECS", &mut s.body_idle_timeout)?;
        parse_secs(&get, "TUS_EXPIRY_SECS", &mut s.tus_expiry)?;
        parse_secs(&get, "HEADER_TIMEOUT_SECS", &mut s.header_timeout)?;
        parse_into(&get, "H2C", &mut s.h2c)?;
        parse_into(&get, "MAX_CONNECTIONS", &mut s.max_connections)?;
        parse_secs(&get, "LOCK_TTL_SECS", &mut s.lock.ttl)?;
        parse_secs(&get, "LOCK_WAIT_SECS", &mut s.lock.wait_timeout)?;
        parse_into(&get, "TXN_MAX_ATTEMPTS", &mut s.txn_retry.max_attempts)?;
        parse_secs(&get, "SWEEP_INTERVAL_SECS", &mut s.sweep.interval)?;
        parse_secs(&get, "SWEEP_INTENT_GRACE_SECS", &mut s.sweep.intent_grace)?;
        parse_secs(
            &get,
            "SWEEP_RETRY_INTERVAL_SECS",
            &mut s.sweep.retry_interval,
        )?;
        parse_into(&get, "SWEEP_MAX_RETRIES", &mut s.sweep.max_retries)?;
        if let Some(v) = get("CORS_ORIGINS") {
            s.cors_origins = v.split(',').map(|o| o.trim().to_owned()).collect();
        }
        if let Some(v) = get("ALLOWED_TYPES") {
            s.allowed_types = AllowedTypes::parse(&v)
                .map_err(|e| anyhow::anyhow!("FILEDOCK_ALLOWED_TYPES: {e}"))?;
        }
        s.link_secret = get("LINK_SECRET").map(SecretString::from);
        if let Some(v) = get("PUBLIC_URL") {
            if !(v.starts_with("http://") || v.starts_with("https://")) {
                bail!("FILEDOCK_PUBLIC_URL must start with http:// or https://, not {v:?}");
            }
            s.public_url = Some(v.trim_end_matches('/').to_owned());
        }
        parse_into(&get, "SIGNED_LINKS", &mut s.signed_links)?;
        s.log_json = match get("LOG_FORMAT").as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => bail!("FILEDOCK_LOG_FORMAT must be text or json, not {other:?}"),
        };
        parse_into(&get, "ALLOW_EMBEDDED", &mut s.allow_embedded_in_production)?;
        if s.max_connections == 0 {
            bail!("FILEDOCK_MAX_CONNECTIONS must be at least 1");
        }
        if s.header_timeout.is_zero() {
            bail!("FILEDOCK_HEADER_TIMEOUT_SECS must be more than 0");
        }
        if s.upload_group_max == 0 {
            bail!("FILEDOCK_UPLOAD_GROUP_MAX must be at least 1");
        }
        if s.txn_retry.max_attempts == 0 {
            bail!("FILEDOCK_TXN_MAX_ATTEMPTS must be at least 1");
        }
        Ok(s)
    }

    pub fn is_production(&self) -> bool {
        self.env == Environment::Production
    }
}

fn parse_into<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    slot: &mut T,
) -> anyhow::Result<()>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    if let Some(raw) = get(name) {
        *slot = raw
            .parse()
            .map_err(|e| anyhow::anyhow!("FILEDOCK_{name}={raw:?}: {e}"))?;
    }
    Ok(())
}

fn parse_secs(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    slot: &mut Duration,
) -> anyhow::Result<()> {
    let mut secs = slot.as_secs_f64();
    parse_into(get, name, &mut secs)?;
    *slot = Duration::from_secs_f64(secs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_setting_the_server_reads() {
        let read = std::cell::RefCell::new(Vec::<String>::new());
        // Values for the few settings that open others (S3's endpoint and keys).
        let _ = Settings::from_lookup(|name| {
            read.borrow_mut().push(name.to_owned());
            name.starts_with("FILEDOCK_S3_")
                .then(|| name.ends_with("ENDPOINT") || name.ends_with("_KEY"))
                .filter(|&v| v)
                .map(|_| "x".to_owned())
        });
        let listed: Vec<&str> = SETTINGS.iter().map(|s| s.var).collect();
        let missing: Vec<_> = read
            .borrow()
            .iter()
            .filter(|n| !listed.contains(&n.as_str()))
            .cloned()
            .collect();
        assert!(missing.is_empty(), "read but not in --help: {missing:?}");
        assert!(read.borrow().len() > 30, "the S3 settings were read too");
    }

    #[test]
    fn defaults_match_the_design() {
        let s = Settings::from_lookup(|_| None).unwrap();
        assert_eq!(s.bind, "127.0.0.1:8080");
        assert_eq!(s.data_dir, PathBuf::from("./data"));
        assert_eq!(s.lock.strategy, LockStrategy::Notify);
        assert_eq!(s.lock.scope, LockScope::Commit);
        assert_eq!(s.txn_retry.max_attempts, 3);
        assert!(s.s3.is_none() && s.mongodb_uri.is_none() && s.redis_url.is_none());
    }

    #[test]
    fn bad_values_are_named_in_the_error() {
        let err =
            Settings::from_lookup(|n| (n == "FILEDOCK_LOCK_SCOPE").then(|| "sometimes".into()))
                .unwrap_err();
        assert!(err.to_string().contains("FILEDOCK_LOCK_SCOPE"), "{err}");
        // A typo is refused at start-up, not silently taken for text logs.
        let err = Settings::from_lookup(|n| (n == "FILEDOCK_LOG_FORMAT").then(|| "jsno".into()))
            .unwrap_err();
        assert!(err.to_string().contains("FILEDOCK_LOG_FORMAT"), "{err}");
    }
}
