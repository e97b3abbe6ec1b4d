//! The fault suite's resumable (tus) uploads (a quarter of them two of one
//! user at once, whose creations are grouped): one creates an upload and
//! sends it in several PATCHes, some empty, some cut by the client
//! mid-body, some raced by a second PATCH from the same offset; some
//! created with a deferred length (`Upload-Defer-Length: 1`, as Uppy
//! Companion does), declared by the PATCH with the last bytes or by an
//! empty one after them; after any answer that is not 204 it asks HEAD
//! where to go on from, as tus clients do, or (a fifth of the time) ends
//! the upload with `DELETE`. It is recorded as one upload (`Op::Upload` with `resumable`): told
//! ok if its last PATCH got 204 or a HEAD said complete (or the file reads
//! back, the upload's state gone), failed if its last byte was never sent
//! or its `DELETE` got 204 (no file can exist), unknown otherwise.

use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::StdRng};
use reqwest::{Method, StatusCode};

use crate::{
    helpers::*,
    support::{
        cluster::PART_SIZE,
        history::{Answer, Op},
        workload::{UserWorld, World},
    },
};

const TUS: &str = "1.0.0";
const OCTETS: &str = "application/offset+octet-stream";
/// PATCHes (and HEADs) one upload may take before its client gives up.
const STEPS: usize = 24;
/// The largest piece one PATCH sends.
const PIECE_MAX: usize = 3 << 20;
const TIMEOUT: Duration = Duration::from_secs(60);
/// Of the uploads, those created with a deferred length.
const DEFERRED_PERCENT: u32 = 30;
/// After a PATCH not answered 204, how often the client ends the upload
/// (`DELETE`) instead of asking `HEAD` where to go on from.
const TERMINATE_PERCENT: u32 = 20;

/// What a HEAD (or a read of the file) said about an upload.
enum Seen {
    /// Open, stored up to this offset; whether its length is known
    /// (`Upload-Length`, not `Upload-Defer-Length`).
    At(usize, bool),
    /// Its file is committed.
    Complete,
    /// Gone without a file (expired, discarded).
    Gone,
    /// No answer that tells.
    Unknown,
    /// 500: a bug.
    Internal,
}

/// What a PATCH was answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// 204, stored up to this offset.
    At(usize),
    /// 500: a bug.
    Internal,
    /// Anything else (a refusal, a cut, no answer): HEAD tells.
    Other,
}

/// Of the resumable uploads, those sent as a burst of two by one user at
/// once (as Uppy sends several files): their creations are grouped.
const BURST_PERCENT: u32 = 25;

impl World {
    /// One resumable upload, or sometimes two of the same user at once.
    pub async fn tus_uploads(&self, u: usize, rng: &mut StdRng) {
        if rng.random_range(0..100) >= BURST_PERCENT {
            return self.tus_upload(u, rng).await;
        }
        let mut other = StdRng::seed_from_u64(rng.random());
        futures::join!(self.tus_upload(u, rng), self.tus_upload(u, &mut other));
    }

    /// One resumable upload, recorded as one write.
    async fn tus_upload(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let n = self.next_name();
        let size = match rng.random_range(0..10) {
            0..2 => PART_SIZE + rng.random_range(1..PART_SIZE / 2),
            _ => rng.random_range(1..300_000),
        };
        let body = Bytes::from(pseudo_random_bytes(size, n as u64));
        let name = format!("t{n}.bin");
        let op = Op::Upload {
            user: u,
            name: name.clone(),
            sha256: sha256_hex(&body),
            size: size as u64,
            key: None,
            attempt: 0,
            resumable: true,
            via: None,
        };
        let invoked = Instant::now();
        let mut internal = false;
        let (answer, id) = self.tus_steps(user, &name, &body, rng, &mut internal).await;
        // Its id whatever the answer (read back: nothing of it may be
        // left after its expiry); only an acknowledged one's names a file.
        // A 500 on the way is a bug, whatever came of the upload.
        let answer = match internal {
            true => Answer::Internal("a PATCH or HEAD answered 500".into()),
            false => answer,
        };
        if let (Answer::Ok, Some(id)) = (&answer, &id) {
            user.add_file(id);
        }
        self.record(op, invoked, answer, id);
    }

    async fn tus_steps(
        &self,
        user: &UserWorld,
        name: &str,
        body: &Bytes,
        rng: &mut StdRng,
        internal: &mut bool,
    ) -> (Answer, Option<String>) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let deferred = rng.random_range(0..100) < DEFERRED_PERCENT;
        let (length_header, length) = match deferred {
            true => ("upload-defer-length", "1".to_owned()),
            false => ("upload-length", body.len().to_string()),
        };
        let create = self
            .client
            .post(format!("{}/v1/uploads", self.base(rng)))
            .header("tus-resumable", TUS)
            .header(length_header, length)
            .header("upload-metadata", format!("filename {}", b64.encode(name)));
        let location = match create.bearer_auth(&user.key).timeout(TIMEOUT).send().await {
            Ok(res) if res.status() == StatusCode::CREATED => {
                res.headers()["location"].to_str().unwrap().to_owned()
            }
            // Nothing was sent: no file can come of it, whatever was created.
            Ok(res) => return (failed_as(res.status(), "create"), None),
            Err(_) => return (Answer::Failed("create: transport".into()), None),
        };
        let id = location.rsplit('/').next().unwrap().to_owned();
        let (mut offset, mut sent_last) = (0usize, false);
        // Whether the server knows the length (a deferred one once declared).
        let mut known = !deferred;
        for _ in 0..STEPS {
            let left = body.len() - offset;
            let piece = match rng.random_range(0..100) {
                _ if left == 0 => 0,
                0..10 => 0,
                10..50 => left,
                _ => rng.random_range(1..=left.min(PIECE_MAX)),
            };
            let chunk = body.slice(offset..offset + piece);
            sent_last |= offset + piece == body.len();
            // A deferred length is declared with the last bytes, or (half
            // the time) by an empty PATCH once they are all stored.
            let declares =
                !known && offset + piece == body.len() && (piece == 0 || rng.random_bool(0.5));
            let length = declares.then_some(body.len());
            let base = self.base(rng);
            let answered: Step = match rng.random_range(0..100) {
                // A client that drops the connection mid-body.
                0..12 if piece > 1 => {
                    let at = rng.random_range(1..piece);
                    let cut = futures::stream::iter([
                        Ok(chunk.slice(..at)),
                        Err(std::io::Error::other("the client went away")),
                    ]);
                    let body = reqwest::Body::wrap_stream(cut);
                    self.patch(user, &base, &location, offset, length, body)
                        .await
                }
                // Two PATCHes from the same offset at once: one counts.
                12..22 => {
                    let other = self.base(rng);
                    let (a, b) = tokio::join!(
                        self.patch(user, &base, &location, offset, length, chunk.clone().into()),
                        self.patch(
                            user,
                            &other,
                            &location,
                            offset,
                            length,
                            chunk.clone().into()
                        ),
                    );
                    *internal |= a == Step::Internal || b == Step::Internal;
                    if let Step::At(_) = b { b } else { a }
                }
                _ => {
                    let body = chunk.clone().into();
                    self.patch(user, &base, &location, offset, length, body)
                        .await
                }
            };
            *internal |= answered == Step::Internal;
            // A 204 after a declaring PATCH: the length is known.
            known |= declares && matches!(answered, Step::At(_));
            match answered {
                Step::At(at) if at == body.len() && known => return (Answer::Ok, Some(id)),
                Step::At(at) => offset = at,
                // A client that gives up after an error ends the upload.
                Step::Internal | Step::Other if rng.random_range(0..100) < TERMINATE_PERCENT => {
                    return self.terminate(user, &location, &id, sent_last, rng).await;
                }
                Step::Internal | Step::Other => match self.head(user, &location, &id, rng).await {
                    Seen::At(at, true) if at == body.len() => return (Answer::Ok, Some(id)),
                    Seen::At(at, length_known) => (offset, known) = (at, length_known),
                    Seen::Complete => return (Answer::Ok, Some(id)),
                    Seen::Gone if !sent_last => return (Answer::Failed("gone".into()), Some(id)),
                    Seen::Gone => return (Answer::Unknown("gone".into()), Some(id)),
                    Seen::Internal => *internal = true,
                    Seen::Unknown => tokio::time::sleep(Duration::from_millis(300)).await,
                },
            }
        }
        match sent_last {
            true => (Answer::Unknown("gave up".into()), Some(id)),
            false => (Answer::Failed("gave up".into()), Some(id)),
        }
    }

    /// Ends the upload (`DELETE`): a 204 says no file comes of it (failed);
    /// otherwise one may, if its last byte was sent (unknown).
    async fn terminate(
        &self,
        user: &UserWorld,
        location: &str,
        id: &str,
        sent_last: bool,
        rng: &mut StdRng,
    ) -> (Answer, Option<String>) {
        let res = self
            .client
            .delete(format!("{}{location}", self.base(rng)))
            .bearer_auth(&user.key)
            .header("tus-resumable", TUS)
            .timeout(TIMEOUT)
            .send()
            .await;
        let answer = match res.map(|r| r.status()) {
            Ok(StatusCode::NO_CONTENT) => Answer::Failed("terminated".into()),
            Ok(StatusCode::INTERNAL_SERVER_ERROR) => Answer::Internal("terminate: 500".into()),
            _ if !sent_last => Answer::Failed("terminate: its last byte never sent".into()),
            Ok(status) => Answer::Unknown(format!("terminate: {status}")),
            Err(_) => Answer::Unknown("terminate: transport".into()),
        };
        (answer, Some(id.to_owned()))
    }

    /// A PATCH, and what it was answered.
    async fn patch(
        &self,
        user: &UserWorld,
        base: &str,
        location: &str,
        offset: usize,
        length: Option<usize>,
        body: reqwest::Body,
    ) -> Step {
        let mut req = self
            .client
            .patch(format!("{base}{location}"))
            .bearer_auth(&user.key)
            .header("tus-resumable", TUS)
            .header("content-type", OCTETS)
            .header("upload-offset", offset.to_string());
        if let Some(length) = length {
            // Declares a deferred length.
            req = req.header("upload-length", length.to_string());
        }
        let res = req.timeout(TIMEOUT).body(body).send().await;
        match res {
            Ok(res) if res.status() == StatusCode::NO_CONTENT => {
                upload_offset(&res).map_or(Step::Other, Step::At)
            }
            Ok(res) if res.status() == StatusCode::INTERNAL_SERVER_ERROR => Step::Internal,
            _ => Step::Other,
        }
    }

    /// Where the upload stands: its HEAD, and if it is gone, whether its file is there.
    async fn head(&self, user: &UserWorld, location: &str, id: &str, rng: &mut StdRng) -> Seen {
        let base = self.base(rng);
        let res = self
            .client
            .request(Method::HEAD, format!("{base}{location}"))
            .bearer_auth(&user.key)
            .header("tus-resumable", TUS)
            .timeout(TIMEOUT)
            .send()
            .await;
        match res {
            Ok(res) if res.status() == StatusCode::OK => {
                let known = res.headers().contains_key("upload-length");
                upload_offset(&res).map_or(Seen::Unknown, |at| Seen::At(at, known))
            }
            Ok(res) if res.status() == StatusCode::INTERNAL_SERVER_ERROR => Seen::Internal,
            Ok(res) if res.status() == StatusCode::NOT_FOUND => {
                let file = self
                    .client
                    .get(format!("{base}/v1/files/{id}"))
                    .bearer_auth(&user.key)
                    .timeout(TIMEOUT)
                    .send()
                    .await;
                match file.map(|f| f.status()) {
                    Ok(StatusCode::OK) => Seen::Complete,
                    Ok(StatusCode::NOT_FOUND) => Seen::Gone,
                    _ => Seen::Unknown,
                }
            }
            _ => Seen::Unknown,
        }
    }
}

fn upload_offset(res: &reqwest::Response) -> Option<usize> {
    res.headers()
        .get("upload-offset")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A refused creation: a 500 stays a bug, anything else a failure.
fn failed_as(status: StatusCode, what: &str) -> Answer {
    match status {
        StatusCode::INTERNAL_SERVER_ERROR => Answer::Internal(format!("{what}: 500")),
        s => Answer::Failed(format!("{what}: {}", s.as_u16())),
    }
}
