//! Typed settings: defaults overridden by `FILEDOCK_*` environment variables.

mod hooks;
pub mod media;
mod modes;
mod table;
mod unknown;
mod vars;

pub use hooks::{HookFailure, PrecommitSettings, WebhookSettings};
pub use media::AllowedTypes;

pub use modes::{
    AmqpReplyTo, Coordination, Environment, LockScope, LockStrategy, QueueBroker, RedisMode,
    SignedLinks,
};
pub use table::{OLDER_NAMES, SETTINGS, Setting, default_of};
pub use unknown::{Unknown, unknown_variables};

use self::{
    hooks::{precommit_settings, webhook_settings},
    vars::Vars,
};

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use secrecy::SecretString;

/// The smallest upload memory budget: one part of the local store's tus
/// PATCHes (8 MiB), which any budget must hold for an upload to proceed.
const MIN_PART_BYTES: u64 = 8 << 20;

/// Everything the service can be told. Built by [`Settings::from_env`] or, in
/// tests, by [`Settings::embedded`] plus field updates; every default is
/// written once, in [`SETTINGS`].
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
    /// A transaction's writes in one `bulkWrite` where MongoDB takes it (8.0+).
    pub mongodb_bulk_write: bool,
    /// One node, or a cluster's seed nodes (comma-separated) in cluster mode.
    pub redis_url: Option<SecretString>,
    pub redis_mode: RedisMode,
    /// The master's name, with Sentinel.
    pub redis_sentinel_master: Option<String>,
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
    /// Queue mode: Redis Streams or RabbitMQ.
    pub queue_broker: QueueBroker,
    /// RabbitMQ's address (`amqp://user:password@host:port/vhost`).
    pub amqp_url: Option<SecretString>,
    /// How RabbitMQ's answers reach the instance that asked.
    pub amqp_reply_to: AmqpReplyTo,
    /// RabbitMQ: queues unused this long (no consumer) are deleted by the
    /// broker with what they hold (`x-expires`): for throwaway brokers
    /// and tests. `None`, the default: kept whatever happens.
    pub amqp_queue_expiry: Option<Duration>,
    /// How long an upload whose commit answer was lost keeps trying to
    /// settle it (read back whether it applied) before it answers
    /// `outcome_unknown`; the sweeper settles it later.
    pub settle_window: Duration,
    /// How long an authenticated key is remembered (zero: ask the store every time).
    pub auth_cache_ttl: Duration,
    /// The longest lifetime a token minted by `POST /v1/tokens` may have.
    pub token_max_lifetime: Duration,
    /// The most API keys one user may hold.
    pub max_keys_per_user: usize,
    /// The most tokens one user may hold that have not expired.
    pub max_tokens_per_user: usize,
    /// After SIGTERM, how long the instance is unready yet still accepts
    /// (`FILEDOCK_DRAIN_READY_GRACE_SECS`).
    pub drain_ready_grace: Duration,
    /// Then how long in-flight requests may take to finish, and after them
    /// the background workers (`FILEDOCK_DRAIN_SECS`).
    pub drain: Duration,
    /// Uploads one user may have in flight on one instance.
    pub max_uploads_per_user: usize,
    /// The most members one list of a session or agent may hold (its files,
    /// MCP or toolset connections).
    pub max_container_items: usize,
    /// Commit a user's uploads that are ready together, in one transaction
    /// (group commit); off, each upload commits in a transaction of its own.
    pub upload_group_commit: bool,
    /// The most uploads one group commit takes.
    pub upload_group_max: usize,
    /// The budget for upload buffer memory, in bytes (0: no limit).
    pub upload_memory_bytes: u64,
    /// The fraction of it one user's uploads may hold together (1: all).
    pub upload_memory_user_share: f64,
    /// How long an upload waits for buffer memory before 503 `memory_busy`.
    pub upload_memory_wait: Duration,
    /// An upload whose client sends nothing for this long is abandoned.
    pub body_idle_timeout: Duration,
    /// A resumable (tus) upload that gets no PATCH for this long expires
    /// (`Upload-Expires`) and the sweeper aborts it.
    pub tus_expiry: Duration,
    /// Open resumable uploads one user may have (all instances together).
    pub max_open_uploads: u64,
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
    /// Where events are delivered (`FILEDOCK_WEBHOOK_URL`); `None`: nowhere.
    pub webhooks: Option<WebhookSettings>,
    /// Who is asked before each upload commits
    /// (`FILEDOCK_PRECOMMIT_HOOK_URL`); `None`: nobody.
    pub precommit: Option<PrecommitSettings>,
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
    /// How long an event is kept (`GET /v1/events`) before a pass removes it.
    pub event_retention: Duration,
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

impl Settings {
    /// Embedded defaults (local files, embedded store, in-process locks),
    /// with the data under `data_dir`: every setting at its default.
    pub fn embedded(data_dir: impl Into<PathBuf>) -> Self {
        let mut s = Self::from_lookup(|_| None).expect("every default parses");
        s.data_dir = data_dir.into();
        s
    }

    /// One user's share of the upload memory budget in bytes (the whole
    /// budget when it has no limit: then the share bounds nothing).
    pub fn user_share_bytes(&self) -> u64 {
        let bytes = self.upload_memory_bytes as f64 * self.upload_memory_user_share;
        match self.upload_memory_bytes {
            0 => u64::MAX,
            _ => bytes as u64,
        }
    }

    /// Defaults overridden by the process environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// Each setting from `lookup(variable)`, or else its default
    /// ([`SETTINGS`], the one place defaults are written); `from_env` with a
    /// seam for tests.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let vars = Vars(move |name: &str| {
            let older = || {
                let (_, var) = OLDER_NAMES.iter().find(|(n, _)| *n == name)?;
                lookup(var)
            };
            lookup(&format!("FILEDOCK_{name}"))
                .or_else(older)
                .or_else(|| default_of(name).map(str::to_owned))
        });
        let s3 = match vars.get("S3_ENDPOINT") {
            None => None,
            Some(endpoint) => Some(S3Settings {
                endpoint,
                bucket: vars.value("S3_BUCKET")?,
                region: vars.value("S3_REGION")?,
                access_key: vars
                    .get("S3_ACCESS_KEY")
                    .context("FILEDOCK_S3_ACCESS_KEY is required with FILEDOCK_S3_ENDPOINT")?
                    .into(),
                secret_key: vars
                    .get("S3_SECRET_KEY")
                    .context("FILEDOCK_S3_SECRET_KEY is required with FILEDOCK_S3_ENDPOINT")?
                    .into(),
                key_prefix: vars.value("S3_KEY_PREFIX")?,
                create_bucket: vars.value("S3_CREATE_BUCKET")?,
                part_size: vars.value("S3_PART_SIZE")?,
                part_concurrency: vars.value("S3_PART_CONCURRENCY")?,
            }),
        };
        let s = Self {
            bind: vars.value("BIND")?,
            metrics_addr: vars.get("METRICS_ADDR"),
            data_dir: vars.value("DATA_DIR")?,
            env: vars.value("ENV")?,
            admin_key: vars.get("ADMIN_KEY").map(SecretString::from),
            max_upload_bytes: vars.value("MAX_UPLOAD_BYTES")?,
            user_quota_bytes: vars.optional("USER_QUOTA_BYTES")?,
            mongodb_uri: vars.get("MONGODB_URI").map(SecretString::from),
            mongodb_db: vars.value("MONGODB_DB")?,
            mongodb_bulk_write: vars.value("MONGODB_BULK_WRITE")?,
            redis_url: vars.get("REDIS_URL").map(SecretString::from),
            redis_mode: vars.value("REDIS_MODE")?,
            redis_sentinel_master: vars.get("REDIS_SENTINEL_MASTER"),
            redis_prefix: vars.value("REDIS_PREFIX")?,
            s3,
            lock: LockSettings {
                strategy: vars.value("LOCK_STRATEGY")?,
                scope: vars.value("LOCK_SCOPE")?,
                ttl: vars.secs("LOCK_TTL_SECS")?,
                wait_timeout: vars.secs("LOCK_WAIT_SECS")?,
            },
            txn_retry: TxnRetryPolicy {
                max_attempts: vars.value("TXN_MAX_ATTEMPTS")?,
                ..TxnRetryPolicy::default()
            },
            sweep: SweepSettings {
                interval: vars.secs("SWEEP_INTERVAL_SECS")?,
                intent_grace: vars.secs("SWEEP_INTENT_GRACE_SECS")?,
                retry_interval: vars.secs("SWEEP_RETRY_INTERVAL_SECS")?,
                max_retries: vars.value("SWEEP_MAX_RETRIES")?,
                event_retention: vars.secs("EVENT_RETENTION_SECS")?,
            },
            coordination: vars.value("COORDINATION")?,
            queue_wait: vars.secs("QUEUE_WAIT_SECS")?,
            queue_broker: vars.value("QUEUE_BROKER")?,
            amqp_url: vars.get("AMQP_URL").map(SecretString::from),
            amqp_reply_to: vars.value("AMQP_REPLY_TO")?,
            amqp_queue_expiry: vars
                .optional::<u64>("AMQP_QUEUE_EXPIRY_SECS")?
                .map(Duration::from_secs),
            settle_window: vars.secs("SETTLE_WINDOW_SECS")?,
            auth_cache_ttl: vars.secs("AUTH_CACHE_SECS")?,
            token_max_lifetime: vars.secs("TOKEN_MAX_SECS")?,
            max_keys_per_user: vars.value("MAX_KEYS_PER_USER")?,
            max_tokens_per_user: vars.value("MAX_TOKENS_PER_USER")?,
            drain_ready_grace: vars.secs("DRAIN_READY_GRACE_SECS")?,
            drain: vars.secs("DRAIN_SECS")?,
            max_uploads_per_user: vars.value("MAX_UPLOADS_PER_USER")?,
            max_container_items: vars.value("MAX_CONTAINER_ITEMS")?,
            upload_group_commit: vars.value("UPLOAD_GROUP_COMMIT")?,
            upload_group_max: vars.value("UPLOAD_GROUP_MAX")?,
            upload_memory_bytes: vars.value("UPLOAD_MEMORY_BYTES")?,
            upload_memory_user_share: vars.value("UPLOAD_MEMORY_USER_SHARE")?,
            upload_memory_wait: vars.secs("UPLOAD_MEMORY_WAIT_SECS")?,
            body_idle_timeout: vars.secs("BODY_IDLE_TIMEOUT_SECS")?,
            tus_expiry: vars.secs("TUS_EXPIRY_SECS")?,
            max_open_uploads: vars.value("MAX_OPEN_UPLOADS")?,
            header_timeout: vars.secs("HEADER_TIMEOUT_SECS")?,
            h2c: vars.value("H2C")?,
            max_connections: vars.value("MAX_CONNECTIONS")?,
            cors_origins: vars.get("CORS_ORIGINS").map_or_else(Vec::new, |v| {
                v.split(',').map(|o| o.trim().to_owned()).collect()
            }),
            allowed_types: match vars.get("ALLOWED_TYPES") {
                Some(v) => AllowedTypes::parse(&v)
                    .map_err(|e| anyhow::anyhow!("FILEDOCK_ALLOWED_TYPES: {e}"))?,
                None => AllowedTypes::default(),
            },
            link_secret: vars.get("LINK_SECRET").map(SecretString::from),
            public_url: match vars.get("PUBLIC_URL") {
                Some(v) if !(v.starts_with("http://") || v.starts_with("https://")) => {
                    bail!("FILEDOCK_PUBLIC_URL must start with http:// or https://, not {v:?}")
                }
                v => v.map(|v| v.trim_end_matches('/').to_owned()),
            },
            signed_links: vars.value("SIGNED_LINKS")?,
            log_json: match vars.get("LOG_FORMAT").as_deref() {
                None | Some("text") => false,
                Some("json") => true,
                Some(other) => bail!("FILEDOCK_LOG_FORMAT must be text or json, not {other:?}"),
            },
            webhooks: webhook_settings(&vars)?,
            precommit: precommit_settings(&vars)?,
            allow_embedded_in_production: vars.value("ALLOW_EMBEDDED")?,
        };
        if s.s3
            .as_ref()
            .is_some_and(|s3| s3.part_size < 5 * 1024 * 1024)
        {
            bail!("FILEDOCK_S3_PART_SIZE must be at least 5 MiB (the S3 minimum)");
        }
        if s.redis_mode == RedisMode::Sentinel && s.redis_sentinel_master.is_none() {
            bail!(
                "FILEDOCK_REDIS_MODE=sentinel needs FILEDOCK_REDIS_SENTINEL_MASTER (the master's name)"
            );
        }
        if s.coordination == Coordination::Queue
            && s.queue_broker == QueueBroker::Rabbitmq
            && s.amqp_url.is_none()
        {
            bail!(
                "FILEDOCK_QUEUE_BROKER=rabbitmq needs FILEDOCK_AMQP_URL (amqp://user:password@host:5672/%2f)"
            );
        }
        // The buckets' leases (and their fencing tokens) and the lock path
        // are Redis's: in-process locks exclude nothing across instances.
        if s.coordination == Coordination::Queue
            && s.queue_broker == QueueBroker::Rabbitmq
            && s.redis_url.is_none()
        {
            bail!(
                "FILEDOCK_QUEUE_BROKER=rabbitmq needs FILEDOCK_REDIS_URL too (the buckets' leases and the lock path are on Redis)"
            );
        }
        if s.amqp_queue_expiry.is_some_and(|e| e.is_zero()) {
            bail!("FILEDOCK_AMQP_QUEUE_EXPIRY_SECS must be more than 0 (or unset: queues kept)");
        }
        if s.is_production() && s.amqp_queue_expiry.is_some() {
            bail!(
                "FILEDOCK_AMQP_QUEUE_EXPIRY_SECS deletes queued operations with their queue: refused in production"
            );
        }
        if s.max_connections == 0 {
            bail!("FILEDOCK_MAX_CONNECTIONS must be at least 1");
        }
        if s.header_timeout.is_zero() {
            bail!("FILEDOCK_HEADER_TIMEOUT_SECS must be more than 0");
        }
        let one_part =
            s.s3.as_ref()
                .map_or(MIN_PART_BYTES, |s3| s3.part_size as u64);
        if s.upload_memory_bytes != 0 && s.upload_memory_bytes < one_part.max(MIN_PART_BYTES) {
            bail!(
                "FILEDOCK_UPLOAD_MEMORY_BYTES must be 0 (no limit) or at least one part ({} bytes)",
                one_part.max(MIN_PART_BYTES)
            );
        }
        let share = s.upload_memory_user_share;
        if !(share > 0.0 && share <= 1.0) || s.user_share_bytes() < one_part.max(MIN_PART_BYTES) {
            bail!(
                "FILEDOCK_UPLOAD_MEMORY_USER_SHARE must be in (0, 1] and, of the budget, at least one part"
            );
        }
        if s.upload_memory_wait.is_zero() {
            bail!("FILEDOCK_UPLOAD_MEMORY_WAIT_SECS must be more than 0");
        }
        if s.upload_group_max == 0 {
            bail!("FILEDOCK_UPLOAD_GROUP_MAX must be at least 1");
        }
        // Kept at least a second (0 would remove each event at the next
        // pass), at most ten years (a time before that is not one a clock
        // subtracts safely).
        if !(Duration::from_secs(1)..=Duration::from_secs(3650 * 86400))
            .contains(&s.sweep.event_retention)
        {
            bail!("FILEDOCK_EVENT_RETENTION_SECS must be between 1 and 315360000 (ten years)");
        }
        if s.max_keys_per_user == 0 || s.max_tokens_per_user == 0 {
            bail!("FILEDOCK_MAX_KEYS_PER_USER and FILEDOCK_MAX_TOKENS_PER_USER must be at least 1");
        }
        if s.max_container_items == 0 {
            bail!("FILEDOCK_MAX_CONTAINER_ITEMS must be at least 1");
        }
        if s.txn_retry.max_attempts == 0 {
            bail!("FILEDOCK_TXN_MAX_ATTEMPTS must be at least 1");
        }
        // An event the retention removed before its delivery was given up
        // on would be lost without a dead letter.
        if let Some(w) = &s.webhooks
            && w.max_age >= s.sweep.event_retention
        {
            bail!(
                "FILEDOCK_WEBHOOK_MAX_AGE_SECS must be less than FILEDOCK_EVENT_RETENTION_SECS (an event is given up on before the retention removes it)"
            );
        }
        Ok(s)
    }

    pub fn is_production(&self) -> bool {
        self.env == Environment::Production
    }

    /// The variables among `names` that look like settings and are none
    /// ([`unknown_variables`]), to warn of; an error instead, naming them,
    /// for a typo of `FILEDOCK_ENV` (whatever the mode: the one meant may
    /// be production) and, in production, for every name near a setting (a
    /// typo there leaves that setting at its default). A name near none
    /// (another program's, or a setting of a newer version rolled back
    /// from) is warned of in production too.
    pub fn check_variables(
        &self,
        names: impl IntoIterator<Item = String>,
    ) -> anyhow::Result<Vec<Unknown>> {
        let unknown = unknown_variables(names);
        let refused: Vec<String> = unknown
            .iter()
            .filter(|u| match u.closest {
                Some(setting) => self.is_production() || setting == "FILEDOCK_ENV",
                None => false,
            })
            .map(ToString::to_string)
            .collect();
        if !refused.is_empty() {
            bail!(
                "refusing to start with variables that are no setting: {}",
                refused.join("; ")
            );
        }
        Ok(unknown)
    }
}

#[cfg(test)]
mod tests;
