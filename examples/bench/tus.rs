//! Scenario 7: a 1 GiB resumable (tus) upload against a plain upload of the
//! same bytes, and a fresh server's peak RSS through the tus one.

use std::time::{Duration, Instant};

use filedock::testing::Server;

use crate::support::*;

const SIZE: usize = 1 << 30;

/// One tus upload: `POST`, then the whole body in one `PATCH` (what
/// tus-js-client does by default); `true` if it committed.
async fn tus_upload(http: &reqwest::Client, server: &Server, key: &str) -> bool {
    let created = http
        .post(format!("{}/v1/uploads", server.base))
        .bearer_auth(key)
        .header("tus-resumable", "1.0.0")
        .header("upload-length", SIZE.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let (body, _) = generated(SIZE);
    let res = http
        .patch(format!("{}{location}", server.base))
        .bearer_auth(key)
        .header("tus-resumable", "1.0.0")
        .header("upload-offset", "0")
        .header("content-type", "application/offset+octet-stream")
        .body(body)
        .timeout(Duration::from_secs(300))
        .send()
        .await;
    res.is_ok_and(|r| r.status().as_u16() == 204)
}

pub(crate) async fn tus_vs_plain(client: &Client, r: &mut Report) {
    r.section(
        "8. Resumable (tus) vs plain upload of the same 1 GiB",
        "| path | MiB/s (median of 3) |",
    );
    let http = reqwest::Client::new();
    let server = Server::start(&[]).await;
    let key = client.user(&server, "tus").await;
    let mut rates = [Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let started = Instant::now();
            let ok = if which == 0 {
                client.upload(&server, &key, generated(SIZE).0).await.0
            } else {
                tus_upload(&http, &server, &key).await
            };
            assert!(ok, "upload failed");
            rates[which].push(SIZE as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64());
        }
    }
    let (plain, tus) = (median_f(rates[0].clone()), median_f(rates[1].clone()));
    r.row(format!("| plain `POST /v1/files` | {plain:.0} |"));
    r.row(format!("| tus `POST` + one `PATCH` | {tus:.0} |"));
    r.row(format!("| tus ÷ plain | {:.2} |", tus / plain));
    let fresh = Server::start(&[]).await;
    let key = client.user(&fresh, "rss").await;
    assert!(tus_upload(&http, &fresh, &key).await);
    r.note(format!(
        "Peak RSS of a fresh filedock through one 1 GiB tus upload (8 MiB parts, 4 in flight): **{} MiB**.",
        fresh.peak_rss_mib()
    ));
}
