//! Builds the application from settings: picks an adapter per port
//! ([`Ports::connect`]), builds the services on them once
//! ([`AppState::with_ports`]), binds the listener, and runs the server and
//! the background workers until a shutdown signal. The only module that
//! knows every layer.

mod app;
mod hooks;
mod serve;

pub use self::app::{Application, shutdown_signal};

use self::hooks::{precommit_hook, webhook_service};

use std::{path::Path, sync::Arc};

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};

use crate::{
    blob::{
        BlobStore,
        budget::{BudgetLimits, MemoryBudget},
        fs::FsBlobStore,
        resumable::ResumableBlobs,
        s3::S3BlobStore,
    },
    config::{Coordination, QueueBroker, Settings},
    coord::{
        Applier, Coordinator, LockCoordinator, bell::RedisBell, brokers::BrokerQueue,
        local::LocalQueue, members::Members, queue::RedisQueue, queue::rabbit::RabbitQueue,
    },
    domain::{
        auth_cache::AuthCache,
        containers::ContainerService,
        events::{Announced, EventService, Kicking},
        files::FileService,
        links::LinkSigner,
        reconcile::Reconciler,
        resumable::ResumableService,
        settle::OwnedInserts,
        sweeper::Sweeper,
        tokens::TokenService,
        upload::{Admission, Committer, Idempotency, UploadService},
        users::{UserService, new_api_key},
        webhooks::WebhookPorts,
    },
    http::{self, AppState},
    lock::{LockManager, Locks, memory::MemoryLocks, redis::RedisLocks},
    meta::retry::Transactions,
    meta::{
        Bells, ContainerRepo, EventBell, FileRepo, KeyRepo, MetadataStore, embedded::EmbeddedStore,
        mongo::MongoStore,
    },
    metrics::Metrics,
    ports::Ports,
    redis_link::RedisLink,
};

/// How long a request that authenticated just before a user's deletion
/// began may still be writing, past the auth cache's lifetime: the deletion
/// ends only after both.
const REQUEST_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl Ports {
    /// Connects every adapter the settings name (embedded where unset).
    pub async fn connect(settings: &Settings) -> anyhow::Result<Self> {
        let embedded: Vec<&str> = [
            settings
                .mongodb_uri
                .is_none()
                .then_some("metadata (FILEDOCK_MONGODB_URI)"),
            settings
                .s3
                .is_none()
                .then_some("blobs (FILEDOCK_S3_ENDPOINT)"),
            settings
                .redis_url
                .is_none()
                .then_some("locks (FILEDOCK_REDIS_URL)"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if settings.is_production()
            && !embedded.is_empty()
            && !settings.allow_embedded_in_production
        {
            anyhow::bail!(
                "production mode refuses embedded adapters for: {}; configure them or set FILEDOCK_ALLOW_EMBEDDED=true",
                embedded.join(", ")
            );
        }
        let metrics = Arc::new(Metrics::default());
        let meta = open_metadata_counted(settings, metrics.mongo_commands.clone()).await?;
        // One budget for every upload's buffers, plain and resumable.
        let limits = BudgetLimits {
            bytes: settings.upload_memory_bytes,
            per_user: settings.user_share_bytes(),
            wait: Some(settings.upload_memory_wait),
        };
        let budget = MemoryBudget::new(limits, &metrics);
        let (blobs, resumable): (Arc<dyn BlobStore>, Arc<dyn ResumableBlobs>) = match &settings.s3 {
            Some(s3) => {
                let store = Arc::new(
                    S3BlobStore::connect(s3, metrics.clone())
                        .await
                        .context("connecting to S3")?
                        .with_budget(budget),
                );
                (store.clone(), store)
            }
            None => {
                let store = Arc::new(FsBlobStore::open(&settings.data_dir)?.with_budget(budget));
                (store.clone(), store)
            }
        };
        let link = RedisLink::from_settings(settings)?;
        let lock_manager: Arc<dyn LockManager> = match link {
            Some(link) => {
                let link = link.counted(metrics.redis_commands.clone());
                link.probe().await?;
                Arc::new(RedisLocks::on(&link, &settings.redis_prefix))
            }
            None => Arc::new(MemoryLocks::new()),
        };
        let locks = Arc::new(Locks::new(
            lock_manager,
            settings.lock.clone(),
            settings.is_production(),
            metrics.clone(),
        ));
        Ok(Self {
            meta,
            blobs,
            resumable,
            locks,
            metrics,
        })
    }
}

impl AppState {
    /// Connects every adapter the settings name and builds the services.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let ports = Ports::connect(&settings).await?;
        Self::with_ports(settings, ports)
    }

    /// Builds the services on `ports`.
    pub fn with_ports(settings: Settings, ports: Ports) -> anyhow::Result<Self> {
        let Ports {
            meta,
            blobs,
            resumable,
            locks,
            metrics,
        } = ports.clone();
        let admin_key = admin_key(&settings)?;
        let txns = Transactions::new(settings.txn_retry, metrics.clone());
        // The events' bell: rung after each change that wrote an event, on
        // Redis (heard by every instance) when it is configured.
        let heard: Arc<dyn EventBell> = match RedisLink::from_settings(&settings)? {
            Some(link) => Arc::new(RedisBell::on(
                &link.counted(metrics.redis_commands.clone()),
                &settings.redis_prefix,
            )),
            None => Arc::new(Bells::default()),
        };
        let webhooks = Arc::new(webhook_service(
            &settings,
            WebhookPorts {
                repo: meta.clone(),
                events: meta.clone(),
                bell: heard.clone(),
                locks: locks.clone(),
                members: Members::new(None, String::new(), String::new()),
                metrics: metrics.clone(),
            },
        )?);
        // The writes' rings wake this instance's sequencer too (the feed).
        let kick = Arc::new(tokio::sync::Notify::new());
        let bell: Arc<dyn EventBell> = Arc::new(Kicking::new(heard.clone(), kick.clone()));
        let files: Arc<dyn FileRepo> = Arc::new(Announced::<dyn FileRepo>::new(
            meta.clone(),
            bell.clone(),
            metrics.clone(),
        ));
        let containers: Arc<dyn ContainerRepo> = Arc::new(Announced::<dyn ContainerRepo>::new(
            meta.clone(),
            bell.clone(),
            metrics.clone(),
        ));
        let keys: Arc<dyn KeyRepo> = Arc::new(Announced::<dyn KeyRepo>::new(
            meta.clone(),
            bell.clone(),
            metrics.clone(),
        ));
        // The commit and the admission gate plain and resumable uploads share.
        let links = Arc::new(LinkSigner::new(settings.link_secret.as_ref())?);
        let precommit = precommit_hook(&settings, links.clone(), &ports)?;
        let committer = Arc::new(
            Committer::new(
                files.clone(),
                meta.clone(),
                blobs.clone(),
                locks.clone(),
                txns.clone(),
                metrics.clone(),
                &settings,
            )
            .with_hook(precommit.clone()),
        );
        // A container's change writes its event with a write of its owner's
        // record: in the owner's turn, as their commits are.
        let turns = committer.turns();
        let applier = Applier::new(
            containers.clone(),
            (txns.clone(), turns.clone()),
            settings.max_container_items,
        );
        let queue = broker_queue(&settings, &locks, &applier, &metrics)?;
        let coordinator: Arc<dyn Coordinator> = match (&queue, settings.coordination) {
            (Some(q), _) => q.coordinator(),
            (None, Coordination::Queue) => Arc::new(LocalQueue::new(applier)),
            (None, Coordination::Lock) => Arc::new(LockCoordinator::new(locks.clone(), applier)),
        };
        let settings = Arc::new(settings);
        let admission = Arc::new(Admission::new(
            meta.clone(),
            meta.clone(),
            metrics.clone(),
            &settings,
        ));
        let uploads = Arc::new(UploadService::new(
            admission.clone(),
            committer.clone(),
            blobs.clone(),
            Idempotency::new(meta.clone()),
            metrics.clone(),
            &settings,
        ));
        let resumables = Arc::new(ResumableService::new(
            committer,
            admission,
            meta.clone(),
            meta.clone(),
            meta.clone(),
            blobs.clone(),
            resumable.clone(),
            locks.clone(),
            &settings,
        ));
        let inserts = OwnedInserts {
            locks: locks.clone(),
            turns: turns.clone(),
            txns: txns.clone(),
            settle_window: settings.settle_window,
        };
        Ok(Self {
            audit: http::audit::Audit::new(metrics.clone()),
            drain: http::drain::Drain::default(),
            tokens: Arc::new(TokenService::new(
                meta.clone(),
                meta.clone(),
                (settings.token_max_lifetime, settings.max_tokens_per_user),
                inserts.clone(),
            )),
            links,
            precommit,
            users: Arc::new(UserService::new(
                (meta.clone(), meta.clone()),
                keys,
                AuthCache::new(settings.auth_cache_ttl),
                (settings.user_quota_bytes, settings.max_keys_per_user),
                inserts.clone(),
            )),
            // Each service gets the narrow repositories it uses; one store
            // serves them all.
            uploads,
            resumables,
            files: Arc::new(FileService {
                files,
                cleanup: meta.clone(),
                blobs: blobs.clone(),
                locks: locks.clone(),
                turns,
                txns,
            }),
            containers: Arc::new(ContainerService::new(containers, coordinator, inserts)),
            events: Arc::new(EventService::new(
                meta.clone(),
                heard,
                metrics.clone(),
                kick.clone(),
            )),
            reconciler: Arc::new(Reconciler {
                files: meta.clone(),
                cleanup: meta.clone(),
                blobs: blobs.clone(),
                intent_grace: settings.sweep.intent_grace,
            }),
            sweeper: Arc::new(Sweeper {
                meta: meta.clone(),
                blobs,
                resumables: meta.clone(),
                resumable_blobs: resumable.clone(),
                keys: meta.clone(),
                locks,
                metrics: metrics.clone(),
                settings: settings.sweep.clone(),
                deletions: meta.clone(),
                events: meta.clone(),
                bell: bell.clone(),
                sequencer: kick.clone(),
                deletion_settle: settings.auth_cache_ttl + REQUEST_GRACE,
            }),
            queue,
            webhooks,
            settings,
            metrics,
            ports,
            admin_key,
        })
    }
}

/// The metadata store alone (the CLI needs no more).
pub async fn open_metadata(settings: &Settings) -> anyhow::Result<Arc<dyn MetadataStore>> {
    open_metadata_counted(settings, Default::default()).await
}

/// The metadata store, counting the MongoDB commands it sends in `commands`.
async fn open_metadata_counted(
    settings: &Settings,
    commands: prometheus_client::metrics::counter::Counter,
) -> anyhow::Result<Arc<dyn MetadataStore>> {
    Ok(match &settings.mongodb_uri {
        Some(uri) => {
            let store = MongoStore::connect(uri.expose_secret(), &settings.mongodb_db, commands)
                .await
                .context("connecting to MongoDB")?;
            match settings.mongodb_bulk_write {
                true => Arc::new(store),
                false => Arc::new(store.without_bulk_write()),
            }
        }
        None => Arc::new(EmbeddedStore::open(&settings.data_dir)?),
    })
}

/// The configured admin key, or one generated on first start and kept in
/// `data_dir/admin.key` (mode 0600) so that it survives restarts.
fn admin_key(settings: &Settings) -> anyhow::Result<SecretString> {
    if let Some(k) = &settings.admin_key {
        return Ok(k.clone());
    }
    let path = settings.data_dir.join("admin.key");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_owned().into());
    }
    let key = new_api_key();
    write_private(&path, &key).with_context(|| format!("writing {}", path.display()))?;
    // Printed, not logged: it must never reach a log pipeline.
    println!(
        "filedock: generated an admin key (kept in {}):\n  {key}",
        path.display()
    );
    Ok(key.into())
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path)?;
    f.write_all(contents.as_bytes())?;
    f.write_all(b"\n")
}

/// Queue mode's queue on its broker: RabbitMQ, or Redis Streams on a Redis
/// link of its own (its own connections and subscription); `None` for the
/// in-process queue (queue mode without Redis) and in lock mode.
fn broker_queue(
    settings: &Settings,
    locks: &Arc<Locks>,
    applier: &Applier,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<BrokerQueue>> {
    if settings.coordination != Coordination::Queue {
        return Ok(None);
    }
    if settings.queue_broker == QueueBroker::Rabbitmq {
        return Ok(Some(BrokerQueue::Rabbitmq(Arc::new(RabbitQueue::new(
            settings,
            locks.clone(),
            applier.clone(),
            metrics.clone(),
        )?))));
    }
    let Some(link) = RedisLink::from_settings(settings)? else {
        return Ok(None);
    };
    let link = link.counted(metrics.redis_commands.clone());
    Ok(Some(BrokerQueue::Redis(Arc::new(RedisQueue::connect(
        link,
        &settings.redis_prefix,
        locks.clone(),
        applier.clone(),
        metrics.clone(),
        settings.queue_wait,
    )?))))
}
