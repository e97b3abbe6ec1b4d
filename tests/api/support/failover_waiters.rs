//! Locks across a failover, for the cluster and Sentinel tests: 16 waiters
//! on one lock key, half on each of two lock managers (two instances'
//! links), each holding it for a while (what each was granted and when);
//! and a holder asked to let go after the failover.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use filedock::lock::{LockManager, redis::RedisLocks};

pub const WAITERS: usize = 16;

/// How the waiters were served.
pub struct Served {
    /// Each grant's fence and time, in the order they were granted.
    pub granted: Vec<(u64, Instant)>,
    /// Grants made while another waiter still held the lock.
    pub overlaps: usize,
    /// Calls refused (503: an outage or a topology answer), then tried again.
    pub refused: usize,
    began: Instant,
    switched: Instant,
}

impl Served {
    /// (granted before the failover began, granted after it switched).
    pub fn before_and_after(&self) -> (usize, usize) {
        let before = self.granted.iter().filter(|(_, at)| *at < self.began);
        let after = self.granted.iter().filter(|(_, at)| *at > self.switched);
        (before.count(), after.count())
    }

    pub fn fences(&self) -> Vec<u64> {
        self.granted.iter().map(|(f, _)| *f).collect()
    }

    /// Every waiter held the lock, some before the failover and some after
    /// it, with each fence above the one granted before.
    pub fn assert_served_in_turn(&self, failover: &str) {
        let (before, after) = self.before_and_after();
        eprintln!(
            "{WAITERS} waiters across {failover}: {before} granted before it, {after} after \
             the switch, {} calls refused meanwhile, {} overlapping holds",
            self.refused, self.overlaps
        );
        assert_eq!(self.granted.len(), WAITERS, "every waiter held the lock");
        assert!(
            before > 0 && after > 0,
            "the failover did not come between grants"
        );
        let fences = self.fences();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences not increasing: {fences:?}"
        );
    }
}

/// Starts the waiters on `key` (each holds it for `hold`), runs `failover`
/// (which answers when the switch happened) 100 ms later, and waits for
/// every waiter.
pub async fn serve_across<F, Fut>(
    managers: [Arc<dyn LockManager>; 2],
    key: &'static str,
    hold: Duration,
    failover: F,
) -> Served
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Instant>,
{
    let holders = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(Mutex::new(Vec::new()));
    let (overlaps, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let manager = managers[i % 2].clone();
            let (holders, granted) = (holders.clone(), granted.clone());
            let (overlaps, refused) = (overlaps.clone(), refused.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                let lease = loop {
                    match manager
                        .acquire_fair(key, Duration::from_secs(5), deadline)
                        .await
                    {
                        Ok(lease) => break lease,
                        Err(e) if Instant::now() < deadline => {
                            refused.fetch_add(1, Ordering::SeqCst);
                            eprintln!("waiter {i}: {e}; again");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("waiter {i} never got the lock: {e}"),
                    }
                };
                if holders.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                granted.lock().unwrap().push((lease.fence, Instant::now()));
                tokio::time::sleep(hold).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                manager.release(&lease).await.ok();
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    let switched = failover().await;
    for w in waiters {
        w.await.unwrap();
    }
    let granted = granted.lock().unwrap().clone();
    Served {
        granted,
        overlaps: overlaps.load(Ordering::SeqCst),
        refused: refused.load(Ordering::SeqCst),
        began,
        switched,
    }
}

/// `holder` takes `key` and listens for release requests; `failover` runs;
/// then `asker` asks the holder to let go again and again (as a waiting
/// request does). Whether the holder heard it within 15 s.
pub async fn release_heard_across<F, Fut>(
    holder: &RedisLocks,
    asker: &RedisLocks,
    key: &str,
    failover: F,
) -> bool
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let lease = holder
        .try_acquire(key, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free lock");
    let listener = holder.listen_for_release(key).await;
    let mut asked = listener.requests();
    failover().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while asked.borrow().is_none() && Instant::now() < deadline {
        let _ = asker.request_release(key).await;
        let _ = tokio::time::timeout(Duration::from_millis(250), asked.changed()).await;
    }
    holder.release(&lease).await.ok();
    asked.borrow().is_some()
}
