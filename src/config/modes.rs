//! The settings that pick a mode: the environment, the lock's strategy and
//! scope, the coordination, the signed links' delivery; each parsed from its
//! `FILEDOCK_*` value.

use std::str::FromStr;

use anyhow::bail;

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

/// Which broker carries the queue (`FILEDOCK_COORDINATION=queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueBroker {
    /// Redis Streams on `FILEDOCK_REDIS_URL`.
    Redis,
    /// RabbitMQ on `FILEDOCK_AMQP_URL` (leases and the direct path still
    /// on Redis).
    Rabbitmq,
}

impl FromStr for QueueBroker {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "redis" => Ok(Self::Redis),
            "rabbitmq" => Ok(Self::Rabbitmq),
            other => bail!("expected redis or rabbitmq, got {other:?}"),
        }
    }
}

/// Where RabbitMQ's consumers send a queued operation's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmqpReplyTo {
    /// Direct reply-to (`amq.rabbitmq.reply-to`): to the asking channel,
    /// no queue in between.
    Direct,
    /// An exclusive, server-named reply queue per instance.
    Queue,
}

impl FromStr for AmqpReplyTo {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "direct" => Ok(Self::Direct),
            "queue" => Ok(Self::Queue),
            other => bail!("expected direct or queue, got {other:?}"),
        }
    }
}

/// What `FILEDOCK_REDIS_URL` points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisMode {
    /// One Redis node (with or without replicas filedock never talks to).
    Single,
    /// A Redis Cluster: the URL lists seed nodes, comma-separated.
    Cluster,
    /// A primary watched by Redis Sentinel: the URL lists the sentinels,
    /// comma-separated; `FILEDOCK_REDIS_SENTINEL_MASTER` names the master.
    Sentinel,
}

impl FromStr for RedisMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "single" => Ok(Self::Single),
            "cluster" => Ok(Self::Cluster),
            "sentinel" => Ok(Self::Sentinel),
            other => bail!("expected single, cluster or sentinel, got {other:?}"),
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
