//! Opening the queue on RabbitMQ: two connections, one that publishes
//! (requests, with publisher confirms, and answers) and hears this
//! instance's answers, one that consumes the buckets. RabbitMQ blocks a
//! connection that publishes while an alarm (memory, disk) is raised;
//! the consuming one never publishes, so its acknowledgements still flow
//! and the queues still drain while requests take the lock path.

use std::sync::{Arc, atomic::Ordering};

use futures::StreamExt;
use lapin::{
    Channel, Connection, ConnectionProperties, Consumer,
    options::{BasicConsumeOptions, ConfirmSelectOptions, QueueDeclareOptions},
    types::FieldTable,
};

use super::{DIRECT_REPLY_TO, RabbitQueue, buckets, live::Live};
use crate::{config::AmqpReplyTo, coord::OpOutcome};

/// How long connecting and declaring may take.
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl RabbitQueue {
    /// Connects (within 5 s), declares the queues, opens the publishing
    /// channel and hears its answers: the queue is up (its consumers are
    /// the link's to start). The server tries once before it listens, so
    /// that its first requests go through the queue when the broker is up.
    pub async fn connect(self: &Arc<Self>) -> anyhow::Result<()> {
        match tokio::time::timeout(CONNECT_WITHIN, self.open()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(anyhow::anyhow!("cannot connect to RabbitMQ: {e}")),
            Err(_) => Err(anyhow::anyhow!("connecting to RabbitMQ timed out")),
        }
    }

    async fn open(self: &Arc<Self>) -> lapin::Result<Arc<Live>> {
        let name = |role: &str| format!("{} {role}", self.instance);
        let props = |role: &str| {
            ConnectionProperties::default().with_connection_name(name(role).as_str().into())
        };
        let publisher = Connection::connect_uri(self.uri.clone(), props("publishing")).await?;
        let conn = Connection::connect_uri(self.uri.clone(), props("consuming")).await?;
        let publish = publisher.create_channel().await?;
        let dlq = RabbitQueue::dlq_name(&self.prefix);
        publish
            .queue_declare(dlq.as_str().into(), durable(), self.expiry_args())
            .await?;
        for b in buckets() {
            self.declare_bucket(&publish, b).await?;
        }
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let (reply_to, replies) = self.hear_answers(&publish).await?;
        let answer = publisher.create_channel().await?;
        let replies = tokio::spawn(hand_replies(self.clone(), replies));
        let live = Arc::new(Live {
            conn,
            publisher,
            publish,
            answer,
            reply_to,
            generation: self.connections.fetch_add(1, Ordering::Relaxed) + 1,
            replies,
        });
        *self.live.lock().unwrap() = Some(live.clone());
        tracing::info!("connected to RabbitMQ");
        Ok(live)
    }

    /// Declares bucket `b`'s queue (the same arguments each time: a queue
    /// declared again with others is refused).
    pub(super) async fn declare_bucket(&self, channel: &Channel, b: u32) -> lapin::Result<()> {
        let name = RabbitQueue::queue_name(&self.prefix, b);
        channel
            .queue_declare(name.as_str().into(), durable(), self.bucket_args())
            .await
            .map(|_| ())
    }

    /// Where this connection's answers come (the reply-to address) and
    /// their consumer: direct reply-to, consumed on the channel that
    /// publishes the requests before its first publish; or a reply queue of
    /// this connection's own (exclusive: it goes with the connection).
    async fn hear_answers(&self, publish: &Channel) -> lapin::Result<(String, Consumer)> {
        let reply_to = match self.reply_to {
            AmqpReplyTo::Direct => DIRECT_REPLY_TO.to_owned(),
            AmqpReplyTo::Queue => {
                let own = QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                };
                let q = publish
                    .queue_declare("".into(), own, FieldTable::default())
                    .await?;
                q.name().as_str().to_owned()
            }
        };
        let no_ack = BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        };
        let replies = publish
            .basic_consume(
                reply_to.as_str().into(),
                "replies".into(),
                no_ack,
                FieldTable::default(),
            )
            .await?;
        Ok((reply_to, replies))
    }
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Hands each answer (the operation's id as its correlation id, the
/// outcome as its body) to the request waiting for it.
async fn hand_replies(queue: Arc<RabbitQueue>, mut replies: Consumer) {
    while let Some(Ok(reply)) = replies.next().await {
        let Some(op_id) = reply.properties.correlation_id() else {
            continue;
        };
        let Ok(outcome) = serde_json::from_slice::<OpOutcome>(&reply.data) else {
            continue;
        };
        if let Some(tx) = queue.front.waiters.take(op_id.as_str()) {
            let _ = tx.send(outcome);
        }
    }
}
