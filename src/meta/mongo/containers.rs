//! Sessions, agents and the writes to them on MongoDB, one at a time or as
//! a group commit.

use async_trait::async_trait;
use bson::{Bson, Document, bson, doc};
use mongodb::{ClientSession, options::ReturnDocument};

use super::{
    MongoStore,
    errors::classify,
    find_sorted,
    op_group::{GroupStep, LinkRun, plan_group},
    owned_after,
    txn::add_fence,
};
use crate::{
    meta::{
        AgentRecord, ContainerRepo, EventDraft, Fence, MetaError, MetaResult, ProcessedOp, Refusal,
        SessionRecord, Settled, events::Owners,
    },
    vocab::{AgentId, Container, OpId, Operation, SessionId, UserId},
};

/// Adds to `filter` that the list `field` has room for `added` more
/// members of at most `max` (its member at index `max - added` does not
/// exist), or, for one member, that it holds that member already (adding it
/// changes nothing). `ContainerFull` if `added` alone passes `max`.
fn require_room(
    filter: &mut Document,
    field: &str,
    max: usize,
    added: usize,
    member: Option<Bson>,
) -> MetaResult<()> {
    let Some(last_free) = max.checked_sub(added) else {
        return Err(MetaError::ContainerFull(max));
    };
    let room = doc! {format!("{field}.{last_free}"): {"$exists": false}};
    let check = match member {
        Some(m) => doc! {"$or": [room, {field: m}]},
        None => room,
    };
    // (`$and` may hold other checks already.)
    match filter.get_array_mut("$and") {
        Ok(all) => all.push(check.into()),
        Err(_) => {
            filter.insert("$and", vec![check]);
        }
    }
    Ok(())
}

/// The list of an owned document an update changes.
struct List<'a> {
    collection: &'a str,
    field: &'a str,
    owner_id: &'a UserId,
    id: Bson,
}

impl<'a> List<'a> {
    fn new(collection: &'a str, field: &'a str, (owner_id, id): (&'a UserId, String)) -> Self {
        Self {
            collection,
            field,
            owner_id,
            id: id.into(),
        }
    }
}

/// Whether the list `field` of `doc` holds `member`.
fn holds(doc: &Document, field: &str, member: &str) -> bool {
    doc.get_array(field)
        .is_ok_and(|l| l.iter().any(|m| m.as_str() == Some(member)))
}

impl MongoStore {
    /// Records a queued operation's id; `AlreadyApplied` if it was seen before.
    async fn record_op(&self, s: &mut ClientSession, op_id: Option<&OpId>) -> MetaResult<()> {
        let Some(id) = op_id else { return Ok(()) };
        let ops = self.db.collection::<ProcessedOp>("processed_ops");
        match ops
            .insert_one(ProcessedOp::applied(*id))
            .session(&mut *s)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(e) {
                MetaError::Duplicate => {
                    // Read outside the transaction, which the failed insert
                    // aborted; the record it met is committed.
                    let seen = ops.find_one(doc! {"_id": id}).await.map_err(classify)?;
                    match seen.and_then(|p| p.refused) {
                        Some(why) => Err(MetaError::Refused(why)),
                        None => Err(MetaError::AlreadyApplied),
                    }
                }
                e => Err(e),
            },
        }
    }

    /// Applies a container write in `s`, checking and storing `fence` on the
    /// container; the event it writes if it changed the container.
    async fn write_op(
        &self,
        s: &mut ClientSession,
        op: &Operation,
        fence: Option<&Fence>,
        max_items: usize,
    ) -> MetaResult<Option<EventDraft>> {
        let mut filter = doc! {};
        let bound = match op.added_member() {
            Some((field, member)) => {
                require_room(&mut filter, field, max_items, 1, Some(member.into()))?;
                Some(max_items)
            }
            None => None,
        };
        match op {
            Operation::Attach {
                owner_id,
                container,
                file_id,
                attached,
            } => {
                let (collection, cid) = (container.collection(), container.id());
                // The file's document is written too, so that a concurrent
                // delete of the file conflicts with this attach. A file the
                // owner may use is their own (a user holds permissions on
                // their own files only): it is found by its owner too.
                let file = doc! {"_id": file_id, "owner_id": owner_id};
                if *attached {
                    let allowed = self
                        .permissions()
                        .find_one(doc! {"file_id": file_id, "user_id": owner_id})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                    let updated = self
                        .files()
                        .update_one(file, doc! {"$addToSet": {collection: &cid}})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                    if allowed.is_none() || updated.matched_count == 0 {
                        return Err(MetaError::NotFound);
                    }
                } else {
                    self.files()
                        .update_one(file, doc! {"$pull": {collection: &cid}})
                        .session(&mut *s)
                        .await
                        .map_err(classify)?;
                }
                let verb = if *attached { "$addToSet" } else { "$pull" };
                filter.extend(doc! {"_id": &cid, "owner_id": owner_id});
                let mut update = doc! {verb: {"file_ids": file_id}};
                add_fence(&mut filter, &mut update, "fence", fence);
                let list = List::new(collection, "file_ids", (owner_id, cid));
                let before = self
                    .update_owned(s, &list, (filter, update), fence, bound)
                    .await?;
                let changed = holds(&before, "file_ids", &file_id.to_string()) != *attached;
                Ok(changed.then(|| EventDraft::of_op(op)))
            }
            Operation::Link {
                owner_id,
                agent_id,
                kind,
                link_id,
                connected,
            } => {
                let verb = if *connected { "$addToSet" } else { "$pull" };
                filter.extend(doc! {"_id": agent_id, "owner_id": owner_id});
                let mut update = doc! {verb: {kind.field(): link_id}};
                add_fence(&mut filter, &mut update, "fence", fence);
                let list = List::new("agents", kind.field(), (owner_id, agent_id.to_string()));
                let before = self
                    .update_owned(s, &list, (filter, update), fence, bound)
                    .await?;
                let changed = holds(&before, kind.field(), link_id.as_str()) != *connected;
                Ok(changed.then(|| EventDraft::of_op(op)))
            }
            Operation::Delete {
                owner_id,
                container,
            } => {
                self.delete_container_in(s, owner_id, container, fence)
                    .await?;
                Ok(Some(EventDraft::of_op(op)))
            }
        }
    }

    /// Deletes a container (fenced) and, in the same transaction, every
    /// back-reference to it on the files it names.
    async fn delete_container_in(
        &self,
        s: &mut ClientSession,
        owner_id: &UserId,
        container: &Container,
        fence: Option<&Fence>,
    ) -> MetaResult<()> {
        let (collection, cid) = (container.collection(), container.id());
        let coll = self.db.collection::<Document>(collection);
        let mut filter = doc! {"_id": &cid, "owner_id": owner_id};
        add_fence(&mut filter, &mut Document::new(), "fence", fence);
        let deleted = coll
            .find_one_and_delete(filter)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let Some(deleted) = deleted else {
            let found = coll
                .find_one(doc! {"_id": &cid, "owner_id": owner_id})
                .session(&mut *s)
                .await
                .map_err(classify)?;
            return Err(match found {
                Some(_) => MetaError::StaleFence,
                None => MetaError::NotFound,
            });
        };
        let files = deleted.get_array("file_ids").cloned().unwrap_or_default();
        if !files.is_empty() {
            // The owner's: only their own files go into their containers.
            self.files()
                .update_many(
                    doc! {"_id": {"$in": files}, "owner_id": owner_id},
                    doc! {"$pull": {collection: &cid}},
                )
                .session(&mut *s)
                .await
                .map_err(classify)?;
        }
        Ok(())
    }

    /// A run of one agent's link changes: one `$pullAll`, one `$addToSet`;
    /// the events of the changes that changed the list, in the run's order.
    async fn write_links(
        &self,
        s: &mut ClientSession,
        run: &LinkRun<'_>,
        fence: &Fence,
        max_items: usize,
    ) -> MetaResult<Vec<EventDraft>> {
        let field = run.kind.field();
        let changes = [
            ("$pullAll", bson!(&run.remove)),
            ("$addToSet", bson!({"$each": &run.add})),
        ];
        // The list before each update: a link removed changed it if it was
        // there before the `$pullAll`, one added if it was not there before
        // the `$addToSet` (the run names each link once).
        let mut before = [Document::new(), Document::new()];
        for (((verb, value), ids), seen) in changes
            .into_iter()
            .zip([&run.remove, &run.add])
            .zip(&mut before)
        {
            if ids.is_empty() {
                continue;
            }
            let mut filter = doc! {"_id": run.agent_id, "owner_id": run.owner_id};
            // Room for every added link, as if none were there yet: a
            // refusal applies the group one at a time.
            let bound = (verb == "$addToSet").then_some(max_items);
            if bound.is_some() {
                require_room(&mut filter, field, max_items, ids.len(), None)?;
            }
            let mut update = doc! {verb: {field: value}};
            add_fence(&mut filter, &mut update, "fence", Some(fence));
            let list = List::new("agents", field, (run.owner_id, run.agent_id.to_string()));
            *seen = self
                .update_owned(s, &list, (filter, update), Some(fence), bound)
                .await?;
        }
        let [pulled, added] = &before;
        Ok((run.ops.iter())
            .filter(|(_, link, connected)| match connected {
                true => !holds(added, field, link.as_str()),
                false => holds(pulled, field, link.as_str()),
            })
            .map(|(op, ..)| EventDraft::of_op(op))
            .collect())
    }

    /// Applies a fenced update (`change`: filter and update) to a list of
    /// an owned document; the document before it, with that list alone.
    /// When nothing matched, tells `NotFound` (not the owner's, or absent)
    /// from `StaleFence` and, when the filter bounds the list at `bound`
    /// members, from `ContainerFull`.
    async fn update_owned(
        &self,
        s: &mut ClientSession,
        list: &List<'_>,
        (filter, update): (Document, Document),
        fence: Option<&Fence>,
        bound: Option<usize>,
    ) -> MetaResult<Document> {
        let coll = self.db.collection::<Document>(list.collection);
        let before = coll
            .find_one_and_update(filter, update)
            .projection(doc! {list.field: 1})
            .return_document(ReturnDocument::Before)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if let Some(before) = before {
            return Ok(before);
        }
        match coll
            .find_one(doc! {"_id": &list.id, "owner_id": list.owner_id})
            .session(&mut *s)
            .await
        {
            Ok(Some(doc)) => {
                let stored = |f: &Fence| doc.get_document("fence").ok()?.get_i64(&f.slot).ok();
                let fenced_out = fence.is_some_and(|f| stored(f).is_some_and(|t| t > f.token));
                match bound {
                    // The fence passed: the list's bound is what refused it.
                    Some(max) if !fenced_out => Err(MetaError::ContainerFull(max)),
                    _ => Err(MetaError::StaleFence),
                }
            }
            Ok(None) => Err(MetaError::NotFound),
            Err(e) => Err(classify(e)),
        }
    }
}

#[async_trait]
impl ContainerRepo for MongoStore {
    async fn insert_session(&self, session: &SessionRecord) -> MetaResult<()> {
        let created = EventDraft::container(&Container::Session(session.id), None, false);
        self.insert_owned(&session.owner_id, &self.sessions(), session, created)
            .await
    }

    async fn session(
        &self,
        owner_id: &UserId,
        id: &SessionId,
    ) -> MetaResult<Option<SessionRecord>> {
        self.sessions()
            .find_one(doc! {"_id": id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn insert_agent(&self, agent: &AgentRecord) -> MetaResult<()> {
        let created = EventDraft::container(&Container::Agent(agent.id), Some(&agent.name), false);
        self.insert_owned(&agent.owner_id, &self.agents(), agent, created)
            .await
    }

    async fn agent(&self, owner_id: &UserId, id: &AgentId) -> MetaResult<Option<AgentRecord>> {
        self.agents()
            .find_one(doc! {"_id": id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn list_sessions(
        &self,
        owner_id: &UserId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> MetaResult<Vec<SessionRecord>> {
        find_sorted(
            self.sessions(),
            owned_after(owner_id, after),
            doc! {"_id": 1},
            limit,
        )
        .await
    }

    async fn list_agents(
        &self,
        owner_id: &UserId,
        after: Option<&AgentId>,
        limit: usize,
    ) -> MetaResult<Vec<AgentRecord>> {
        find_sorted(
            self.agents(),
            owned_after(owner_id, after),
            doc! {"_id": 1},
            limit,
        )
        .await
    }

    async fn apply_op(
        &self,
        op: &Operation,
        fence: Option<&Fence>,
        op_id: Option<&OpId>,
        max_items: usize,
    ) -> MetaResult<usize> {
        let mut s = self.txns.begin(fence).await?;
        let result = async {
            self.record_op(&mut s, op_id).await?;
            let event = self.write_op(&mut s, op, fence, max_items).await?;
            // Last: the owner's document is written as late as it can be.
            self.emit(&mut s, op.owner_id(), event.into_iter().collect())
                .await
        }
        .await;
        self.txns.finish(s, fence, result).await
    }

    async fn cancel_op(&self, op_id: &OpId, why: Refusal) -> MetaResult<Settled> {
        let settled = ProcessedOp {
            refused: Some(why),
            ..ProcessedOp::applied(*op_id)
        };
        let ops = self.db.collection::<ProcessedOp>("processed_ops");
        match ops.insert_one(&settled).await.map_err(classify) {
            Ok(_) => Ok(Settled::Now),
            Err(MetaError::Duplicate) => {
                let seen = ops.find_one(doc! {"_id": op_id}).await.map_err(classify)?;
                Ok(match seen.and_then(|p| p.refused) {
                    Some(why) => Settled::Refused(why),
                    None => Settled::Applied,
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn find_op(&self, op_id: &OpId) -> MetaResult<Option<Settled>> {
        let ops = self.db.collection::<ProcessedOp>("processed_ops");
        let seen = ops.find_one(doc! {"_id": op_id}).await.map_err(classify)?;
        Ok(seen.map(|p| match p.refused {
            Some(why) => Settled::Refused(why),
            None => Settled::Applied,
        }))
    }

    async fn apply_group(
        &self,
        ops: &[(Operation, OpId)],
        fence: &Fence,
        max_items: usize,
    ) -> MetaResult<usize> {
        let mut s = self.txns.begin(Some(fence)).await?;
        let result = async {
            let records: Vec<ProcessedOp> = ops
                .iter()
                .map(|(_, id)| ProcessedOp::applied(*id))
                .collect();
            self.db
                .collection::<ProcessedOp>("processed_ops")
                .insert_many(records)
                .session(&mut s)
                .await
                .map_err(classify)?;
            let mut events = Owners::default();
            for step in plan_group(ops) {
                match step {
                    GroupStep::One(op) => {
                        let event = self.write_op(&mut s, op, Some(fence), max_items).await?;
                        events.add(op.owner_id(), event);
                    }
                    GroupStep::Links(run) => {
                        let drafts = self.write_links(&mut s, &run, fence, max_items).await?;
                        events.add(run.owner_id, drafts);
                    }
                }
            }
            let mut written = 0;
            for (owner, drafts) in events.0 {
                written += self.emit(&mut s, &owner, drafts).await?;
            }
            Ok(written)
        }
        .await;
        self.txns.finish(s, Some(fence), result).await
    }
}
