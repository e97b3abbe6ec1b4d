//! Every setting the server reads: its variable, its meaning and its
//! default, in one place. `Settings::from_lookup` takes a variable's default
//! from here (a test checks that it reads no variable missing here), and
//! `filedock --help` lists them from here.

/// One setting.
pub struct Setting {
    pub var: &'static str,
    pub meaning: &'static str,
    /// What an unset variable stands for, written as one would set it;
    /// `None`: unset means none (no quota, no S3, a generated key…).
    pub value: Option<&'static str>,
    /// How `--help` shows the default, when not as `value` is written.
    shown: Option<&'static str>,
}

impl Setting {
    /// The default as `--help` shows it.
    pub fn shown_default(&self) -> &'static str {
        self.shown.or(self.value).unwrap_or("—")
    }
}

/// Settings renamed, as (`name` without `FILEDOCK_`, the older variable):
/// the older one is read when the newer is unset.
pub const OLDER_NAMES: &[(&str, &str)] = &[("DRAIN_SECS", "FILEDOCK_SHUTDOWN_GRACE_SECS")];

/// The default of `FILEDOCK_{name}` (or `name`), if it has one.
pub fn default_of(name: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .find(|s| s.var.strip_prefix("FILEDOCK_") == Some(name) || s.var == name)
        .and_then(|s| s.value)
}

pub const SETTINGS: &[Setting] = &[
    Setting {
        var: "FILEDOCK_BIND",
        meaning: "listen address",
        value: Some("127.0.0.1:8080"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_METRICS_ADDR",
        meaning: "serve /metrics on this address only (e.g. 127.0.0.1:9090, a port only the scraper reaches); the API listener then answers 404 for it",
        value: None,
        shown: Some("unset → /metrics on FILEDOCK_BIND"),
    },
    Setting {
        var: "FILEDOCK_DATA_DIR",
        meaning: "embedded store, local blobs, generated admin key",
        value: Some("./data"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_ENV",
        meaning: "development or production; production refuses embedded adapters and answers 503 when Redis is down",
        value: Some("development"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_ALLOW_EMBEDDED",
        meaning: "let production run on embedded adapters",
        value: Some("false"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_ADMIN_KEY",
        meaning: "admin bearer key",
        value: None,
        shown: Some("generated into data/admin.key"),
    },
    Setting {
        var: "FILEDOCK_MAX_UPLOAD_BYTES",
        meaning: "largest accepted file",
        value: Some("10737418240"),
        shown: Some("10 GiB"),
    },
    Setting {
        var: "FILEDOCK_USER_QUOTA_BYTES",
        meaning: "per-user storage quota",
        value: None,
        shown: Some("unlimited"),
    },
    Setting {
        var: "FILEDOCK_MONGODB_URI",
        meaning: "MongoDB (a replica set: transactions need one)",
        value: None,
        shown: Some("unset → embedded store"),
    },
    Setting {
        var: "FILEDOCK_MONGODB_DB",
        meaning: "database name",
        value: Some("filedock"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MONGODB_BULK_WRITE",
        meaning: "on MongoDB 8.0 or later, a lone upload's commit sends its writes after the user document's (file, event, permission, intent) in one bulkWrite command, and the sequencer a batch of events' feed places (false, and before 8.0: a command each)",
        value: Some("true"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_REDIS_URL",
        meaning: "Redis",
        value: None,
        shown: Some("unset → in-process locks"),
    },
    Setting {
        var: "FILEDOCK_REDIS_MODE",
        meaning: "single (one node), cluster (FILEDOCK_REDIS_URL lists seed nodes, comma-separated) or sentinel (FILEDOCK_REDIS_URL lists the sentinels)",
        value: Some("single"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_REDIS_SENTINEL_MASTER",
        meaning: "with sentinel: the name of the master the sentinels watch",
        value: None,
        shown: Some("unset"),
    },
    Setting {
        var: "FILEDOCK_REDIS_PREFIX",
        meaning: "prefix of every Redis key (several deployments on one Redis)",
        value: Some(""),
        shown: Some("empty"),
    },
    Setting {
        var: "FILEDOCK_S3_ENDPOINT",
        meaning: "S3 endpoint, e.g. http://127.0.0.1:9000",
        value: None,
        shown: Some("unset → local files"),
    },
    Setting {
        var: "FILEDOCK_S3_BUCKET",
        meaning: "bucket, region",
        value: Some("filedock"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_S3_REGION",
        meaning: "bucket, region",
        value: Some("us-east-1"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_S3_ACCESS_KEY",
        meaning: "S3 credentials (required with an endpoint; never logged)",
        value: None,
        shown: Some("—"),
    },
    Setting {
        var: "FILEDOCK_S3_SECRET_KEY",
        meaning: "S3 credentials (required with an endpoint; never logged)",
        value: None,
        shown: Some("—"),
    },
    Setting {
        var: "FILEDOCK_S3_KEY_PREFIX",
        meaning: "prefix of every object key",
        value: Some(""),
        shown: Some("empty"),
    },
    Setting {
        var: "FILEDOCK_S3_CREATE_BUCKET",
        meaning: "create the bucket at start-up",
        value: Some("true"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_S3_PART_SIZE",
        meaning: "multipart part size (≥ 5 MiB) and parts in flight; memory per large upload ≈ size × (concurrency + 1)",
        value: Some("8388608"),
        shown: Some("8 MiB"),
    },
    Setting {
        var: "FILEDOCK_S3_PART_CONCURRENCY",
        meaning: "multipart part size (≥ 5 MiB) and parts in flight; memory per large upload ≈ size × (concurrency + 1)",
        value: Some("4"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_UPLOAD_MEMORY_BYTES",
        meaning: "one budget for upload buffer memory (parts being filled and sent, tus tails), shared by all uploads; an upload that finds it spent waits, reading nothing more from its client; 0: no limit; else at least one part",
        value: Some("536870912"),
        shown: Some("512 MiB"),
    },
    Setting {
        var: "FILEDOCK_UPLOAD_MEMORY_USER_SHARE",
        meaning: "the fraction of the upload memory budget one user's uploads may hold together (so that one user's slow uploads cannot take it all); 1: no share of their own; at least one part of the budget",
        value: Some("0.25"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_UPLOAD_MEMORY_WAIT_SECS",
        meaning: "how long an upload waits for upload memory before 503 memory_busy (a plain upload leaves nothing; a tus PATCH keeps what it stored)",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LOCK_STRATEGY",
        meaning: "notify (FIFO, handed over on release) or backoff (the original 100 ms × 1.5 loop)",
        value: Some("notify"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LOCK_SCOPE",
        meaning: "commit (lock only the metadata transaction; bytes stream in parallel) or upload (lock the whole upload)",
        value: Some("commit"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LOCK_TTL_SECS",
        meaning: "lock lease, renewed every TTL/3 while held",
        value: Some("300"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LOCK_WAIT_SECS",
        meaning: "how long a request waits for a lock before lock_timeout (429)",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_TXN_MAX_ATTEMPTS",
        meaning: "attempts per transaction on WriteConflict",
        value: Some("3"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_SWEEP_INTERVAL_SECS",
        meaning: "between background sweeper passes; 0 turns the background sweeper off (use cron)",
        value: Some("600"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_SWEEP_INTENT_GRACE_SECS",
        meaning: "an upload intent not refreshed for this long belongs to a dead upload (a live upload refreshes its intent every quarter of this while it streams, however long it takes)",
        value: Some("21600"),
        shown: Some("21600 (6 h)"),
    },
    Setting {
        var: "FILEDOCK_SWEEP_RETRY_INTERVAL_SECS",
        meaning: "between delete attempts of one orphan",
        value: Some("3600"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_SWEEP_MAX_RETRIES",
        meaning: "failed deletes before an orphan is marked failed",
        value: Some("3"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_EVENT_RETENTION_SECS",
        meaning: "how long an event is kept for GET /v1/events; the sweeper removes older ones, and a cursor older than what is kept answers 410 cursor_expired",
        value: Some("604800"),
        shown: Some("604800 (7 days)"),
    },
    Setting {
        var: "FILEDOCK_COORDINATION",
        meaning: "lock or queue for session and agent writes",
        value: Some("lock"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_QUEUE_WAIT_SECS",
        meaning: "queue mode: how long a request waits for its operation (plus 2 s per operation ahead) before it is cancelled and answered 429",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_QUEUE_BROKER",
        meaning: "queue mode (FILEDOCK_COORDINATION=queue): redis (Redis Streams on FILEDOCK_REDIS_URL) or rabbitmq (on FILEDOCK_AMQP_URL; the bucket leases and the direct path stay on Redis)",
        value: Some("redis"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_AMQP_URL",
        meaning: "RabbitMQ's address for FILEDOCK_QUEUE_BROKER=rabbitmq (amqp://user:password@host:5672/%2f); a secret, never logged",
        value: None,
        shown: None,
    },
    Setting {
        var: "FILEDOCK_AMQP_REPLY_TO",
        meaning: "RabbitMQ: how answers reach the instance that asked: direct (direct reply-to, amq.rabbitmq.reply-to) or queue (an exclusive reply queue per instance)",
        value: Some("direct"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_AMQP_QUEUE_EXPIRY_SECS",
        meaning: "RabbitMQ: the broker deletes a queue of filedock's unused (no consumer) this long, with what it holds; for throwaway brokers and tests only, refused in production",
        value: None,
        shown: None,
    },
    Setting {
        var: "FILEDOCK_SETTLE_WINDOW_SECS",
        meaning: "how long an upload whose commit answer was lost keeps reading back whether it applied before answering 504 outcome_unknown (the sweeper settles it later)",
        value: Some("20"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_AUTH_CACHE_SECS",
        meaning: "how long an authenticated API key is remembered (0: look it up every request)",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_TOKEN_MAX_SECS",
        meaning: "the longest lifetime a token minted by POST /v1/tokens may have (its expires_in)",
        value: Some("3600"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MAX_KEYS_PER_USER",
        meaning: "API keys one user may hold (more get 409 too_many_keys)",
        value: Some("100"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MAX_TOKENS_PER_USER",
        meaning: "tokens one user may hold that have not expired (more get 409 too_many_tokens)",
        value: Some("1000"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MAX_UPLOADS_PER_USER",
        meaning: "uploads one user may have in flight on one instance (more get 429)",
        value: Some("2048"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MAX_CONTAINER_ITEMS",
        meaning: "files one session or agent may hold, and MCP or toolset connections one agent may hold, each (more get 409 container_full)",
        value: Some("10000"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_UPLOAD_GROUP_COMMIT",
        meaning: "group commit: one user's uploads whose bytes are stored commit together, in one metadata transaction (false: one transaction each)",
        value: Some("true"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_UPLOAD_GROUP_MAX",
        meaning: "the most uploads one group commit takes",
        value: Some("32"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_BODY_IDLE_TIMEOUT_SECS",
        meaning: "an upload whose client sends nothing for this long, or a JSON body that has not arrived in this long, gets 408",
        value: Some("60"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_TUS_EXPIRY_SECS",
        meaning: "a resumable (tus) upload expires (Upload-Expires) this long after its creation or its last renewal, and is aborted by the sweeper; a PATCH that stores bytes renews it once less than half of it is left, so an upload lives at least half of it after such a PATCH",
        value: Some("86400"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_MAX_OPEN_UPLOADS",
        meaning: "open resumable (tus) uploads one user may have, on all instances together; past it a creation gets 429 too_many_open_uploads",
        value: Some("100"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_HEADER_TIMEOUT_SECS",
        meaning: "a connection that has not sent a whole request head in this long, or has had no request in progress for this long (HTTP/1 or HTTP/2), is closed",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_H2C",
        meaning: "true: also accept cleartext HTTP/2 with prior knowledge (h2c); false: HTTP/1.1 only (put HTTP/2 on a TLS proxy in front)",
        value: Some("false"),
        shown: None,
    },
    // 768: well below the usual 1024-descriptor limit, less what the
    // stores, blobs and logs use.
    Setting {
        var: "FILEDOCK_MAX_CONNECTIONS",
        meaning: "connections served at once; further ones wait in the listen backlog until one closes (keep it below the open-file limit)",
        value: Some("768"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_DRAIN_READY_GRACE_SECS",
        meaning: "after SIGTERM: /readyz answers 503 at once and every response closes its connection, while new connections are still accepted for this long (for a balancer's probe to notice)",
        value: Some("5"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_DRAIN_SECS",
        meaning: "then: new connections are refused, tus PATCHes in flight store what arrived and answer 503 draining, long polls answer; other requests in flight get this long, then background workers stop",
        value: Some("30"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_SHUTDOWN_GRACE_SECS",
        meaning: "the older name of FILEDOCK_DRAIN_SECS, read when that is unset",
        value: None,
        shown: None,
    },
    Setting {
        var: "FILEDOCK_CORS_ORIGINS",
        meaning: "comma-separated browser origins allowed (* for any); the tus methods and headers are allowed and exposed too",
        value: None,
        shown: Some("none"),
    },
    Setting {
        var: "FILEDOCK_ALLOWED_TYPES",
        meaning: "comma list of content types an upload may have, exact or type/* (e.g. image/*,application/pdf); others get 415, nothing stored",
        value: None,
        shown: Some("any type"),
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_URL",
        meaning: "deliver every event to these URLs (comma-separated): signed (Standard Webhooks), at least once, each owner's in sequence order",
        value: None,
        shown: Some("unset → no webhooks"),
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_SECRET",
        meaning: "the webhooks' and the pre-commit hook's signing secret: whsec_ + base64 of 24 or more random bytes, the same on every instance (never logged); needed with FILEDOCK_WEBHOOK_URL or FILEDOCK_PRECOMMIT_HOOK_URL",
        value: None,
        shown: None,
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_MAX_AGE_SECS",
        meaning: "an event not delivered this long after it was written is dead-lettered (GET /v1/admin/events/dead) and its owner's later events go on; less than FILEDOCK_EVENT_RETENTION_SECS",
        value: Some("86400"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_CONCURRENCY",
        meaning: "owners whose events one instance delivers at once, per URL (one owner's go one at a time)",
        value: Some("16"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_TIMEOUT_SECS",
        meaning: "how long one delivery attempt may take; past it the attempt failed",
        value: Some("10"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_WEBHOOK_RETRY_MAX_SECS",
        meaning: "the longest pause between two attempts at one event (exponential backoff from 1 s, full jitter)",
        value: Some("60"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_PRECOMMIT_HOOK_URL",
        meaning: "ask this URL before each upload commits (plain, and a resumable upload's last PATCH): a signed POST of the upload's metadata and a short-lived URL to read its bytes; 2xx commits, 4xx refuses it (422 rejected_by_hook, nothing stored)",
        value: None,
        shown: Some("unset → no hook"),
    },
    Setting {
        var: "FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS",
        meaning: "how long the pre-commit hook may take to answer",
        value: Some("10"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_PRECOMMIT_HOOK_FAILURE",
        meaning: "what the hook's timeout, 5xx or silence means: reject (503, nothing committed) or allow (the upload commits)",
        value: Some("reject"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LINK_SECRET",
        meaning: "key of signed download links, at least 32 bytes, the same on every instance (never logged)",
        value: None,
        shown: Some(
            "random per process: links die on restart and work only on the instance that made them",
        ),
    },
    Setting {
        var: "FILEDOCK_PUBLIC_URL",
        meaning: "base URL signed links are built on, e.g. https://files.example.com",
        value: None,
        shown: Some("http:// + the request's Host"),
    },
    Setting {
        var: "FILEDOCK_SIGNED_LINKS",
        meaning: "proxy (filedock streams a link's file) or redirect (307 to a presigned S3 GET valid for at most 5 min; proxied on local files)",
        value: Some("proxy"),
        shown: None,
    },
    Setting {
        var: "FILEDOCK_LOG_FORMAT",
        meaning: "text or json (anything else is refused at start-up)",
        value: Some("text"),
        shown: None,
    },
    Setting {
        var: "RUST_LOG",
        meaning: "log filter",
        value: None,
        shown: Some("info"),
    },
];
