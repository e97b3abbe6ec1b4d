//! Scenario 12 (issue 45): what the events cost. 12a: uploads with events
//! (this build) against builds without them (`FILEDOCK_BENCH_BASE_BIN`), in
//! the same run, alternating; 12b: how soon a long-polling reader sees an
//! upload's event after its 201; 12c: whether an upload costs more on a
//! server that keeps many events than on a fresh one.

mod kept;
mod wake;

use std::time::{Duration, Instant};

use bytes::Bytes;
use filedock::testing::Server;

use crate::{
    cost::{Cost, Runs, counters, per_upload, quiet},
    support::*,
};

const MIB: usize = 1 << 20;

/// One of 12a's loads: `n` plain uploads of `size` bytes, `in_flight` at
/// once, spread over `users` fresh users.
pub(crate) struct Load {
    name: &'static str,
    size: usize,
    n: usize,
    in_flight: usize,
    users: usize,
}

pub(crate) const LOADS: [Load; 3] = [
    Load {
        name: "4 KiB, 32 users",
        size: 4096,
        n: 640,
        in_flight: 32,
        users: 32,
    },
    Load {
        name: "4 KiB, one user's burst",
        size: 4096,
        n: 640,
        in_flight: 32,
        users: 1,
    },
    Load {
        name: "1 MiB, one user",
        size: MIB,
        n: 100,
        in_flight: 8,
        users: 1,
    },
];

/// Opens each build's connections before its first load.
pub(crate) const WARM_UP: Load = Load {
    name: "warm-up",
    size: 4096,
    n: 64,
    in_flight: 32,
    users: 32,
};

/// All three parts, or those `FILEDOCK_BENCH_12` names (`a`, `ab`: 12c
/// alone takes minutes to grow its server).
pub(crate) async fn events(client: &Client, r: &mut Report) {
    let parts = std::env::var("FILEDOCK_BENCH_12").unwrap_or_else(|_| "abc".into());
    if parts.contains('a') {
        on_vs_off(client, r).await;
    }
    if parts.contains('b') {
        wake::wake_latency(client, r).await;
    }
    if parts.contains('c') {
        kept::cost_vs_events_kept(client, r).await;
    }
}

/// 12a: each load on each build, alternating which goes first, `REPS`
/// times; the median repetition by wall, then this build ÷ each other.
async fn on_vs_off(client: &Client, r: &mut Report) {
    r.section(
        "12a. Uploads with events (this) vs builds without them, plain uploads (issue 45)",
        "| build | load | succeeded | uploads/s | MiB/s | p50 | p99 | MongoDB cmds / upload | filedock CPU ms / upload | SecantusDB CPU ms / upload |",
    );
    let builds = start_builds().await;
    for (name, server) in &builds {
        one_load(client, server, &WARM_UP, &format!("warm-{name}")).await;
    }
    let mut medians = Vec::new();
    for (l, load) in LOADS.iter().enumerate() {
        let mut runs: Vec<Runs> = builds.iter().map(|_| Runs::default()).collect();
        for rep in 0..REPS {
            for i in 0..builds.len() {
                let which = (i + rep) % builds.len();
                let tag = format!("ev-{l}-{rep}");
                let (batch, cost) = one_load(client, &builds[which].1, load, &tag).await;
                runs[which].batches.push(batch);
                runs[which].costs.push(cost);
            }
        }
        let mut of_load = Vec::new();
        for (which, (name, _)) in builds.iter().enumerate() {
            let (batch, cost) = runs[which].median();
            let cost = cost.unwrap_or_default();
            r.row(load_row(name, load, &batch, &cost));
            of_load.push((batch, cost));
        }
        medians.push(of_load);
    }
    for (b, (base, _)) in builds.iter().enumerate().skip(1) {
        for (load, of_load) in LOADS.iter().zip(&medians) {
            r.row(ratio_row(base, load, &of_load[0], &of_load[b]));
        }
    }
    r.note(
        "Each load's users are new for each repetition; the costs are the \
         median repetition's (by wall), from filedock's own counters and the \
         processes' CPU time."
            .to_owned(),
    );
}

/// One load on `server`, by users new to it (named after `tag`), and what
/// it cost per upload (the users' creation not counted).
pub(crate) async fn one_load(
    client: &Client,
    server: &Server,
    load: &Load,
    tag: &str,
) -> (Batch, Cost) {
    let mut keys = Vec::new();
    for u in 0..load.users {
        keys.push(client.user(server, &format!("{tag}-{u}")).await);
    }
    let body = Bytes::from(vec![0x5a; load.size]);
    quiet().await;
    let before = counters(server, true).await;
    let batch = drive(load.n, load.in_flight, |i| {
        client.upload(
            server,
            &keys[i % load.users],
            reqwest::Body::from(body.clone()),
        )
    })
    .await;
    let after = counters(server, true).await;
    (batch, per_upload(&before, &after, load.n))
}

pub(crate) fn load_row(build: &str, load: &Load, b: &Batch, c: &Cost) -> String {
    let mib_s = match load.size >= MIB {
        true => format!(
            "{:.1}",
            (b.ok * load.size) as f64 / MIB as f64 / b.wall.as_secs_f64()
        ),
        false => String::new(),
    };
    format!(
        "| {build} | {} | {}/{} | {:.0} | {mib_s} | {} | {} | {:.1} | {:.2} | {} |",
        load.name,
        b.ok,
        b.total,
        b.rate(),
        ms(b.p50),
        ms(b.p99),
        c.mongo,
        c.cpu_ms,
        c.stack("mongo"),
    )
}

/// This build's figures ÷ `base`'s: uploads/s, and the costs beside.
pub(crate) fn ratio_row(
    base: &str,
    load: &Load,
    this: &(Batch, Cost),
    other: &(Batch, Cost),
) -> String {
    let secantus = |c: &Cost| c.stack_ms.get("mongo").copied().unwrap_or(f64::NAN);
    format!(
        "| this ÷ {base} | {} | | {:.2}× | | | | {:.2}× | {:.2}× | {:.2}× |",
        load.name,
        this.0.rate() / other.0.rate(),
        this.1.mongo / other.1.mongo,
        this.1.cpu_ms / other.1.cpu_ms,
        secantus(&this.1) / secantus(&other.1),
    )
}

/// One plain upload of `size` bytes: the new file's id and when its 201
/// arrived; `None` if it was not a 201 with an id.
pub(crate) async fn upload_id(
    client: &Client,
    server: &Server,
    key: &str,
    size: usize,
) -> Option<(String, Instant)> {
    let res = client
        .http
        .post(format!("{}/v1/files?filename=bench.bin", server.base))
        .bearer_auth(key)
        .body(vec![0x5a; size])
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .ok()?;
    let at = Instant::now();
    if res.status().as_u16() != 201 {
        return None;
    }
    let file: serde_json::Value = res.json().await.ok()?;
    Some((file["id"].as_str()?.to_owned(), at))
}
