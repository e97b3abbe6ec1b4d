//! In-process queue: one task per logical bucket applies its operations in
//! arrival order. The embedded counterpart of the Redis queue.

use async_trait::async_trait;
use tokio::sync::{OnceCell, mpsc, oneshot};

use super::{BUCKETS, Coordinator, Operation, apply, bucket_of};
use crate::{error::ApiError, startup::AppState};

type Job = (Operation, oneshot::Sender<Result<(), ApiError>>);

#[derive(Default)]
pub struct LocalQueue {
    buckets: OnceCell<Vec<mpsc::UnboundedSender<Job>>>,
}

impl LocalQueue {
    fn start(state: &AppState) -> Vec<mpsc::UnboundedSender<Job>> {
        (0..BUCKETS)
            .map(|_| {
                let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
                let state = state.clone();
                tokio::spawn(async move {
                    while let Some((op, reply)) = rx.recv().await {
                        let _ =
                            reply.send(apply(&state, &op, None, None).await.map_err(Into::into));
                    }
                });
                tx
            })
            .collect()
    }
}

#[async_trait]
impl Coordinator for LocalQueue {
    async fn run(&self, state: &AppState, op: Operation) -> Result<(), ApiError> {
        let buckets = self
            .buckets
            .get_or_init(|| async { Self::start(state) })
            .await;
        let (tx, rx) = oneshot::channel();
        let bucket = bucket_of(&op.lock_key()) as usize;
        buckets[bucket]
            .send((op, tx))
            .map_err(|_| ApiError::internal(anyhow::anyhow!("queue worker stopped")))?;
        rx.await
            .map_err(|_| ApiError::internal(anyhow::anyhow!("queue worker stopped")))?
    }
}
