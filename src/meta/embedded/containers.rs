//! Sessions, agents and the writes to them in the embedded store.

use async_trait::async_trait;
use serde_json::Value;

use super::{
    EmbeddedStore, apply_fence_value, events::emit_for, file_key, owned, owned_page, owner_index,
    txn::Txn, users::owner_may_write,
};
use crate::{
    meta::{
        AgentRecord, ContainerRepo, EventDraft, Fence, MetaError, MetaResult, ProcessedOp, Refusal,
        SessionRecord, Settled, events::Owners,
    },
    vocab::{AgentId, Container, FileId, OpId, Operation, SessionId, UserId},
};

/// Records a queued operation's id; `AlreadyApplied` if it was seen before.
pub(super) fn record_op(tx: &mut Txn, op_id: Option<&OpId>) -> MetaResult<()> {
    let Some(id) = op_id else { return Ok(()) };
    let key = format!("processed_ops/{id}");
    match tx.insert(&key, &ProcessedOp::applied(*id)) {
        Err(MetaError::Duplicate) => match tx.get::<ProcessedOp>(&key)?.and_then(|p| p.refused) {
            Some(why) => Err(MetaError::Refused(why)),
            None => Err(MetaError::AlreadyApplied),
        },
        r => r,
    }
}

/// Adds `id` to (or removes it from) the array `field`, keeping one copy;
/// whether that changed it.
pub(super) fn set_member(doc: &mut Value, field: &str, id: &str, present: bool) -> bool {
    if !doc[field].is_array() {
        doc[field] = Value::Array(Vec::new());
    }
    let list = doc[field].as_array_mut().expect("an array");
    let has = list.iter().any(|v| v == id);
    if present && !has {
        list.push(Value::from(id));
    } else if !present {
        list.retain(|v| v != id);
    }
    has != present
}

/// `ContainerFull` if `op` would add a member to a list of `doc` that
/// already holds `max_items` (adding one it holds changes nothing).
fn check_room(doc: &Value, op: &Operation, max_items: usize) -> MetaResult<()> {
    let Some((field, member)) = op.added_member() else {
        return Ok(());
    };
    let list = doc[field].as_array().map(Vec::as_slice).unwrap_or_default();
    if list.len() >= max_items && !list.iter().any(|v| *v == member.as_str()) {
        return Err(MetaError::ContainerFull(max_items));
    }
    Ok(())
}

/// Applies a container write inside `tx`, checking and storing `fence` on
/// the container; the event it writes if it changed the container.
pub(super) fn write_op(
    tx: &mut Txn,
    op: &Operation,
    fence: Option<&Fence>,
    max_items: usize,
) -> MetaResult<Option<EventDraft>> {
    match op {
        Operation::Attach {
            owner_id,
            container,
            file_id,
            attached,
        } => {
            let (collection, cid) = (container.collection(), container.id());
            let ckey = format!("{collection}/{cid}");
            let mut doc = owned(tx.get::<Value>(&ckey)?, owner_id)?;
            apply_fence_value(&mut doc, fence)?;
            check_room(&doc, op, max_items)?;
            let fkey = file_key(file_id);
            match tx.get::<Value>(&fkey)? {
                // The file's document is written too, so that a concurrent
                // delete of the file conflicts with this attach.
                Some(mut file)
                    if tx
                        .get::<Value>(&format!("permissions/{file_id}:{owner_id}"))?
                        .is_some() =>
                {
                    set_member(&mut file, collection, &cid, *attached);
                    tx.put(&fkey, &file)?;
                }
                _ if *attached => return Err(MetaError::NotFound),
                _ => {} // detaching a file that is gone: nothing to undo on it
            }
            let changed = set_member(&mut doc, "file_ids", &file_id.to_string(), *attached);
            tx.put(&ckey, &doc)?;
            Ok(changed.then(|| EventDraft::of_op(op)))
        }
        Operation::Link {
            owner_id,
            agent_id,
            kind,
            link_id,
            connected,
        } => {
            let key = format!("agents/{agent_id}");
            let mut doc = owned(tx.get::<Value>(&key)?, owner_id)?;
            apply_fence_value(&mut doc, fence)?;
            check_room(&doc, op, max_items)?;
            let changed = set_member(&mut doc, kind.field(), link_id.as_str(), *connected);
            tx.put(&key, &doc)?;
            Ok(changed.then(|| EventDraft::of_op(op)))
        }
        Operation::Delete {
            owner_id,
            container,
        } => {
            let (collection, cid) = (container.collection(), container.id());
            let ckey = format!("{collection}/{cid}");
            let mut doc = owned(tx.get::<Value>(&ckey)?, owner_id)?;
            apply_fence_value(&mut doc, fence)?;
            // Every file it names loses its back-reference to it.
            let files = doc["file_ids"].as_array().cloned().unwrap_or_default();
            for file_id in files
                .iter()
                .filter_map(|f| f.as_str().and_then(FileId::parse))
            {
                let fkey = file_key(&file_id);
                if let Some(mut file) = tx.get::<Value>(&fkey)? {
                    set_member(&mut file, collection, &cid, false);
                    tx.put(&fkey, &file)?;
                }
            }
            tx.delete(&ckey);
            tx.delete(&format!("{}{cid}", owner_index(collection, owner_id)));
            Ok(Some(EventDraft::of_op(op)))
        }
    }
}

#[async_trait]
impl ContainerRepo for EmbeddedStore {
    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()> {
        let session = session.clone();
        self.transaction(move |tx| {
            owner_may_write(tx, &session.owner_id)?;
            let index = owner_index("sessions", session.owner_id);
            tx.put(&format!("{index}{}", session.id), &())?;
            tx.insert(&format!("sessions/{}", session.id), &session)?;
            let created = EventDraft::container(&Container::Session(session.id), None, false);
            emit_for(tx, &session.owner_id, vec![created]).map(drop)
        })
        .await
    }

    async fn session(
        &self,
        owner_id: &UserId,
        id: &SessionId,
    ) -> MetaResult<Option<SessionRecord>> {
        let (owner, key) = (*owner_id, format!("sessions/{id}"));
        self.transaction(move |tx| {
            Ok(tx
                .get::<SessionRecord>(&key)?
                .filter(|s| s.owner_id == owner))
        })
        .await
    }

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()> {
        let agent = agent.clone();
        self.transaction(move |tx| {
            owner_may_write(tx, &agent.owner_id)?;
            tx.put(
                &format!("{}{}", owner_index("agents", agent.owner_id), agent.id),
                &(),
            )?;
            tx.insert(&format!("agents/{}", agent.id), &agent)?;
            let created =
                EventDraft::container(&Container::Agent(agent.id), Some(&agent.name), false);
            emit_for(tx, &agent.owner_id, vec![created]).map(drop)
        })
        .await
    }

    async fn agent(&self, owner_id: &UserId, id: &AgentId) -> MetaResult<Option<AgentRecord>> {
        let (owner, key) = (*owner_id, format!("agents/{id}"));
        self.transaction(move |tx| Ok(tx.get::<AgentRecord>(&key)?.filter(|a| a.owner_id == owner)))
            .await
    }

    async fn list_sessions(
        &self,
        owner_id: &UserId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> MetaResult<Vec<SessionRecord>> {
        let (owner, after) = (*owner_id, after.copied());
        self.transaction(move |tx| {
            let after = after.as_ref().map(|a| a as &dyn std::fmt::Display);
            owned_page(tx, "sessions", &owner, after, limit)
        })
        .await
    }

    async fn list_agents(
        &self,
        owner_id: &UserId,
        after: Option<&AgentId>,
        limit: usize,
    ) -> MetaResult<Vec<AgentRecord>> {
        let (owner, after) = (*owner_id, after.copied());
        self.transaction(move |tx| {
            let after = after.as_ref().map(|a| a as &dyn std::fmt::Display);
            owned_page(tx, "agents", &owner, after, limit)
        })
        .await
    }

    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&OpId>,
        max_items: usize,
    ) -> MetaResult<usize> {
        let (op, fence, op_id) = (op.clone(), fence.cloned(), op_id.copied());
        self.transaction(move |tx| {
            record_op(tx, op_id.as_ref())?;
            let event = write_op(tx, &op, fence.as_ref(), max_items)?;
            emit_for(tx, op.owner_id(), event.into_iter().collect())
        })
        .await
    }

    async fn cancel_op(&self, op_id: &OpId, why: Refusal) -> MetaResult<Settled> {
        let op_id = *op_id;
        self.transaction(move |tx| {
            let settled = ProcessedOp {
                refused: Some(why),
                ..ProcessedOp::applied(op_id)
            };
            let key = format!("processed_ops/{op_id}");
            match tx.insert(&key, &settled) {
                Ok(()) => Ok(Settled::Now),
                Err(MetaError::Duplicate) => Ok(match tx.get::<ProcessedOp>(&key)? {
                    Some(ProcessedOp {
                        refused: Some(why), ..
                    }) => Settled::Refused(why),
                    _ => Settled::Applied,
                }),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn find_op(&self, op_id: &OpId) -> MetaResult<Option<Settled>> {
        let key = format!("processed_ops/{op_id}");
        self.transaction(move |tx| {
            Ok(tx.get::<ProcessedOp>(&key)?.map(|p| match p.refused {
                Some(why) => Settled::Refused(why),
                None => Settled::Applied,
            }))
        })
        .await
    }

    async fn apply_group(
        &self,
        ops: &[(Operation, OpId)],
        fence: &Fence,
        max_items: usize,
    ) -> MetaResult<usize> {
        let (ops, fence) = (ops.to_vec(), fence.clone());
        self.transaction(move |tx| {
            let mut events = Owners::default();
            for (op, id) in &ops {
                record_op(tx, Some(id))?;
                let event = write_op(tx, op, Some(&fence), max_items)?;
                events.add(op.owner_id(), event);
            }
            let mut written = 0;
            for (owner, drafts) in events.0 {
                written += emit_for(tx, &owner, drafts)?;
            }
            Ok(written)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        meta::UserRecord,
        vocab::{LinkId, LinkKind},
    };

    fn connect(owner: UserId, agent: AgentId, link: &str, connected: bool) -> Operation {
        Operation::Link {
            owner_id: owner,
            agent_id: agent,
            kind: LinkKind::Mcp,
            link_id: LinkId::parse(link).unwrap(),
            connected,
        }
    }

    /// A queued operation refused at the bound and settled stays refused:
    /// its redelivery, after room was made, neither applies nor counts as
    /// applied, and settling it again says why it was refused.
    #[tokio::test]
    async fn an_operation_settled_unapplied_never_applies_on_redelivery() {
        let dir = std::env::temp_dir().join(format!("filedock-ops-{}", uuid::Uuid::new_v4()));
        let store = EmbeddedStore::open(&dir).unwrap();
        let user = UserRecord::new("ann".into());
        let owner = user.id;
        // The agent's owner, as a record of theirs needs one.
        let key = super::super::user_key(&owner);
        store
            .transaction(move |tx| tx.insert(&key, &user))
            .await
            .unwrap();
        let record = AgentRecord::new(owner, "a".into());
        store.insert_agent(&record).await.unwrap();
        let agent = record.id;
        let (first, second) = (OpId::new(), OpId::new());
        let a = connect(owner, agent, "a", true);
        let b = connect(owner, agent, "b", true);
        store.apply_op(&a, None, Some(&first), 1).await.unwrap();
        let refused = store.apply_op(&b, None, Some(&second), 1).await;
        assert!(
            matches!(refused, Err(MetaError::ContainerFull(1))),
            "{refused:?}"
        );
        let why = Refusal::ContainerFull(1);
        assert_eq!(
            store.cancel_op(&second, why.clone()).await.unwrap(),
            Settled::Now
        );
        // Room is made; then the refused operation is delivered again.
        let gone = connect(owner, agent, "a", false);
        store.apply_op(&gone, None, None, 1).await.unwrap();
        let again = store.apply_op(&b, None, Some(&second), 1).await;
        assert!(
            matches!(&again, Err(MetaError::Refused(w)) if *w == why),
            "{again:?}"
        );
        let stored = store.agent(&owner, &agent).await.unwrap().unwrap();
        assert!(stored.mcp_ids.is_empty(), "{:?}", stored.mcp_ids);
        let settle = |id| store.cancel_op(id, Refusal::Cancelled);
        assert_eq!(settle(&first).await.unwrap(), Settled::Applied);
        assert_eq!(settle(&second).await.unwrap(), Settled::Refused(why));
        std::fs::remove_dir_all(dir).ok();
    }
}
