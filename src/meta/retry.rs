//! The transaction retry on `WriteConflict` (quadratic backoff: 0, 50,
//! 200 ms), run and counted by [`Transactions`]: the one retry path that
//! serves every adapter.

use std::{future::Future, sync::Arc};

use super::error::{MetaError, MetaResult};
pub use crate::config::TxnRetryPolicy;
use crate::metrics::Metrics;

/// Runs transactions the one way every writer does: retried under the
/// policy, and counted in the metrics under the name of the write.
#[derive(Clone)]
pub struct Transactions {
    policy: TxnRetryPolicy,
    metrics: Arc<Metrics>,
}

impl Transactions {
    pub fn new(policy: TxnRetryPolicy, metrics: Arc<Metrics>) -> Self {
        Self { policy, metrics }
    }

    /// Runs `txn` under the policy and records its retries under `op`; a
    /// transaction that ran out of attempts on write conflicts counts as
    /// retried the most times.
    pub async fn run<T, F, Fut>(&self, op: &str, txn: F) -> MetaResult<Retried<T>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = MetaResult<T>>,
    {
        let result = with_txn_retry(&self.policy, txn).await;
        match &result {
            Ok(r) => self.metrics.observe_txn(op, r.retries),
            Err(e) if e.is_write_conflict() => {
                self.metrics.observe_txn(op, self.policy.max_attempts - 1)
            }
            Err(_) => {}
        }
        result
    }
}

/// A value and how many times its transaction was retried to get it.
#[derive(Debug)]
pub struct Retried<T> {
    pub value: T,
    pub retries: u32,
}

/// Runs `attempt` until it succeeds, fails with an error that a new
/// attempt cannot cure, or the policy's attempts are used up.
pub async fn with_txn_retry<T, F, Fut>(
    policy: &TxnRetryPolicy,
    mut attempt: F,
) -> Result<Retried<T>, MetaError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, MetaError>>,
{
    let mut n = 0;
    loop {
        match attempt().await {
            Ok(value) => return Ok(Retried { value, retries: n }),
            Err(e) if e.is_retryable() && n + 1 < policy.max_attempts => {
                n += 1;
                tracing::debug!(attempt = n, error = %e, "retrying transaction");
                tokio::time::sleep(policy.delay(n)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn transaction_backoff_is_quadratic() {
        let p = TxnRetryPolicy::default();
        let ms: Vec<_> = (0..3).map(|a| p.delay(a).as_millis()).collect();
        assert_eq!(ms, [0, 50, 200]);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts_and_passes_other_errors_through() {
        let calls = AtomicU32::new(0);
        let r: Result<Retried<()>, _> = with_txn_retry(&TxnRetryPolicy::default(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(MetaError::WriteConflict)
        })
        .await;
        assert!(matches!(r, Err(MetaError::WriteConflict)));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        calls.store(0, Ordering::SeqCst);
        let r: Result<Retried<()>, _> = with_txn_retry(&TxnRetryPolicy::default(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(MetaError::QuotaExceeded)
        })
        .await;
        assert!(matches!(r, Err(MetaError::QuotaExceeded)));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "only write conflicts are retried"
        );
    }
}
