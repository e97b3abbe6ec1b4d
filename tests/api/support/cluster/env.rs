//! The environment the fault suite starts its filedock processes with.

use filedock::config::QueueBroker;

use super::{
    AUTH_CACHE, CONTAINER_MAX_ITEMS, Cluster, GRACE, LOCK_TTL, MAX_KEYS, MAX_TOKENS, PART_SIZE,
    SETTLE_WINDOW, TUS_EXPIRY,
};
use crate::{
    helpers::binary_env,
    support::{
        fault_deck::{DEAD_LETTER_AGE, dead_letters_in},
        own_sentinel::MASTER,
    },
};

/// The instances' shared link secret (`FILEDOCK_LINK_SECRET`).
const LINK_SECRET: &str = "fault-suite-link-secret-shared-by-both-instances";

impl Cluster {
    /// What an instance is started with: the suite's settings, its links
    /// to the backends through their proxies (RabbitMQ's too, in that mode).
    pub(super) fn instance_env(&self) -> Vec<(String, String)> {
        let mut env = binary_env(&self.settings);
        // A drain (the `drain` fault) is unready a second before it closes.
        env.push(("FILEDOCK_DRAIN_READY_GRACE_SECS".into(), "1".into()));
        let redis = match (&self.own_cluster, &self.own_sentinel) {
            (Some(own), _) => [
                ("FILEDOCK_REDIS_URL", own.seeds()),
                ("FILEDOCK_REDIS_MODE", "cluster".into()),
                ("FILEDOCK_REDIS_SENTINEL_MASTER", String::new()),
            ],
            (None, Some(own)) => [
                ("FILEDOCK_REDIS_URL", own.urls().to_owned()),
                ("FILEDOCK_REDIS_MODE", "sentinel".into()),
                ("FILEDOCK_REDIS_SENTINEL_MASTER", MASTER.into()),
            ],
            (None, None) => [
                (
                    "FILEDOCK_REDIS_URL",
                    format!("redis://{}/", self.redis.addr()),
                ),
                ("FILEDOCK_REDIS_MODE", "single".into()),
                ("FILEDOCK_REDIS_SENTINEL_MASTER", String::new()),
            ],
        };
        env.extend(redis.map(|(k, v)| (k.to_owned(), v)));
        env.extend(
            [
                (
                    "FILEDOCK_MONGODB_URI",
                    format!(
                        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=1000",
                        self.mongo.addr()
                    ),
                ),
                ("FILEDOCK_S3_ENDPOINT", format!("http://{}", self.s3.addr())),
                ("FILEDOCK_S3_PART_SIZE", PART_SIZE.to_string()),
                ("FILEDOCK_TUS_EXPIRY_SECS", TUS_EXPIRY.as_secs().to_string()),
                (
                    "FILEDOCK_MAX_CONTAINER_ITEMS",
                    CONTAINER_MAX_ITEMS.to_string(),
                ),
                ("FILEDOCK_COORDINATION", self.coordination.clone()),
                ("FILEDOCK_LOCK_TTL_SECS", LOCK_TTL.as_secs().to_string()),
                ("FILEDOCK_LOCK_WAIT_SECS", "10".into()),
                (
                    "FILEDOCK_SETTLE_WINDOW_SECS",
                    SETTLE_WINDOW.as_secs().to_string(),
                ),
                (
                    "FILEDOCK_SWEEP_INTENT_GRACE_SECS",
                    GRACE.as_secs().to_string(),
                ),
                ("FILEDOCK_SWEEP_RETRY_INTERVAL_SECS", "0".into()),
                ("FILEDOCK_AUTH_CACHE_SECS", AUTH_CACHE.as_secs().to_string()),
                ("FILEDOCK_MAX_KEYS_PER_USER", MAX_KEYS.to_string()),
                ("FILEDOCK_MAX_TOKENS_PER_USER", MAX_TOKENS.to_string()),
                // Shared, as every instance behind one URL needs: a link
                // made at one downloads at the other, and after a restart.
                ("FILEDOCK_LINK_SECRET", LINK_SECRET.into()),
                // Every event to the suite's receiver, retried soon after
                // a fault (the nemesis's receiver faults last seconds).
                ("FILEDOCK_WEBHOOK_URL", self.receiver.url()),
                ("FILEDOCK_WEBHOOK_SECRET", self.receiver.secret()),
                ("FILEDOCK_WEBHOOK_RETRY_MAX_SECS", "1".into()),
                ("FILEDOCK_WEBHOOK_TIMEOUT_SECS", "3".into()),
                ("FILEDOCK_PRECOMMIT_HOOK_URL", self.hook.url()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        // Set either way: FILEDOCK_TEST_QUEUE_BROKER may have set it above.
        let broker = match self.broker {
            QueueBroker::Redis => "redis",
            QueueBroker::Rabbitmq => "rabbitmq",
        };
        env.push(("FILEDOCK_QUEUE_BROKER".into(), broker.into()));
        if let Some(amqp) = &self.amqp {
            let url = format!("amqp://guest:guest@{}/%2f", amqp.addr());
            env.push(("FILEDOCK_AMQP_URL".into(), url));
        }
        // Where the nemesis makes dead letters: events given up on soon.
        if dead_letters_in(&self.coordination, self.topology) {
            let age = DEAD_LETTER_AGE.as_secs().to_string();
            env.push(("FILEDOCK_WEBHOOK_MAX_AGE_SECS".to_owned(), age));
        }
        env
    }
}
