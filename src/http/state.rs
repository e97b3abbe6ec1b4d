//! The state the handlers share: the services, built once on the ports at
//! start-up (`startup.rs` builds it), plus settings and metrics. No service
//! sees this struct.

use std::sync::Arc;

use secrecy::SecretString;

use crate::{
    config::Settings,
    coord::brokers::BrokerQueue,
    domain::{
        containers::ContainerService,
        events::EventService,
        files::FileService,
        links::LinkSigner,
        reconcile::Reconciler,
        resumable::ResumableService,
        sweeper::Sweeper,
        tokens::TokenService,
        upload::{PrecommitHook, UploadService},
        users::UserService,
        webhooks::Webhooks,
    },
    metrics::Metrics,
    ports::Ports,
};

/// What the handlers get: the services, built once on the ports, plus
/// settings and metrics. No service sees this struct.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    /// Logs and counts account changes.
    pub audit: super::audit::Audit,
    pub metrics: Arc<Metrics>,
    pub users: Arc<UserService>,
    pub tokens: Arc<TokenService>,
    pub uploads: Arc<UploadService>,
    pub resumables: Arc<ResumableService>,
    pub files: Arc<FileService>,
    /// Signs and checks signed download links.
    pub links: Arc<LinkSigner>,
    /// Asked before each commit, when configured; it serves its read URLs.
    pub precommit: Option<Arc<PrecommitHook>>,
    pub containers: Arc<ContainerService>,
    pub events: Arc<EventService>,
    /// Webhooks' delivery and the admin's dead letters.
    pub webhooks: Arc<Webhooks>,
    pub sweeper: Arc<Sweeper>,
    pub reconciler: Arc<Reconciler>,
    /// The stages of a drain (SIGTERM), which the handlers heed.
    pub drain: super::drain::Drain,
    /// The queue on its broker, whose workers run with the server (queue
    /// mode on Redis or RabbitMQ).
    pub(crate) queue: Option<BrokerQueue>,
    /// The adapters themselves: for readiness checks, admin listings and tests.
    pub ports: Ports,
    /// Read through [`AppState::admin_key`].
    pub(crate) admin_key: SecretString,
}
