//! The fault suite's container writes: a client deletes one of the user's
//! sessions or agents (never the last of its kind) and makes a replacement,
//! so attaches keep finding containers. Both are recorded: the delete as
//! `Op::DeleteContainer` (204, 404, or unknown: applied or not), the create
//! as `Op::Create` with the id its answer named. A container whose delete
//! was answered or may have applied joins the user's deleted ones, which
//! attaches, detaches and links now and then pick (they must answer 404
//! and leave nothing behind).

use std::time::Instant;

use rand::{Rng, rngs::StdRng};
use serde_json::json;

use crate::support::{
    history::{Answer, Holder, Op},
    workload::World,
};

impl World {
    /// `POST /v1/sessions` or `/v1/agents` at `base`; an acknowledged one
    /// joins the user's containers.
    pub async fn create_container(&self, u: usize, kind: Holder, base: &str) {
        let user = &self.users[u];
        let body = match kind {
            Holder::Session => json!({}),
            Holder::Agent => json!({"name": "a"}),
        };
        let req = self
            .client
            .post(format!("{base}{}", kind.path()))
            .json(&body);
        let invoked = Instant::now();
        let (answer, res) = self.send(user, req).await;
        let id = res["id"].as_str().map(str::to_owned);
        if let (Answer::Ok, Some(id)) = (&answer, &id) {
            user.live(kind).lock().unwrap().push(id.clone());
        }
        self.record(Op::Create { user: u, kind, id }, invoked, answer, None);
    }

    /// Deletes one of the user's sessions or agents (if it has two of the
    /// kind) and, unless the delete was refused, makes a replacement.
    pub(super) async fn delete_container(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let kind = if rng.random_bool(0.5) {
            Holder::Session
        } else {
            Holder::Agent
        };
        let container = {
            let mut live = user.live(kind).lock().unwrap();
            if live.len() < 2 {
                return;
            }
            let i = rng.random_range(0..live.len());
            kind.with(live.swap_remove(i))
        };
        let base = self.base(rng);
        let req = self.client.delete(format!("{base}{}", container.path()));
        let invoked = Instant::now();
        let (answer, _) = self.send(user, req).await;
        let refused = matches!(&answer, Answer::Failed(code) if code != "not_found");
        if refused {
            let id = container.id().to_owned();
            user.live(kind).lock().unwrap().push(id);
        } else {
            user.buried(container.clone());
        }
        let op = Op::DeleteContainer { user: u, container };
        self.record(op, invoked, answer, None);
        if !refused {
            self.create_container(u, kind, &base).await;
        }
    }
}
