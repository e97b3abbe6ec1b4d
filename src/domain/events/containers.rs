//! [`Announced`] sessions and agents: their creations and changes write
//! events, and ring the bell as the files' do.

use async_trait::async_trait;

use super::announced::{Announced, unknown};
use crate::{
    meta::{AgentRecord, ContainerRepo, Fence, MetaResult, Refusal, SessionRecord, Settled},
    vocab::{AgentId, OpId, Operation, SessionId, UserId},
};

#[async_trait]
impl ContainerRepo for Announced<dyn ContainerRepo> {
    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()> {
        let r = self.inner.insert_session(session).await;
        let written = u64::from(r.is_ok());
        self.announce(&session.owner_id, written, unknown(&r)).await;
        r
    }

    async fn session(
        &self,
        owner_id: &UserId,
        id: &SessionId,
    ) -> MetaResult<Option<SessionRecord>> {
        self.inner.session(owner_id, id).await
    }

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()> {
        let r = self.inner.insert_agent(agent).await;
        let written = u64::from(r.is_ok());
        self.announce(&agent.owner_id, written, unknown(&r)).await;
        r
    }

    async fn agent(&self, owner_id: &UserId, id: &AgentId) -> MetaResult<Option<AgentRecord>> {
        self.inner.agent(owner_id, id).await
    }

    async fn list_sessions(
        &self,
        owner_id: &UserId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> MetaResult<Vec<SessionRecord>> {
        self.inner.list_sessions(owner_id, after, limit).await
    }

    async fn list_agents(
        &self,
        owner_id: &UserId,
        after: Option<&AgentId>,
        limit: usize,
    ) -> MetaResult<Vec<AgentRecord>> {
        self.inner.list_agents(owner_id, after, limit).await
    }

    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&OpId>,
        max_items: usize,
    ) -> MetaResult<usize> {
        let r = self.inner.apply_op(op, fence, op_id, max_items).await;
        let written = *r.as_ref().unwrap_or(&0) as u64;
        self.announce(op.owner_id(), written, unknown(&r)).await;
        r
    }

    async fn cancel_op(&self, op_id: &OpId, why: Refusal) -> MetaResult<Settled> {
        self.inner.cancel_op(op_id, why).await
    }

    async fn find_op(&self, op_id: &OpId) -> MetaResult<Option<Settled>> {
        self.inner.find_op(op_id).await
    }

    async fn apply_group(
        &self,
        ops: &[(Operation, OpId)],
        fence: &Fence,
        max_items: usize,
    ) -> MetaResult<usize> {
        let r = self.inner.apply_group(ops, fence, max_items).await;
        // Every owner of the group is rung: which of them the events are
        // of is not told (a group is almost always one owner's).
        let mut owners: Vec<&UserId> = ops.iter().map(|(op, _)| op.owner_id()).collect();
        owners.sort();
        owners.dedup();
        let written = *r.as_ref().unwrap_or(&0) as u64;
        self.metrics_written(written);
        for owner in owners {
            self.announce(owner, 0, written > 0 || unknown(&r)).await;
        }
        r
    }
}
