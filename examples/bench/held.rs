//! Scenario 11 (issue 22): cost vs files held. One user grows to 1k, 10k, 50k
//! and 100k files of 4 KiB (over HTTP, 32 in flight); at each step the burst
//! that got there, one upload alone, `GET /v1/me` and the list's first page
//! are timed, on the embedded defaults and on the real stack, and each figure
//! is set against its value at 1k files. The machine's load drifts over a
//! run this long, so at the end a fresh server's user at 1k files and the
//! grown user are measured again side by side, alternating.

mod user;

use std::time::{Duration, Instant};

use self::user::{Burst, Held, Probes};
use super::support::*;

/// Files held at each step; `FILEDOCK_BENCH_HELD_MAX` drops the steps above it.
const STEPS: [usize; 4] = [1_000, 10_000, 50_000, 100_000];
/// The timed burst: the last this many uploads that reach a step.
const BURST: usize = 1_000;
const IN_FLIGHT: usize = 32;
/// Sequential samples of each single-request figure (the median is reported).
const SAMPLES: usize = 20;
/// The list's first page on SecantusDB takes seconds at 100k files: after
/// this much time spent on it at one step, and at least 3 samples, stop.
const LIST_BUDGET: Duration = Duration::from_secs(60);

/// The figures at one step.
#[derive(Clone, Copy)]
struct Step {
    held: usize,
    rate: f64,
    /// The server's CPU time and bytes written to storage per upload of the burst.
    cpu_ms: f64,
    written_kib: f64,
    failed: usize,
    upload: Figure,
    me: Figure,
    list: Figure,
}

/// The median of one request's samples that succeeded, and how many failed.
#[derive(Clone, Copy)]
struct Figure {
    ms: f64,
    samples: usize,
    failed: usize,
}

impl Figure {
    fn of(samples: &[(bool, Duration)]) -> Self {
        let ok: Vec<f64> = samples
            .iter()
            .filter(|s| s.0)
            .map(|s| s.1.as_secs_f64() * 1000.0)
            .collect();
        Self {
            failed: samples.len() - ok.len(),
            samples: samples.len(),
            ms: if ok.is_empty() {
                f64::NAN
            } else {
                median_f(ok)
            },
        }
    }

    /// `12.3 ms`, with the sample count when short and the failures if any.
    fn cell(&self) -> String {
        let mut cell = format!("{:.1} ms", self.ms);
        if self.samples != SAMPLES {
            cell += &format!(" (of {})", self.samples);
        }
        if self.failed > 0 {
            cell += &format!(" ({} failed)", self.failed);
        }
        cell
    }
}

pub(crate) async fn cost_vs_files_held(client: &Client, r: &mut Report) {
    let max = std::env::var("FILEDOCK_BENCH_HELD_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let steps: Vec<usize> = STEPS.into_iter().filter(|&s| s <= max).collect();
    r.section(
        "11. Cost vs files held (issue 22): one user, 4 KiB files, 32 in flight",
        "| backend | files held | burst uploads/s | ÷ 1k | one upload (p50) | ÷ 1k | `/v1/me` (p50) | ÷ 1k | first page, 100 (p50) | ÷ 1k | filedock CPU / upload | written / upload |",
    );
    for embedded in [true, false] {
        grow(client, embedded, &steps, r).await;
    }
    r.note(format!(
        "Burst: the last {BURST} uploads that reach the step, {IN_FLIGHT} in flight. One upload, \
         `/v1/me` and `GET /v1/files?limit=100`: medians of {SAMPLES} sequential requests each \
         (the list stops after {} s and 3 samples: \"of n\" gives its count; failures are \
         counted, not timed). \"same time\": a fresh server's user grown to 1k files, then \
         bursts of {BURST} by it and by the grown user alternating ({REPS} each, median), then \
         both probed alternating; ratios to the fresh user's figures.",
        LIST_BUDGET.as_secs()
    ));
}

/// Grows one user through `steps`, a row per step, then the side-by-side check.
async fn grow(client: &Client, embedded: bool, steps: &[usize], r: &mut Report) {
    let name = if embedded { "embedded" } else { "real stack" };
    let mut grown = Held::start(client, embedded).await;
    let mut first: Option<Step> = None;
    for &target in steps {
        let started = Instant::now();
        let (failed, burst) = grown.grow_to(target).await;
        let mut probes = Probes::default();
        for i in 0..SAMPLES {
            probes.round(&mut grown, i).await;
        }
        let step = probes.step(target, burst, failed);
        let base = first.get_or_insert(step);
        r.row(row(name, &step, base));
        eprintln!(
            "   ({name}: step to {target} took {:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    if steps.len() > 1 {
        // A fresh server's user at 1k files and the grown user, side by
        // side: bursts alternate, REPS each (the fresh user ends near 4k).
        let mut fresh = Held::start(client, embedded).await;
        let (fresh_failed, _) = fresh.grow_to(steps[0]).await;
        let mut bursts = [Vec::new(), Vec::new()];
        for rep in 0..REPS {
            for i in 0..2 {
                let which = (i + rep) % 2;
                let h = if which == 0 { &mut fresh } else { &mut grown };
                bursts[which].push(h.burst(BURST).await);
            }
        }
        let [a_bursts, b_bursts] = bursts.map(|mut b: Vec<Burst>| {
            b.sort_by_key(|b| b.batch.wall);
            b[b.len() / 2]
        });
        let (mut a, mut b) = (Probes::default(), Probes::default());
        for i in 0..SAMPLES {
            a.round(&mut fresh, i).await;
            b.round(&mut grown, i).await;
        }
        let a = a.step(
            fresh.held,
            a_bursts,
            fresh_failed + a_bursts.batch.total - a_bursts.batch.ok,
        );
        let failed = b_bursts.batch.total - b_bursts.batch.ok;
        let b = b.step(grown.held, b_bursts, failed);
        r.row(row(&format!("{name}, same time: fresh server"), &a, &a));
        r.row(row(&format!("{name}, same time: grown user"), &b, &a));
        fresh.finish();
    }
    grown.finish();
}

fn row(backend: &str, s: &Step, base: &Step) -> String {
    let failed = match s.failed {
        0 => String::new(),
        n => format!(" ({n} failed)"),
    };
    let held = match s.held {
        n if n >= 1000 => format!("{}k", (n + 500) / 1000),
        n => n.to_string(),
    };
    format!(
        "| {backend} | {held} | {:.0}{failed} | {:.2}× | {} | {:.2}× | {} | {:.2}× | {} | {:.2}× | {:.2} ms ({:.2}×) | {:.1} KiB |",
        s.rate,
        s.rate / base.rate,
        s.upload.cell(),
        s.upload.ms / base.upload.ms,
        s.me.cell(),
        s.me.ms / base.me.ms,
        s.list.cell(),
        s.list.ms / base.list.ms,
        s.cpu_ms,
        s.cpu_ms / base.cpu_ms,
        s.written_kib,
    )
}
