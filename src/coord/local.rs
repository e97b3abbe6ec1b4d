//! In-process queue: operations on one logical bucket apply one at a time,
//! in arrival order (tokio's mutex is fair: waiters are served first in,
//! first out). The embedded counterpart of the Redis queue.

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{Applier, BUCKETS, CoordError, Coordinator, bucket_of};
use crate::vocab::Operation;

pub struct LocalQueue {
    buckets: Vec<Mutex<()>>,
    applier: Applier,
}

impl LocalQueue {
    pub fn new(applier: Applier) -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Mutex::new(())).collect(),
            applier,
        }
    }
}

#[async_trait]
impl Coordinator for LocalQueue {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        let _turn = self.buckets[bucket_of(&op.lock_key()) as usize]
            .lock()
            .await;
        Ok(self.applier.apply(&op, None, None).await?)
    }
}
