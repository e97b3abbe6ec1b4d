//! The test Sentinel topology (scripts/stack.sh `stack_sentinel_start`: a
//! primary, its replica and three sentinels): where the primary is, and a
//! failover the sentinels run (`SENTINEL FAILOVER`).

use std::time::{Duration, Instant};

/// The sentinels (comma-separated) and the master's name, if the test
/// script started them (with the real stack).
pub fn sentinels() -> Option<(String, String)> {
    let urls = std::env::var("FILEDOCK_TEST_REDIS_SENTINEL_URL").ok()?;
    let master = std::env::var("FILEDOCK_TEST_REDIS_SENTINEL_MASTER").ok()?;
    crate::helpers::real_backends().then_some((urls, master))
}

async fn connect(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url.trim()).ok()?;
    tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()
}

/// `host:port` of the primary as each sentinel names it.
async fn named(urls: &str, master: &str) -> Vec<Option<String>> {
    let mut named = Vec::new();
    for url in urls.split(',') {
        let addr = match connect(url).await {
            Some(mut conn) => redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
                .ok()
                .flatten()
                .map(|(h, p)| format!("{h}:{p}")),
            None => None,
        };
        named.push(addr);
    }
    named
}

/// The primary, once every sentinel names the same one.
pub async fn primary(urls: &str, master: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let named = named(urls, master).await;
        if let Some(Some(first)) = named.first()
            && named.iter().all(|n| n.as_ref() == Some(first))
        {
            return first.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the sentinels disagree: {named:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `role:` line of `INFO replication` at `addr`, and its link to a
/// primary (`master_link_status`) if it is a replica.
async fn role(addr: &str) -> (String, Option<String>) {
    let Some(mut conn) = connect(&format!("redis://{addr}/")).await else {
        return (String::new(), None);
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    (
        field("role:").unwrap_or_default(),
        field("master_link_status:"),
    )
}

/// Whether every sentinel knows a replica of `master` in good order (up,
/// its link to the primary ok): else `SENTINEL FAILOVER` has none to promote.
async fn replica_known(urls: &str, master: &str) -> bool {
    for url in urls.split(',') {
        let Some(mut conn) = connect(url).await else {
            return false;
        };
        let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(master)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        let good = replicas.iter().any(|r| {
            r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        });
        if !good {
            return false;
        }
    }
    true
}

/// Waits until [`replica_known`], at most `within`.
pub async fn until_replica_known(urls: &str, master: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !replica_known(urls, master).await {
        assert!(
            Instant::now() < deadline,
            "the sentinels know no replica in good order"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks the sentinels to fail the primary over to its replica; returns
/// the new primary once every sentinel names it, it is master and the old
/// one is its replica with its link up (so that a next failover can run).
pub async fn fail_over(urls: &str, master: &str) -> String {
    fail_over_timed(urls, master).await.0
}

/// [`fail_over`], and when the sentinels were first seen naming the new
/// primary (the switch; the old one's resync comes after).
pub async fn fail_over_timed(urls: &str, master: &str) -> (String, Instant) {
    // After an earlier failover the sentinels may not know the demoted
    // primary as a replica yet (they read INFO every few seconds).
    until_replica_known(urls, master, Duration::from_secs(40)).await;
    let old = primary(urls, master).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let first = urls.split(',').next().unwrap();
    let mut conn = connect(first).await.expect("a sentinel answers");
    loop {
        let asked: redis::RedisResult<String> = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(master)
            .query_async(&mut conn)
            .await;
        match asked {
            Ok(_) => break,
            // INPROG, NOGOODSLAVE: once more, shortly.
            Err(e) => assert!(Instant::now() < deadline, "SENTINEL FAILOVER: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut switched = None;
    loop {
        let now = primary(urls, master).await;
        if now != old {
            let switched = *switched.get_or_insert_with(Instant::now);
            let (new_role, _) = role(&now).await;
            let (old_role, link) = role(&old).await;
            if new_role == "master" && old_role == "slave" && link.as_deref() == Some("up") {
                return (now, switched);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the Sentinel failover did not complete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The connections at `addr` subscribed to patterns (`CLIENT LIST TYPE
/// pubsub`, `psub` above 0; `PUBSUB NUMPAT` counts patterns, not clients).
pub async fn pattern_subscribers(addr: &str) -> usize {
    let Some(mut conn) = connect(&format!("redis://{addr}/")).await else {
        return 0;
    };
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    clients
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("psub=") && f != "psub=0")
        })
        .count()
}
