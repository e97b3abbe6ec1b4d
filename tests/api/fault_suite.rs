//! The fault suite: two filedock processes behind fault proxies to MongoDB,
//! Redis and S3; a workload of several users' uploads (across the S3 part
//! size and the size categories, some resent with their `Idempotency-Key`
//! after an unknown outcome, some resumable: tus in several PATCHes, cut,
//! raced and empty ones among them, some with a deferred length), renames,
//! deletes, attaches, detaches, MCP and toolset connects and disconnects, and
//! now and then a session's or an agent's delete (and a replacement made;
//! attaches and links now and then name a deleted one and must find it gone),
//! keys minted and revoked, tokens minted, uploads sent with them (revoked
//! ones among them), keys and tokens minted with keys after or while they
//! are revoked (on the instance that still trusts them too), one user's
//! quota changed, and a user deleted mid-run (`support/account_workload.rs`,
//! checked by `support/accounts.rs` and `support/mints.rs`: nothing a
//! revoked key mints is stored or works, every credential answered 201
//! works until its key is revoked), signed links made with minted keys
//! and tokens, revoked ones among them, whose keys are now and then revoked
//! right after (`support/signed_links.rs`: a link of a revoked key is
//! refused at every instance at the end, one of a listed key gives its
//! file's bytes; no link of the deleted user's downloads);
//! a nemesis that deals a shuffled deck of every fault kind of the mode (link
//! cuts, also right after a commit or an enqueue was answered and past the
//! settle window, a pause past the leases and the grace, SIGKILL and restart,
//! Redis restarted and flushed; in the run on a Redis Cluster, a master
//! killed and a `CLUSTER FAILOVER` instead; in the run with the queue on
//! RabbitMQ, its link cut, also right after a publish, the broker killed
//! and made to close its connections), while `reconcile --delete` and
//! `sweep` run in a loop. After healing, the resumable uploads' expiry and a final sweep,
//! the checker holds everything read back against the history
//! (`support/checker.rs`; a container deleted with a 204 is gone and no file
//! names it, one whose delete's outcome is unknown either gone or as the
//! model says: `support/lives.rs`), finds nothing of a resumable upload left
//! (state, tail object, multipart upload on the S3 server's disk, intent),
//! and every user's reservations (`reserved_bytes`, `open_uploads`) given
//! back; and each user's events (`GET /v1/events`) one per committed
//! upload, rename and delete, numbered 1, 2, 3… with no gap
//! (`support/event_checks.rs`); and the admin's feed of every user's
//! events holding each of those once, each owner's in order
//! (`support/feed_checks.rs`); and every event of that feed delivered by
//! webhook to the suite's receiver, which the nemesis takes down, makes
//! fail and slows (`receiver-*` faults; the pause outlasts the webhooks'
//! partition leases): each at least once, each owner's first deliveries
//! in order, duplicates identical, every signature verified.
//!
//! `FILEDOCK_FAULT_SEED` replays a run; `FILEDOCK_FAULT_SECS` deals more
//! decks until that many seconds have passed (a soak); by default one deck.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use filedock::{
    config::QueueBroker,
    domain::{sweeper::Outcome, users},
    http::AppState,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{
    helpers::*,
    support::{
        account_readback::{leftovers, probe, read_account},
        accounts::{accounts_summary, check_account, check_deleted},
        checker::check,
        cluster::{AUTH_CACHE, Cluster, GRACE, TUS_EXPIRY},
        fault_deck::{Fault, Topology, dead_letters_in},
        feed_checks::{
            FeedRead, check_feed, check_followed, feed_summary, follow_feed, read_feed_settled,
        },
        history::{Answer, Event, Holder, Op},
        lives::deletes_summary,
        mints::{check_deleted_creds, mints_summary},
        nemesis::nemesis,
        precommit_hook::{PrecommitHookServer, REFUSED_PREFIX},
        readback::{self, read_final},
        signed_links::{LinkTally, check_deleted_links, check_links, links_summary, probe_links},
        verdict::Verdict,
        webhook_receiver::check_order,
        workload::{UserWorld, World},
    },
};

const CLIENTS: usize = 12;
/// The user deleted mid-run (after the live ones, `0..USERS`), between
/// these many seconds after the start.
const DOOMED: usize = USERS;
const DELETE_AFTER: std::ops::Range<u64> = 3..12;
/// Clients that write only for the first user.
const HOT_CLIENTS: usize = 6;
const USERS: usize = 3;
/// Each user's sessions and agents.
const CONTAINERS: usize = 2;
/// The workload goes on this long after the last fault.
const TAIL: Duration = Duration::from_secs(1);
/// How long the final sweeps may take to see everything settled: a
/// transaction a killed process left open holds its intent until MongoDB
/// reaps it (60 s); a committed upload's state stays until its expiry
/// (TUS_EXPIRY after its commit).
const SETTLE_LIMIT: Duration = Duration::from_secs(90);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What ran beside the faults: reconciles, sweeper passes that swept (not
/// those another instance's lock turned away), and the strays reconcile
/// deleted (an object with neither record, intent nor pending orphan, past
/// the grace: half-done, which `--delete` would otherwise hide from the
/// read-back) or only reported (younger than the grace: half-done if it is
/// still there at the end, as nothing but reconcile deletes such an object).
struct Upkeep {
    reconciles: usize,
    sweeps: usize,
    deleted: Vec<String>,
    young: Vec<String>,
}

/// `reconcile --delete` and one sweeper pass, in turns, until `stop`.
async fn maintenance(state: AppState, stop: tokio_util::sync::CancellationToken) -> Upkeep {
    let sweeper = state.sweeper.clone();
    let mut up = Upkeep {
        reconciles: 0,
        sweeps: 0,
        deleted: Vec::new(),
        young: Vec::new(),
    };
    while !stop.is_cancelled() {
        if let Ok(report) = state.reconciler.reconcile(true).await {
            up.reconciles += 1;
            let deleted = &report.deleted_keys;
            up.young.extend(
                report
                    .strays
                    .iter()
                    .filter(|k| !deleted.contains(k))
                    .cloned(),
            );
            up.deleted.extend(report.deleted_keys);
        }
        if let Ok(Outcome::Swept(_)) = sweeper.try_run_once().await {
            up.sweeps += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    up
}

/// A user, made through the API (its sessions and agents: `World::create_container`).
async fn new_user(cluster: &Cluster, i: usize) -> UserWorld {
    let base = &cluster.instances[0].base;
    let key = create_user_at(base, ADMIN_KEY, &format!("jepsen{i}")).await;
    let id = cluster
        .state
        .ports
        .meta
        .key_by_hash(&users::hash_key(&key))
        .await
        .unwrap()
        .unwrap()
        .1
        .id;
    UserWorld::new(id.to_string(), key)
}

/// The final sweeps: after the grace and the resumable uploads' expiry,
/// passes until one ran and nothing is left to wait for
/// ([`readback::settled`]: no intent, no deletion pending, no resumable
/// state, each swept at its expiry), or the limit.
async fn final_sweeps(state: &AppState) {
    tokio::time::sleep(GRACE.max(TUS_EXPIRY) + Duration::from_secs(1)).await;
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let swept = state.sweeper.try_run_once().await;
        let ran = matches!(swept, Ok(Outcome::Swept(_)));
        if ran && readback::settled(state).await {
            return;
        }
        if Instant::now() > deadline {
            eprintln!("final sweeps: not settled after {SETTLE_LIMIT:?}; checking what is left");
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One run of the suite: `coordination` (lock or queue) on one Redis node
/// behind a proxy, or (lock mode) on a Redis that the nemesis fails over:
/// `topology`, or if `None`, `FILEDOCK_FAULT_REDIS` (`cluster` or
/// `sentinel`; unset, the seed picks one); in queue mode, the queue on
/// that Redis or on RabbitMQ (`broker`).
async fn run_suite(coordination: &str, topology: Option<Topology>, broker: QueueBroker) {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let seed: u64 = env_or("FILEDOCK_FAULT_SEED", rand::random());
    if std::env::var_os("FILEDOCK_FAULT_LOG").is_some() {
        // The suite's own log (its maintenance and final sweeps) on stderr,
        // filtered by RUST_LOG.
        filedock::telemetry::init(false);
    }
    let topology = match (topology, std::env::var("FILEDOCK_FAULT_REDIS").as_deref()) {
        (Some(t), _) => t,
        (None, Ok("cluster")) => Topology::Cluster,
        (None, Ok("sentinel")) => Topology::Sentinel,
        // One of the two by the seed: each test run takes one (CI's time).
        (None, _) if seed.is_multiple_of(2) => Topology::Cluster,
        (None, _) => Topology::Sentinel,
    };
    let mode = match (topology, broker) {
        (Topology::Node, QueueBroker::Rabbitmq) => format!("{coordination}-on-rabbitmq"),
        (Topology::Node, QueueBroker::Redis) => coordination.to_owned(),
        (Topology::Cluster, _) => format!("{coordination}-on-redis-cluster"),
        (Topology::Sentinel, _) => format!("{coordination}-with-redis-sentinel"),
    };
    let secs: u64 = env_or("FILEDOCK_FAULT_SECS", 0);
    eprintln!("fault suite ({mode}): seed {seed}; replay with FILEDOCK_FAULT_SEED={seed}");
    let started = Instant::now();
    let mut cluster = Cluster::start(coordination, topology, broker).await;
    let mut users = Vec::new();
    for i in 0..=DOOMED {
        users.push(new_user(&cluster, i).await);
    }
    let bases = cluster.instances.iter().map(|s| s.base.clone()).collect();
    let world = Arc::new(World::new(bases, users));
    // Each user's first sessions and agents, in the history as creates.
    let base0 = cluster.instances[0].base.clone();
    for u in 0..=DOOMED {
        for _ in 0..CONTAINERS {
            for kind in [Holder::Session, Holder::Agent] {
                world.create_container(u, kind, &base0).await;
            }
        }
    }

    let running = Arc::new(AtomicBool::new(true));
    let follower = follow_feed(world.bases.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let upkeep = tokio::spawn(maintenance(cluster.state.clone(), stop.clone()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (w, running) = (world.clone(), running.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (i as u64 + 1));
                // Half the clients write for one user: a hot key, where
                // writes within milliseconds meet (and group commits form).
                let user = (i < HOT_CLIENTS).then_some(0);
                while running.load(Ordering::SeqCst) {
                    w.one_op(&mut rng, user).await;
                }
            })
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let doom = {
        // Its own draw: the nemesis's deck stays what the seed deals.
        let after = StdRng::seed_from_u64(!seed).random_range(DELETE_AFTER);
        let w = world.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(after)).await;
            w.delete_user(DOOMED).await;
        })
    };
    let until = Instant::now() + Duration::from_secs(secs);
    let faults = nemesis(&mut cluster, &mut rng, until).await;
    for proxy in cluster.proxies() {
        proxy.heal();
    }
    tokio::time::sleep(TAIL).await;
    running.store(false, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    doom.await.unwrap();
    stop.cancel();
    let Upkeep {
        reconciles,
        sweeps,
        deleted,
        young,
    } = upkeep.await.unwrap();

    cluster.all_up().await;
    final_sweeps(&cluster.state).await;
    let history = world.history.lock().unwrap().clone();
    let fin = read_final(&cluster.state, &base0, &world.users[..USERS], &history).await;
    let mut v = check(&history, &fin);
    let mine = |u: usize| -> Vec<&Event> { history.iter().filter(|e| e.op.user() == u).collect() };
    let mut links = LinkTally::default();
    for (u, user) in world.users[..USERS].iter().enumerate() {
        let account = read_account(&world.bases, user).await;
        check_account(&mine(u), u, &account, AUTH_CACHE, &mut v);
        let probed = probe_links(&world.bases, &mine(u)).await;
        check_links(
            &mine(u),
            u,
            &account,
            &fin.users[u],
            &probed,
            &mut links,
            &mut v,
        );
    }
    let left = leftovers(&cluster.state, &world.users[DOOMED].id).await;
    check_deleted(&mine(DOOMED), DOOMED, &left, AUTH_CACHE, &mut v);
    let probed = probe(&world.bases, &world.users[DOOMED]).await;
    check_deleted_creds(DOOMED, &probed, &mut v);
    let probed = probe_links(&world.bases, &mine(DOOMED)).await;
    check_deleted_links(DOOMED, &probed, &mut v);
    let feed = read_feed_settled(&world.bases, &fin.users).await;
    let doomed = &world.users[DOOMED].id;
    check_feed(&feed, &fin.users, doomed, &mine(DOOMED), &mut v);
    let followed = follower.finish().await;
    check_followed(&followed, &feed, doomed, &mut v);
    let dead_letters = (
        dead_letters_in(coordination, topology),
        faults.fired_of(Fault::ReceiverFailingLong) > 0,
    );
    let webhooks = check_webhooks(&cluster, &feed, doomed, dead_letters, &mut v).await;
    let hook = check_hook(&cluster.hook, &history, &mut v);
    let [panics, grouped, queue_grouped] = cluster.counted().await.try_into().unwrap();
    // A young stray seen beside and gone by the end was a clean-up in flight.
    let mut strays = deleted;
    for key in young {
        let gone = match filedock::vocab::BlobKey::parse(&key) {
            Some(k) => cluster.state.ports.blobs.head(&k).await.unwrap().is_none(),
            None => false,
        };
        if !gone && !strays.contains(&key) {
            strays.push(key);
        }
    }
    if !strays.is_empty() {
        v.open_defects += strays.len();
        // What the history says of each (a plain upload that failed has no id there).
        let said: Vec<String> = strays
            .iter()
            .map(|key| {
                let id = key.rsplit('/').next().unwrap_or_default();
                let ops: Vec<String> = history
                    .iter()
                    .filter(|e| {
                        e.file_id.as_deref() == Some(id) || format!("{:?}", e.op).contains(id)
                    })
                    .map(|e| format!("{:?} -> {:?}", e.op, e.answer))
                    .collect();
                format!("{key}: {ops:?}")
            })
            .collect();
        v.notes.push(format!(
            "objects with neither record nor intent (reconcile): {said:?}"
        ));
    }
    let panics = panics as usize;
    if panics > 0 {
        v.internal_errors += panics;
        v.notes
            .push(format!("{panics} handler panics counted in /metrics"));
    }
    let took = started.elapsed().as_secs();
    let events: usize = fin.users.iter().map(|u| u.events.len()).sum();
    eprintln!(
        "fault suite ({mode}) seed {seed}, {took} s: {} faults fired: {faults}; {} requests, {} acknowledged, {} failed, {} unknown; lost {}, half-done {}, reordered {}, failed-but-applied {}, duplicated {}, internal errors {}, bad events {} of {events} read, bad webhooks {}, bad hook {}; open defects {} (not failing); {reconciles} reconciles and {sweeps} sweeps beside; {grouped} uploads and {queue_grouped} queued operations committed in groups; per kind (sent, acknowledged): {:?}; not 2xx: {:?}",
        faults.fired(),
        v.requests,
        v.acknowledged,
        v.failed,
        v.unknown,
        v.lost,
        v.half_done,
        v.reordered,
        v.failed_but_applied,
        v.duplicated,
        v.internal_errors,
        v.bad_events,
        v.bad_webhooks,
        v.bad_hook,
        v.open_defects,
        v.kinds,
        v.codes,
    );
    // One line to add up runs with (README "Guarantees").
    let fired: Vec<String> = faults
        .0
        .iter()
        .map(|(kind, (_, fired))| format!("{kind}={fired}"))
        .collect();
    let (tus, tus_acked) = v.kinds.get("tus").copied().unwrap_or_default();
    let multipart = fin.multipart.map_or("not listed".into(), |n| n.to_string());
    eprintln!(
        "FAULT-SUITE mode={mode} seed={seed} secs={took} requests={} acknowledged={} lost={} half_done={} reordered={} failed_but_applied={} duplicated={} internal={} bad_events={} events={events} open_defects={} unknown={} grouped={grouped} queue_grouped={queue_grouped} tus={tus} tus_acknowledged={tus_acked} tus_left=states:{},staging:{},multipart:{multipart} {} {} {} {} {} {} {} fired={}",
        v.requests,
        v.acknowledged,
        v.lost,
        v.half_done,
        v.reordered,
        v.failed_but_applied,
        v.duplicated,
        v.internal_errors,
        v.bad_events,
        v.open_defects,
        v.unknown,
        fin.resumables,
        fin.staging,
        deletes_summary(&history),
        accounts_summary(&v.kinds, left.len()),
        mints_summary(&history),
        links_summary(&history, links),
        feed_summary(&feed, &followed),
        webhooks,
        hook,
        fired.join(","),
    );
    if v.violations() + v.open_defects > 0 {
        for n in v.notes.iter().take(40) {
            eprintln!("  {n}");
        }
        eprintln!("instance logs in {}", cluster.dir.display());
    }
    assert_eq!(
        v.violations(),
        0,
        "seed {seed}: the guarantees did not hold"
    );
    let silent = faults.silent(&cluster.deck());
    assert!(
        silent.is_empty(),
        "seed {seed}: these faults never fired: {silent:?}"
    );
    assert!(
        reconciles > 0 && sweeps > 0,
        "maintenance never ran beside the faults: {reconciles} reconciles, {sweeps} sweeps"
    );
    assert!(
        v.acknowledged > 0,
        "the run did too little to prove anything"
    );
    // Without events read the events checks hold against nothing.
    assert!(
        fin.users.iter().any(|u| !u.events.is_empty()),
        "seed {seed}: no user's events were read"
    );
}

/// The pre-commit hook (`support/precommit_hook.rs`): no upload it
/// refuses is acknowledged (its 422 is a failure, and the checker holds
/// that nothing of it is left), every call verified, and it was asked
/// both ways.
fn check_hook(hook: &PrecommitHookServer, history: &[Event], v: &mut Verdict) -> String {
    for e in history {
        if let Op::Upload { name, .. } = &e.op
            && name.starts_with(REFUSED_PREFIX)
            && matches!(e.answer, Answer::Ok)
        {
            v.note(
                |v| &mut v.bad_hook,
                format!("upload {name}, which the pre-commit hook refuses, was acknowledged"),
            );
        }
    }
    let (accepted, refused, unverified) = hook.counts();
    if unverified > 0 {
        v.note(
            |v| &mut v.bad_hook,
            format!("{unverified} pre-commit hook calls did not verify"),
        );
    }
    if accepted == 0 || refused == 0 {
        v.note(
            |v| &mut v.bad_hook,
            format!("the pre-commit hook was not asked both ways: {accepted} accepted, {refused} refused"),
        );
    }
    format!("hook=accepted:{accepted},refused:{refused}")
}

/// How long the receiver may take to have every event of the feed after
/// the run (deliveries retried after the last faults, leases of instances
/// killed at the end moving over).
const WEBHOOKS_SETTLE: Duration = Duration::from_secs(60);

/// Every event of the feed delivered to the suite's receiver at least
/// once or given up on (a dead letter, where the mode makes them), each
/// owner's first deliveries in sequence order with no gap but the dead
/// letters, duplicates with the same id and body, every signature verified
/// by a Standard Webhooks verifier (`webhook_receiver::check_order`), and
/// every dead letter an event of the feed; counted in `bad_webhooks`. A
/// deleted user's events that left the feed with their data before their
/// delivery are not delivered (the feed is what is expected), nor are
/// their letters kept but that of `user.deleted`; what was delivered of
/// them is still checked for order. `dead_letters` says whether this mode makes
/// letters: then the receiver's long failure, once fired, must have made
/// some.
async fn check_webhooks(
    cluster: &Cluster,
    feed: &FeedRead,
    doomed: &str,
    (dead_letters, long_failure_fired): (bool, bool),
    v: &mut Verdict,
) -> String {
    let receiver = &cluster.receiver;
    let mut expected: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    for e in &feed.events {
        expected
            .entry(e.owner.clone())
            .or_default()
            .push((e.seq, format!("{}:{}", e.owner, e.seq)));
    }
    for events in expected.values_mut() {
        events.sort();
    }
    // Until every event is accepted or a dead letter: a delivery may still
    // be retried, or given up on, after the last fault.
    let base = &cluster.instances[0].base;
    let deadline = Instant::now() + WEBHOOKS_SETTLE;
    let (waited, dead) = loop {
        let dead = match read_dead_letters(base).await {
            Ok(dead) => dead,
            Err(e) => {
                v.note(|v| &mut v.bad_webhooks, format!("dead letters: {e}"));
                HashMap::new()
            }
        };
        let mut undead = expected.clone();
        for events in undead.values_mut() {
            events.retain(|(_, id)| !dead.contains_key(id));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let waited = receiver
            .wait_accepted(&undead, left.min(Duration::from_secs(2)))
            .await;
        if waited.is_ok() || left.is_zero() {
            break (waited.map(|()| undead), dead);
        }
    };
    let accepted = receiver.accepted();
    if let Err(e) = waited.and_then(|undead| check_order(&accepted, &undead)) {
        v.note(|v| &mut v.bad_webhooks, format!("webhooks: {e}"));
    }
    let in_feed: HashSet<&str> = expected
        .values()
        .flatten()
        .map(|(_, id)| id.as_str())
        .collect();
    let doomed_s = format!("{doomed}:");
    let strays: Vec<(&String, &String)> = dead
        .iter()
        .filter(|(id, kind)| match id.starts_with(&doomed_s) {
            true => kind.as_str() != "user.deleted",
            false => !in_feed.contains(id.as_str()),
        })
        .collect();
    if !strays.is_empty() {
        let m = format!(
            "dead letters of events not in the feed, or of the deleted user's but user.deleted: {strays:?}"
        );
        v.note(|v| &mut v.bad_webhooks, m);
    }
    if !dead_letters && !dead.is_empty() {
        let m = format!(
            "{} dead letters in a mode that keeps events for a day",
            dead.len()
        );
        v.note(|v| &mut v.bad_webhooks, m);
    }
    if dead_letters && long_failure_fired && dead.is_empty() {
        let m = "the receiver's long failure fired and left no dead letter".to_owned();
        v.note(|v| &mut v.bad_webhooks, m);
    }
    let refused = receiver.refused().len();
    let ids: HashSet<&str> = accepted.iter().map(|d| d.webhook_id.as_str()).collect();
    format!(
        "webhooks=accepted:{},distinct:{},refused:{refused},dead:{}",
        accepted.len(),
        ids.len(),
        dead.len()
    )
}

/// Every dead letter's event, as `owner_id:seq` → its type (`GET
/// /v1/admin/events/dead`, page by page).
async fn read_dead_letters(base: &str) -> Result<HashMap<String, String>, String> {
    let client = reqwest::Client::new();
    let mut ids = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/admin/events/dead?limit=500");
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let response = client
            .get(&url)
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let page: serde_json::Value = response.json().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {page}"));
        }
        for letter in page["dead_letters"].as_array().into_iter().flatten() {
            let event = &letter["event"];
            let owner = event["owner_id"].as_str().unwrap_or("?");
            let id = format!("{owner}:{}", event["seq"]);
            ids.insert(id, event["type"].as_str().unwrap_or("?").to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return Ok(ids),
        }
    }
}

#[tokio::test]
async fn lock_mode_keeps_every_acknowledged_write_under_faults() {
    run_suite("lock", Some(Topology::Node), QueueBroker::Redis).await;
}

#[tokio::test]
async fn queue_mode_keeps_every_acknowledged_write_under_faults() {
    run_suite("queue", Some(Topology::Node), QueueBroker::Redis).await;
}

/// Queue mode with the queue on a private RabbitMQ behind its own fault
/// proxy (the buckets' leases and the direct path still on the one Redis
/// node behind its proxy): the AMQP link cut, also right after a
/// `basic.publish`, the broker SIGKILLed and started again, and every
/// client connection closed by the broker (consumers' mid-delivery), beside
/// the Redis faults of a node (but the cut after an `XADD`) and the rest.
#[tokio::test]
async fn queue_mode_on_rabbitmq_keeps_every_acknowledged_write_under_faults() {
    run_suite("queue", Some(Topology::Node), QueueBroker::Rabbitmq).await;
}

/// Lock mode on a Redis that fails over (`FILEDOCK_FAULT_REDIS`): a Redis
/// Cluster (`cluster`), whose masters the nemesis kills (their replicas
/// promoted, writes not yet replicated lost) and fails over; or a
/// Sentinel-watched primary (`sentinel`) the sentinels fail over and the
/// nemesis kills. Unset, the seed picks one.
#[tokio::test]
async fn lock_mode_keeps_every_acknowledged_write_under_redis_failovers() {
    run_suite("lock", None, QueueBroker::Redis).await;
}

/// Queue mode on a Redis that fails over (`FILEDOCK_FAULT_REDIS`, or the
/// seed's pick), as above: the buckets' streams, leases, results and
/// result notices live on the masters (or the primary) the nemesis kills
/// and fails over.
#[tokio::test]
async fn queue_mode_keeps_every_acknowledged_write_under_redis_failovers() {
    run_suite("queue", None, QueueBroker::Redis).await;
}
