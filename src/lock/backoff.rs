//! The lock-wait schedule of the `backoff` strategy: the loop of the
//! original design (the service filedock was modelled on), kept so that the
//! two strategies can be measured side by side.

use std::time::Duration;

/// The original lock-wait loop: 100 ms, then ×1.5 each time, capped at 2 s
/// (the lock facade adds jitter to each sleep).
#[derive(Clone, Copy, Debug)]
pub struct LockBackoff {
    pub initial: Duration,
    pub factor: f64,
    pub max: Duration,
}

impl Default for LockBackoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            factor: 1.5,
            max: Duration::from_secs(2),
        }
    }
}

impl LockBackoff {
    /// The sleeps between tries, forever; the caller's deadline ends the loop.
    pub fn delays(self) -> impl Iterator<Item = Duration> {
        std::iter::successors(Some(self.initial), move |d| {
            Some(d.mul_f64(self.factor).min(self.max))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_backoff_grows_by_half_and_caps_at_two_seconds() {
        let ms: Vec<_> = LockBackoff::default()
            .delays()
            .take(10)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(&ms[..4], &[100, 150, 225, 337]);
        assert_eq!(*ms.last().unwrap(), 2000);
    }
}
