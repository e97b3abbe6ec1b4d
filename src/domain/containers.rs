//! Sessions and agents: creating them, attaching files, and connecting an
//! agent's MCP servers and toolsets. Each write goes through the configured
//! coordinator: under its own lock level (`session_file_add_lock`,
//! `agent_file_add_lock`, `agent_config_lock`) or through the ordered queue,
//! and always inside a retried transaction that checks a fencing token.

use std::sync::Arc;

use super::{
    DomainError,
    page::{Page, PageRequest},
    settle::OwnedInserts,
};
use crate::{
    coord::{Coordinator, QueueStats},
    meta::{AgentRecord, ContainerRepo, SessionRecord, UserRecord, now},
    vocab::{AgentId, Container, FileId, LinkId, LinkKind, Operation, SessionId},
};

/// Sessions and agents, and the ports that takes.
pub struct ContainerService {
    meta: Arc<dyn ContainerRepo>,
    coordinator: Arc<dyn Coordinator>,
    /// A create writes the owner's document, under their commit lock.
    inserts: OwnedInserts,
}

impl ContainerService {
    pub fn new(
        meta: Arc<dyn ContainerRepo>,
        coordinator: Arc<dyn Coordinator>,
        inserts: OwnedInserts,
    ) -> Self {
        Self {
            meta,
            coordinator,
            inserts,
        }
    }

    /// The queue's figures (queue mode; lock mode has none).
    pub async fn queue_stats(&self) -> Option<QueueStats> {
        self.coordinator.stats().await
    }

    pub async fn create_session(&self, user: &UserRecord) -> Result<SessionRecord, DomainError> {
        let session = SessionRecord {
            id: SessionId::new(),
            owner_id: user.id,
            file_ids: Vec::new(),
            fence: Default::default(),
            created_at: now(),
        };
        let location = format!("/v1/sessions/{}", session.id);
        let what = ("insert_session", Some(location));
        (self.inserts)
            .insert(&user.id, what, || self.meta.insert_session(&session))
            .await?;
        Ok(session)
    }

    pub async fn session(
        &self,
        user: &UserRecord,
        id: &SessionId,
    ) -> Result<SessionRecord, DomainError> {
        self.meta
            .session(&user.id, id)
            .await?
            .ok_or(DomainError::NotFound)
    }

    /// A page of the caller's sessions in creation order.
    pub async fn sessions(
        &self,
        user: &UserRecord,
        page: &PageRequest,
    ) -> Result<Page<SessionRecord>, DomainError> {
        page.fetch(
            |after, n| async move { self.meta.list_sessions(&user.id, after.as_ref(), n).await },
            |s: &SessionRecord| s.id,
        )
        .await
    }

    /// A page of the caller's agents in creation order.
    pub async fn agents(
        &self,
        user: &UserRecord,
        page: &PageRequest,
    ) -> Result<Page<AgentRecord>, DomainError> {
        page.fetch(
            |after, n| async move { self.meta.list_agents(&user.id, after.as_ref(), n).await },
            |a: &AgentRecord| a.id,
        )
        .await
    }

    pub async fn create_agent(
        &self,
        user: &UserRecord,
        name: &str,
    ) -> Result<AgentRecord, DomainError> {
        let name = crate::vocab::ids::clean_name(name.trim(), "name")
            .map_err(DomainError::InvalidRequest)?;
        if name.is_empty() || name.chars().count() > 200 {
            return Err(DomainError::InvalidRequest(
                "name must be 1 to 200 characters".into(),
            ));
        }
        let agent = AgentRecord::new(user.id, name);
        let location = format!("/v1/agents/{}", agent.id);
        let what = ("insert_agent", Some(location));
        (self.inserts)
            .insert(&user.id, what, || self.meta.insert_agent(&agent))
            .await?;
        Ok(agent)
    }

    pub async fn agent(&self, user: &UserRecord, id: &AgentId) -> Result<AgentRecord, DomainError> {
        self.meta
            .agent(&user.id, id)
            .await?
            .ok_or(DomainError::NotFound)
    }

    /// The session after a change to it applied. A read-back that fails
    /// must not make the answer a failure (the change is in): the outcome is
    /// then reported unknown, with where to read the session. A session
    /// deleted since (a delete that came right after the change) is `None`:
    /// the change applied (its event says so) and left nothing to read.
    pub async fn session_after_change(
        &self,
        user: &UserRecord,
        id: &SessionId,
    ) -> Result<Option<SessionRecord>, DomainError> {
        match self.meta.session(&user.id, id).await {
            Ok(found) => Ok(found),
            Err(_) => Err(DomainError::OutcomeUnknown(Some(format!(
                "/v1/sessions/{id}"
            )))),
        }
    }

    /// The agent after a change to it applied (see [`Self::session_after_change`]).
    pub async fn agent_after_change(
        &self,
        user: &UserRecord,
        id: &AgentId,
    ) -> Result<Option<AgentRecord>, DomainError> {
        match self.meta.agent(&user.id, id).await {
            Ok(found) => Ok(found),
            Err(_) => Err(DomainError::OutcomeUnknown(Some(format!(
                "/v1/agents/{id}"
            )))),
        }
    }

    /// Attaches (or detaches) one of the caller's files to (from) a session or
    /// an agent the caller owns. `file_id` is `None` when what the client
    /// named is no file id at all (refused once the container is found).
    pub async fn set_attachment(
        &self,
        user: &UserRecord,
        container: Container,
        file_id: Option<FileId>,
        attached: bool,
    ) -> Result<(), DomainError> {
        // The session or agent must be the caller's (404 otherwise); a file that
        // is not one of the caller's is a bad reference in the request (400), the
        // same answer whether it exists for someone else or not at all.
        let container = match container {
            Container::Session(id) => Container::Session(self.session(user, &id).await?.id),
            Container::Agent(id) => Container::Agent(self.agent(user, &id).await?.id),
        };
        let not_yours =
            || DomainError::InvalidRequest("file_id does not name one of your files".into());
        let Some(file_id) = file_id else {
            return Err(if attached {
                not_yours()
            } else {
                DomainError::NotFound
            });
        };
        let op = Operation::Attach {
            owner_id: user.id,
            container: container.clone(),
            file_id,
            attached,
        };
        match self.coordinator.run(op).await.map_err(DomainError::from) {
            // Either the file is not the caller's or the container was
            // deleted since it was read (a delete racing the attach): 404
            // for the container gone, 400 for the file.
            Err(DomainError::NotFound) if attached => match self.exists(user, &container).await? {
                true => Err(not_yours()),
                false => Err(DomainError::NotFound),
            },
            other => other,
        }
    }

    async fn exists(&self, user: &UserRecord, container: &Container) -> Result<bool, DomainError> {
        Ok(match container {
            Container::Session(id) => self.meta.session(&user.id, id).await?.is_some(),
            Container::Agent(id) => self.meta.agent(&user.id, id).await?.is_some(),
        })
    }

    /// Deletes one of the caller's sessions or agents: its file links (and
    /// an agent's connections) go with it, its files stay the caller's and
    /// lose their back-reference to it in the same transaction. It goes
    /// through the coordinator under the lock attaches take, so an attach
    /// racing it lands before it (and goes with it) or finds it gone (404).
    /// `NotFound` if it is not the caller's.
    pub async fn delete(&self, user: &UserRecord, container: Container) -> Result<(), DomainError> {
        let op = Operation::Delete {
            owner_id: user.id,
            container,
        };
        Ok(self.coordinator.run(op).await?)
    }

    /// Connects (PUT) or disconnects (DELETE) an MCP server or toolset; both
    /// idempotent. `link_id` as the handler parsed it: a malformed one is
    /// refused once the agent is found.
    pub async fn set_link(
        &self,
        user: &UserRecord,
        agent_id: &AgentId,
        kind: LinkKind,
        link_id: Result<LinkId, String>,
        connected: bool,
    ) -> Result<(), DomainError> {
        let agent_id = self.agent(user, agent_id).await?.id;
        let link_id = link_id.map_err(DomainError::InvalidRequest)?;
        let op = Operation::Link {
            owner_id: user.id,
            agent_id,
            kind,
            link_id,
            connected,
        };
        Ok(self.coordinator.run(op).await?)
    }
}
