//! In-process queue: operations on one logical bucket apply one at a time,
//! in arrival order (tokio's mutex is fair: waiters are served first in,
//! first out). The embedded counterpart of the Redis queue.

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{BUCKETS, Coordinator, Operation, apply, bucket_of};
use crate::{error::ApiError, startup::AppState};

pub struct LocalQueue {
    buckets: Vec<Mutex<()>>,
}

impl Default for LocalQueue {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Mutex::new(())).collect(),
        }
    }
}

#[async_trait]
impl Coordinator for LocalQueue {
    async fn run(&self, state: &AppState, op: Operation) -> Result<(), ApiError> {
        let _turn = self.buckets[bucket_of(&op.lock_key()) as usize]
            .lock()
            .await;
        Ok(apply(state, &op, None, None).await?)
    }
}
