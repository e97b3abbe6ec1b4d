//! The queue on whichever broker carries it (`FILEDOCK_QUEUE_BROKER`), for
//! what the server starts and stops with it.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    Coordinator,
    queue::{RedisQueue, rabbit::RabbitQueue},
};

/// A broker's queue.
#[derive(Clone)]
pub enum BrokerQueue {
    Redis(Arc<RedisQueue>),
    Rabbitmq(Arc<RabbitQueue>),
}

impl BrokerQueue {
    /// Starts its background work: the bucket manager (Redis) or the
    /// broker's link and its consumers (RabbitMQ); it stops with
    /// `shutdown`, once the operations in hand are done.
    pub fn spawn_workers(&self, shutdown: CancellationToken) -> JoinHandle<()> {
        match self {
            Self::Redis(q) => q.spawn_workers(shutdown),
            Self::Rabbitmq(q) => q.spawn_workers(shutdown),
        }
    }

    pub fn coordinator(&self) -> Arc<dyn Coordinator> {
        match self {
            Self::Redis(q) => q.clone(),
            Self::Rabbitmq(q) => q.clone(),
        }
    }
}
