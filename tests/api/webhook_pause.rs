//! A dispatcher paused past its partitions' leases (SIGSTOP: a GC pause,
//! a starved VM) must send nothing when it wakes: meanwhile another
//! instance took the partitions over, gave up on the event the paused one
//! was retrying (a dead letter) and delivered the owner's next. Were the
//! paused one to send its event now, the receiver would get an owner's
//! earlier event after a later one.

use std::time::Duration;

use crate::{
    events::all_events,
    helpers::*,
    support::webhook_receiver::{WebhookReceiver, summary},
    webhooks::{dead_letters, webhook_settings},
};

/// The longest wait for what should come.
const WAIT: Duration = Duration::from_secs(40);
/// The other instance's maximum age: the event is past it by the time
/// that one holds the partition (the paused one's leases last 5 s).
const MAX_AGE: Duration = Duration::from_secs(4);

#[tokio::test]
async fn a_paused_dispatcher_that_lost_its_lease_sends_nothing_when_it_wakes() {
    if !real_backends() {
        return;
    }
    let rx = WebhookReceiver::start().await;
    rx.fail_all();
    let retry_max = Duration::from_millis(200);
    // The one that will be paused: a process of its own, the only
    // dispatcher at first (it holds every partition).
    let plain = test_settings();
    let secret = rx.secret();
    let env = [
        ("FILEDOCK_WEBHOOK_URL", rx.url()),
        ("FILEDOCK_WEBHOOK_SECRET", secret),
        // Its own maximum age is long: it never gives up on the event
        // itself, so whatever it sends after waking is that event again.
        ("FILEDOCK_WEBHOOK_MAX_AGE_SECS", "3600".to_owned()),
        ("FILEDOCK_WEBHOOK_RETRY_MAX_SECS", "0.2".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let paused = spawn_binary(&plain, &env).await;
    let pid = paused.child.id() as i32;
    // Changes are made through an instance with no webhooks.
    let app = spawn_app_with(plain.clone()).await;
    let ann = app.create_user("ann").await;
    app.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    app.upload_json(&ann, "b.txt", b"b".to_vec()).await;
    let events = all_events(&app, &ann, 100).await;
    assert!(events.len() >= 2, "{events:?}");
    let first = events[0]["id"].as_str().unwrap().to_owned();
    let second = events[1]["id"].as_str().unwrap().to_owned();

    // The paused-to-be instance retries ann's first event (refused).
    let deadline = tokio::time::Instant::now() + WAIT;
    while rx
        .refused()
        .iter()
        .filter(|d| d.webhook_id == first)
        .count()
        < 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{first} was not tried twice: {}",
            summary(&rx.requests())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // It holds ann's two events (reported once a second).
    pending_reaches(&paused.base, |n| n >= 2.0, deadline).await;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let woken = scopeguard_cont(pid);

    // Another instance takes the partitions over once the leases lapse,
    // gives up on the first event (past its maximum age) and delivers the
    // second.
    rx.fail_ids([first.clone()]);
    let mut settings = plain.clone();
    let mut hooks = webhook_settings(&rx, retry_max);
    hooks.max_age = MAX_AGE;
    settings.webhooks = Some(hooks);
    let other = spawn_app_with(settings).await;
    let delivered = loop {
        if let Some(d) = rx.accepted().into_iter().find(|d| d.webhook_id == second) {
            break d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{second} was not delivered: {}",
            summary(&rx.requests())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let letters = dead_letters(&other, "").await;
    assert!(
        letters["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["event"]["id"] == first.as_str()),
        "{first} is not a dead letter: {letters}"
    );

    // The paused one wakes: its dispatcher runs (it finds its leases gone
    // and holds none of ann's events any more), with time to send after,
    // were it to.
    drop(woken);
    let deadline = tokio::time::Instant::now() + WAIT;
    pending_reaches(&paused.base, |n| n == 0.0, deadline).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let requests = rx.requests();
    let late: Vec<_> = requests
        .iter()
        .filter(|d| d.n > delivered.n && d.webhook_id == first)
        .collect();
    assert!(
        late.is_empty(),
        "{first} was sent after {second} was delivered: {}",
        summary(&requests)
    );
    // Nothing of ann's is sent again, by either instance.
    assert_eq!(
        requests.iter().filter(|d| d.webhook_id == second).count(),
        1,
        "{}",
        summary(&requests)
    );
    other.stop().await;
    app.stop().await;
}

/// Waits until the instance at `base` reports webhook events pending that
/// `ok` accepts (`filedock_webhook_pending`), until `deadline`.
async fn pending_reaches(base: &str, ok: impl Fn(f64) -> bool, deadline: tokio::time::Instant) {
    loop {
        let n = metric_at(base, "filedock_webhook_pending", "").await;
        if ok(n) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{base} still reports {n} events pending"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `pid` SIGCONT when dropped (the test's end, or its panic).
fn scopeguard_cont(pid: i32) -> impl Drop {
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    Cont(pid)
}
