//! The queue's figures over the last minute, for `GET /v1/admin/queue`.

use std::{
    collections::VecDeque,
    sync::Mutex,
    time::{Duration, Instant},
};

/// How far back the figures look.
const WINDOW: Duration = Duration::from_secs(60);
/// The most operations remembered, however busy the minute.
const MAX_REMEMBERED: usize = 100_000;

/// One applied (or failed) operation, for the last-minute figures.
struct Done {
    at: Instant,
    wait_ms: f64,
    ok: bool,
}

/// What this instance applied over the last minute.
#[derive(Default)]
pub(super) struct Recent {
    done: Mutex<VecDeque<Done>>,
}

impl Recent {
    /// Records operations just answered: each one's wait and whether it applied.
    pub(super) fn record(&self, answered: impl IntoIterator<Item = (f64, bool)>) {
        let mut recent = self.done.lock().unwrap();
        for (wait_ms, ok) in answered {
            recent.push_back(Done {
                at: Instant::now(),
                wait_ms,
                ok,
            });
        }
        while recent.front().is_some_and(|d| d.at.elapsed() > WINDOW)
            || recent.len() > MAX_REMEMBERED
        {
            recent.pop_front();
        }
    }

    /// Applied per second, mean wait (ms), failure share.
    pub(super) fn figures(&self) -> (f64, f64, f64) {
        let recent = self.done.lock().unwrap();
        let window = recent.front().map_or(1.0, |d| {
            d.at.elapsed()
                .as_secs_f64()
                .clamp(1.0, WINDOW.as_secs_f64())
        });
        let n = recent.len() as f64;
        if n == 0.0 {
            return (0.0, 0.0, 0.0);
        }
        (
            n / window,
            recent.iter().map(|d| d.wait_ms).sum::<f64>() / n,
            recent.iter().filter(|d| !d.ok).count() as f64 / n,
        )
    }
}
