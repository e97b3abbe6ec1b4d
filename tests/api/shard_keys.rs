//! MongoDB at scale, in code (issue 48, part 4): every command a request
//! path sends to a sharded collection names the owner (the first field of
//! the collection's shard key, README "Scaling out: MongoDB sharded"), so
//! that a sharded cluster sends it to one shard, not to all of them. The
//! app's store tells the test every command it sends while a workload takes
//! every request path once (`support::every_path`); each filter (and each
//! document inserted) is held to the rule (`support::shard_rules`), and the
//! test fails listing each one that breaks it and is not in [`SCATTERED`],
//! the commented list of reads and writes that are cross-user by nature.
//! Real backends only (the embedded store sends no commands).

use std::sync::{Arc, Mutex};
use std::{collections::BTreeSet, time::Duration};

use filedock::{
    http::AppState,
    meta::mongo::{CommandObserver, MongoStore, SentCommand},
    ports::Ports,
};
use secrecy::ExposeSecret;

use crate::{
    helpers::{TestApp, real_backends, spawn_app_with_state, test_settings},
    support::{
        every_path::every_path,
        shard_rules::{Sent, filters},
    },
};

/// A command that may go to every shard: on `collection`, a `command` whose
/// filter's top-level fields are exactly `fields`.
struct Scattered {
    collection: &'static str,
    command: &'static str,
    fields: &'static [&'static str],
    why: &'static str,
}

const fn scattered(
    collection: &'static str,
    command: &'static str,
    fields: &'static [&'static str],
    why: &'static str,
) -> Scattered {
    Scattered {
        collection,
        command,
        fields,
        why,
    }
}

/// The commands exempt from the rule, each with why it may go to every
/// shard. Two kinds: those that read (or expire) every user's documents by
/// nature, sent by the admin's reads, the sweeper or the event sequencer,
/// never by a user's request; and, on the key and token collections,
/// sharded by hash (a request is authenticated by it before its owner is
/// known), those that find a user's keys or tokens by user or id instead,
/// rare next to authentication (listing, revoking, a mint's checks, a
/// user's deletion). None is a `findAndModify`, which must name its shard key.
const SCATTERED: &[Scattered] = &[
    scattered("users", "find", &[], "the admin's list of users"),
    scattered(
        "users",
        "find",
        &["deleting_since"],
        "the sweeper: the users being deleted",
    ),
    scattered(
        "events",
        "find",
        &["feed"],
        "the sequencer: the events not in the feed yet; the admin's read of the feed",
    ),
    scattered(
        "events",
        "find",
        &["time", "feed"],
        "the sweeper: the events past their retention",
    ),
    scattered(
        "events",
        "find",
        &[],
        "the sweeper: the oldest event kept (a gauge)",
    ),
    scattered(
        "upload_intents",
        "find",
        &["$and"],
        "the sweeper: the stale intents",
    ),
    scattered(
        "upload_intents",
        "aggregate",
        &[],
        "the sweeper: the intents in flight (a gauge)",
    ),
    scattered(
        "resumable_uploads",
        "find",
        &["expires_at"],
        "the sweeper: the expired uploads",
    ),
    scattered(
        "revoked_keys",
        "delete",
        &["at"],
        "the sweeper: the revoked keys' ids past their hour",
    ),
    scattered(
        "api_tokens",
        "delete",
        &["expires_at"],
        "the sweeper: the expired tokens",
    ),
    scattered(
        "api_keys",
        "find",
        &["_id", "user_id"],
        "a user's key by id (revoking, a token's or a signed link's key alive)",
    ),
    scattered("api_keys", "find", &["user_id"], "a user's keys, listed"),
    scattered(
        "api_keys",
        "update",
        &["_id", "user_id"],
        "a mint's write of the key that mints (by `_id`: routable)",
    ),
    scattered(
        "api_keys",
        "aggregate",
        &["user_id"],
        "a key's mint counts the user's keys",
    ),
    scattered(
        "api_keys",
        "delete",
        &["user_id"],
        "a user's deletion: their keys",
    ),
    scattered(
        "api_tokens",
        "aggregate",
        &["user_id"],
        "a token's mint counts the user's tokens",
    ),
    scattered(
        "api_tokens",
        "delete",
        &["user_id", "expires_at"],
        "a token's mint: the user's expired tokens",
    ),
    scattered(
        "api_tokens",
        "delete",
        &["key_id"],
        "a key's revocation: the tokens it minted",
    ),
    scattered(
        "api_tokens",
        "delete",
        &["user_id"],
        "a user's deletion: their tokens",
    ),
];

fn exemption(sent: &Sent<'_>) -> Option<&'static Scattered> {
    SCATTERED.iter().find(|s| {
        s.collection == sent.collection && s.command == sent.command && sent.has_fields(s.fields)
    })
}

/// Every command the store sent, each with the workload's step at the time
/// (a background task's command carries the step it ran during).
#[derive(Clone, Default)]
struct Log {
    step: Arc<Mutex<String>>,
    sent: Arc<Mutex<Vec<(String, SentCommand)>>>,
}

impl Log {
    fn observer(&self) -> CommandObserver {
        let log = self.clone();
        Arc::new(move |command| {
            let step = log.step.lock().unwrap().clone();
            log.sent.lock().unwrap().push((step, command));
        })
    }

    /// From now on, commands are `step`'s.
    fn mark(&self, step: &str) {
        *self.step.lock().unwrap() = step.to_owned();
    }
}

/// An app on the real stack whose store reports to `log`; no sweep runs
/// but those the workload asks for.
async fn observed_app(log: &Log) -> TestApp {
    let mut settings = test_settings();
    settings.sweep.interval = Duration::ZERO;
    // A user's deletion ends soon after it begins (past the auth cache).
    settings.auth_cache_ttl = Duration::from_secs(1);
    let mut ports = Ports::connect(&settings).await.unwrap();
    let uri = settings.mongodb_uri.as_ref().unwrap().expose_secret();
    let commands = ports.metrics.mongo_commands.clone();
    let store = MongoStore::connect_observed(uri, &settings.mongodb_db, commands, log.observer());
    ports.meta = Arc::new(store.await.unwrap());
    spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await
}

#[tokio::test]
async fn every_request_path_names_the_shard_key_of_what_it_reads_and_writes() {
    if !real_backends() {
        return;
    }
    let log = Log::default();
    let app = observed_app(&log).await;
    // What the start sent (indexes, migrations) is not a request's.
    log.sent.lock().unwrap().clear();
    every_path(&app, &|step| log.mark(step)).await;
    app.stop().await;

    let sent = std::mem::take(&mut *log.sent.lock().unwrap());
    let (mut passing, mut exempt) = (0, 0);
    let mut used = BTreeSet::new();
    let mut offenders = BTreeSet::new();
    for (step, command) in &sent {
        let checked = match filters(step, command) {
            Ok(checked) => checked,
            Err(e) => {
                offenders.insert(e);
                continue;
            }
        };
        for (filter, holds) in checked {
            match (holds, exemption(&filter)) {
                (true, _) => passing += 1,
                (false, Some(s)) => {
                    exempt += 1;
                    used.insert(s.why);
                }
                (false, None) => {
                    offenders.insert(filter.to_string());
                }
            }
        }
    }
    eprintln!(
        "{} commands: {passing} filters and documents name their shard key (or \
         their collection is not sharded), {exempt} exempt; exemptions met: {used:#?}",
        sent.len()
    );
    // The workload ran, and the observer saw it (not a pass by silence).
    assert!(passing >= 300, "only {passing} filters seen");
    assert!(
        offenders.is_empty(),
        "{} filters do not name their collection's shard key (the owner) as one value:\n{}",
        offenders.len(),
        offenders.into_iter().collect::<Vec<_>>().join("\n")
    );
}
