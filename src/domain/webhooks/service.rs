//! What the dispatchers share, and the admin's dead letters.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::endpoint::{Endpoint, body_of};
use crate::{
    config::WebhookSettings,
    coord::members::Members,
    domain::DomainError,
    hooks::{Answer, Caller},
    lock::Locks,
    meta::{DeadLetter, EventBell, EventRepo, WebhookRepo},
    metrics::{Metrics, OutcomeLabel},
};

/// What the dispatchers share, and the admin's dead letters.
pub struct Webhooks {
    pub(super) endpoints: Vec<Endpoint>,
    /// `None`: no webhooks configured.
    pub(super) caller: Option<Caller>,
    pub(super) settings: Option<WebhookSettings>,
    pub(super) repo: Arc<dyn WebhookRepo>,
    pub(super) events: Arc<dyn EventRepo>,
    pub(super) bell: Arc<dyn EventBell>,
    pub(super) locks: Arc<Locks>,
    pub(super) members: Arc<Members>,
    pub(super) metrics: Arc<Metrics>,
    /// Each dispatcher's figures (pending, oldest age), by endpoint.
    figures: Mutex<HashMap<String, (i64, i64)>>,
}

/// The stores and coordination the dispatchers use.
pub struct WebhookPorts {
    pub repo: Arc<dyn WebhookRepo>,
    pub events: Arc<dyn EventRepo>,
    /// The events' bell (the feed's rings wake the readers).
    pub bell: Arc<dyn EventBell>,
    pub locks: Arc<Locks>,
    pub members: Members,
    pub metrics: Arc<Metrics>,
}

impl Webhooks {
    /// `hooks`: the settings and the caller made from their secret, when
    /// webhooks are configured.
    pub fn new(hooks: Option<(WebhookSettings, Caller)>, ports: WebhookPorts) -> Self {
        let (settings, caller) = hooks.unzip();
        let endpoints = settings
            .iter()
            .flat_map(|s| s.urls.iter().map(|u| Endpoint::new(u)))
            .collect();
        Self {
            endpoints,
            caller,
            settings,
            repo: ports.repo,
            events: ports.events,
            bell: ports.bell,
            locks: ports.locks,
            members: Arc::new(ports.members),
            metrics: ports.metrics,
            figures: Mutex::default(),
        }
    }

    /// Dead letters in id order after `after`, at most `limit` (1 to 1000).
    pub async fn dead_letters(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DomainError> {
        if !(1..=1000).contains(&limit) {
            return Err(DomainError::InvalidRequest(
                "limit must be between 1 and 1000".into(),
            ));
        }
        Ok(self.repo.dead_letters(after, limit).await?)
    }

    /// Delivers dead letter `id` once more, now (out of its owner's order:
    /// it was given up on); removed once its receiver took it. `NotFound`
    /// if there is none.
    pub async fn replay(&self, id: &str) -> Result<Answer, DomainError> {
        let letter = self
            .repo
            .dead_letter(id)
            .await?
            .ok_or(DomainError::NotFound)?;
        let Some(caller) = &self.caller else {
            return Err(DomainError::InvalidRequest(
                "webhooks are off (FILEDOCK_WEBHOOK_URL is unset): nothing to replay to".into(),
            ));
        };
        let Some(endpoint) = self.endpoints.iter().find(|e| e.id == letter.endpoint) else {
            return Err(DomainError::InvalidRequest(
                "this dead letter's URL is no longer in FILEDOCK_WEBHOOK_URL; discard it".into(),
            ));
        };
        let body = body_of(&letter.event);
        let answer = caller.post(&endpoint.url, &letter.event.id, &body).await;
        if let Answer::Accepted(_) = answer {
            self.repo.remove_dead_letter(id).await?;
            self.count("replayed");
        }
        Ok(answer)
    }

    /// Discards dead letter `id`; `NotFound` if there is none.
    pub async fn discard(&self, id: &str) -> Result<(), DomainError> {
        match self.repo.remove_dead_letter(id).await? {
            true => Ok(()),
            false => Err(DomainError::NotFound),
        }
    }

    /// Publishes one dispatcher's figures: pending summed over the
    /// endpoints, the oldest age their most.
    pub(super) fn report(&self, endpoint: &str, pending: i64, oldest_age: i64) {
        let mut figures = self.figures.lock().unwrap();
        figures.insert(endpoint.to_owned(), (pending, oldest_age));
        let total = figures.values().map(|f| f.0).sum();
        let oldest = figures.values().map(|f| f.1).max().unwrap_or(0);
        self.metrics.webhook_pending.set(total);
        self.metrics.webhook_oldest_pending_age.set(oldest);
    }

    pub(super) fn count(&self, outcome: &str) {
        self.metrics
            .webhook_deliveries
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }
}
