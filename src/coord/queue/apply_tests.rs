//! The consumers' shared apply loop (`apply.rs`) on the embedded store.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{
    apply::{Answered, Applying, Delivered, Sink, Step},
    now_ms,
    stats::Recent,
};
use crate::{
    config::Settings,
    coord::{Applier, OpOutcome},
    meta::{
        AgentRecord, ApiKeyRecord, ContainerRepo, Fence, Refusal, UserRecord, UserRepo, UserTurns,
        embedded::EmbeddedStore, now, retry::Transactions,
    },
    metrics::Metrics,
    vocab::{ApiKeyHash, LinkId, LinkKind, OpId, Operation},
};

/// What the consumer told the broker of each delivery: its outcome, and
/// whether it went to the dead letters (else it was acknowledged).
#[derive(Default)]
struct Told(Vec<(OpOutcome, bool)>);

#[async_trait]
impl Sink<()> for Told {
    async fn deliver(&mut self, done: &[Answered<'_, ()>]) -> Step {
        self.0
            .extend(done.iter().map(|a| (a.outcome.clone(), a.dead.is_some())));
        Step::Next
    }
}

/// An operation dead-lettered, whose rejection the broker did not hear
/// (the link went down before it), is delivered again: it is not applied,
/// and it goes to the dead letters again rather than being acknowledged
/// (which would lose the letter).
#[tokio::test]
async fn a_dead_lettered_operation_delivered_again_is_dead_lettered_again() {
    let dir = std::env::temp_dir().join(format!("filedock-apply-{}", uuid::Uuid::new_v4()));
    let settings = Settings::embedded(&dir);
    let store = Arc::new(EmbeddedStore::open(&dir).unwrap());
    let user = UserRecord::new("ann".into());
    let owner = user.id;
    let key = ApiKeyRecord {
        id: Default::default(),
        user_id: owner,
        name: "default".into(),
        hash: ApiKeyHash::from_hex(format!("hash-{owner}")),
        created_at: now(),
    };
    store.insert_user(&user, &key).await.unwrap();
    let agent = AgentRecord::new(owner, "a".into());
    store.insert_agent(&agent).await.unwrap();
    let agent = agent.id;
    let metrics = Arc::new(Metrics::default());
    let txns = Transactions::new(settings.txn_retry, metrics.clone());
    let applier = Applier::new(store.clone(), (txns, Arc::new(UserTurns::default())), 8);
    let op_id = OpId::new();
    // Given up on: settled as dead-lettered before its rejection was sent.
    applier.cancel(&op_id, Refusal::DeadLettered).await.unwrap();
    let (recent, lost) = (Recent::default(), CancellationToken::new());
    let applying = Applying {
        applier: &applier,
        metrics: &metrics,
        recent: &recent,
        fence: Fence::of_queue_bucket(0, 1),
        lost: &lost,
    };
    let op = Operation::Link {
        owner_id: owner,
        agent_id: agent,
        kind: LinkKind::Mcp,
        link_id: LinkId::parse("x").unwrap(),
        connected: true,
    };
    let again = Delivered {
        handle: (),
        op_id: Some(op_id),
        reply_to: None,
        enqueued_ms: now_ms(),
        op: Ok(op),
    };
    let mut told = Told::default();
    assert!(matches!(
        applying.handle(&mut told, &[again]).await,
        Step::Next
    ));
    assert_eq!(told.0.len(), 1);
    let (outcome, dead) = &told.0[0];
    assert!(matches!(outcome, OpOutcome::DeadLettered(_)), "{outcome:?}");
    assert!(dead, "acknowledged: the dead letter would be lost");
    let stored = store.agent(&owner, &agent).await.unwrap().unwrap();
    assert!(stored.mcp_ids.is_empty(), "applied: {:?}", stored.mcp_ids);
    std::fs::remove_dir_all(dir).ok();
}
