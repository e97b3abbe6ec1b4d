//! Scenario 12c: whether an upload costs more on a server that keeps many
//! events. A "grown" server's events are grown to `FILEDOCK_BENCH_EVENTS_KEPT`
//! (default 20000) by renames, so that its files stay few; a fresh server
//! beside it keeps none. Then the same uploads on each, alternating.

use std::time::{Duration, Instant};

use bytes::Bytes;
use filedock::testing::{Server, metric_in, metrics_text};
use futures::future::join_all;
use serde_json::json;

use super::upload_id;
use crate::{
    cost::{Cost, Runs, counters, per_upload},
    support::*,
};

const USERS: usize = 32;
/// The timed load: this many uploads by `USERS` new users, one in flight each.
const UPLOADS: usize = 320;
/// Sequential single uploads after each load (their median is reported).
const SINGLES: usize = 20;
/// A grown file's names, taken in turn: each rename writes a `file.renamed`.
const NAMES: [&str; 2] = ["bench-a.bin", "bench-b.bin"];

pub(super) async fn cost_vs_events_kept(client: &Client, r: &mut Report) {
    let target = std::env::var("FILEDOCK_BENCH_EVENTS_KEPT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(20_000);
    r.section(
        &format!(
            "12c. Cost vs events kept: a server grown to {target} events beside a fresh one; \
             {UPLOADS} × 4 KiB uploads by {USERS} new users, one in flight each, then \
             {SINGLES} single uploads (issue 45)"
        ),
        "| server | events kept | uploads/s | p50 | MongoDB cmds / upload | SecantusDB CPU ms / upload | one upload (p50) | feed page of 100 from place 1 (p50) |",
    );
    let grown = Server::start(&[]).await;
    let started = Instant::now();
    let failed = grow(client, &grown, target).await;
    let took = started.elapsed();
    let fresh = Server::start(&[]).await;
    let servers = [&fresh, &grown];
    let mut kept = [0.0; 2];
    for (k, server) in kept.iter_mut().zip(servers) {
        *k = events_written(server).await;
    }
    let mut runs = [Runs::default(), Runs::default()];
    let mut singles = [Vec::new(), Vec::new()];
    let mut feeds = [Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let tag = format!("kept-{rep}");
            let (batch, cost, single, feed) = one_rep(client, servers[which], &tag).await;
            runs[which].batches.push(batch);
            runs[which].costs.push(cost);
            singles[which].push(single);
            feeds[which].push(feed);
        }
    }
    let [a, b] = [0, 1].map(|w| {
        let (batch, cost) = runs[w].median();
        let single = median_f(singles[w].clone());
        let feed = median_f(feeds[w].clone());
        Figures {
            kept: kept[w],
            batch,
            cost: cost.unwrap_or_default(),
            single,
            feed,
        }
    });
    r.row(a.row("fresh"));
    r.row(b.row("grown (with events kept)"));
    r.row(ratio_row(&a, &b));
    r.note(format!(
        "Growing to {:.0} events took {:.0} s ({failed} renames failed); events kept: \
         `filedock_events_written_total` of each server before the loads. The loads' users \
         are new at each repetition (the events kept are other users'); medians of {REPS}.",
        kept[1],
        took.as_secs_f64()
    ));
}

/// One server's figures: its median repetition and the singles' median.
struct Figures {
    kept: f64,
    batch: Batch,
    cost: Cost,
    /// The single uploads' p50, in ms.
    single: f64,
    /// The p50 of the admin's page of 100 from the feed's first place, in ms.
    feed: f64,
}

impl Figures {
    fn row(&self, server: &str) -> String {
        let b = &self.batch;
        format!(
            "| {server} | {:.0} | {:.0} ({}/{}) | {} | {:.1} | {} | {:.1} ms | {:.1} ms |",
            self.kept,
            b.rate(),
            b.ok,
            b.total,
            ms(b.p50),
            self.cost.mongo,
            self.cost.stack("mongo"),
            self.single,
            self.feed,
        )
    }

    fn secantus(&self) -> f64 {
        self.cost.stack_ms.get("mongo").copied().unwrap_or(f64::NAN)
    }
}

fn ratio_row(fresh: &Figures, grown: &Figures) -> String {
    format!(
        "| grown ÷ fresh | | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {:.2}× |",
        grown.batch.rate() / fresh.batch.rate(),
        grown.batch.p50.as_secs_f64() / fresh.batch.p50.as_secs_f64(),
        grown.cost.mongo / fresh.cost.mongo,
        grown.secantus() / fresh.secantus(),
        grown.single / fresh.single,
        grown.feed / fresh.feed,
    )
}

/// The timed load on `server` by `USERS` users new to it, what it cost per
/// upload, and the p50 (ms) of `SINGLES` sequential uploads after it and
/// of as many reads of the admin's feed page of 100 from place 1 (all the
/// events kept follow it).
async fn one_rep(client: &Client, server: &Server, tag: &str) -> (Batch, Cost, f64, f64) {
    let mut keys = Vec::new();
    for u in 0..USERS {
        keys.push(client.user(server, &format!("{tag}-{u}")).await);
    }
    let body = Bytes::from(vec![0x5a; 4096]);
    let upload = |i: usize| client.upload(server, &keys[i % USERS], body.clone().into());
    let before = counters(server, true).await;
    let batch = drive(UPLOADS, USERS, upload).await;
    let after = counters(server, true).await;
    let mut singles = Vec::new();
    for i in 0..SINGLES {
        singles.push(upload(i).await);
    }
    let single = Batch::from(singles, Duration::ZERO).p50;
    let cost = per_upload(&before, &after, UPLOADS);
    let mut pages = Vec::new();
    for _ in 0..SINGLES {
        let started = Instant::now();
        let res = (client.http)
            .get(format!("{}/v1/events?after=1&limit=100", server.base))
            .bearer_auth(ADMIN)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        pages.push((
            res.is_ok_and(|r| r.status().is_success()),
            started.elapsed(),
        ));
    }
    let feed = Batch::from(pages, Duration::ZERO).p50;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (batch, cost, ms(single), ms(feed))
}

/// Grows `server`'s events to `target` without growing its files: `USERS`
/// users upload one file each, then rename it back and forth, one rename
/// in flight per user. The renames that failed.
async fn grow(client: &Client, server: &Server, target: usize) -> usize {
    let mut files = Vec::new();
    for u in 0..USERS {
        let key = client.user(server, &format!("grow-{u}")).await;
        if let Some((id, _)) = upload_id(client, server, &key, 4096).await {
            files.push((key, id));
        }
    }
    let written = events_written(server).await as usize;
    let per_file = target.saturating_sub(written).div_ceil(files.len().max(1));
    let renames = files.iter().map(|(key, id)| async move {
        let mut failed = 0;
        for k in 0..per_file {
            failed += !rename(client, server, key, id, NAMES[k % 2]).await as usize;
        }
        failed
    });
    join_all(renames).await.into_iter().sum()
}

/// `PATCH /v1/files/{id} {"name"}`: whether it succeeded.
async fn rename(client: &Client, server: &Server, key: &str, id: &str, name: &str) -> bool {
    let res = client
        .http
        .patch(format!("{}/v1/files/{id}", server.base))
        .bearer_auth(key)
        .json(&json!({ "name": name }))
        .timeout(Duration::from_secs(60))
        .send()
        .await;
    res.is_ok_and(|r| r.status().is_success())
}

/// The events `server` has written (`filedock_events_written_total`).
async fn events_written(server: &Server) -> f64 {
    let text = metrics_text(&server.base).await;
    metric_in(&text, "filedock_events_written_total", "")
}
