//! Large uploads through the resumable endpoint (tus 1.0, `/v1/uploads`):
//! when the connection drops, the client asks the server how much it stored
//! (`HEAD`) and sends the rest from there.

use std::{io::SeekFrom, path::Path, time::Duration};

use base64::Engine;
use futures::TryStreamExt;
use indicatif::ProgressBar;
use reqwest::{StatusCode, header};
use serde_json::Value;
use tokio::io::AsyncSeekExt;
use tokio_util::io::ReaderStream;

use super::api::{Api, Failure, refused, unreachable};

/// Files at least this large go through `/v1/uploads`.
pub const RESUMABLE_FROM: u64 = 16 << 20;
/// The tus protocol version spoken.
const TUS_VERSION: &str = "1.0.0";
/// Tries at resuming after a dropped connection; the pause between them
/// grows by `PAUSE` each time up to `MAX_PAUSE` (≈ 38 s in all).
const ATTEMPTS: u32 = 12;
const PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// How a PATCH ended.
enum Sent {
    /// The server stored up to this offset.
    Upto(u64),
    /// The connection dropped, or the server is out of step (409): ask it.
    Resync(String),
    /// The server does not know whether the last PATCH committed (504
    /// `outcome_unknown`): ask the address it names.
    Unknown(String),
}

impl Api {
    /// Creates the upload, sends the file from wherever the server says it
    /// stands until it has all of it; the created file.
    pub(super) async fn upload_resumable(
        &self,
        path: &Path,
        name: &str,
        len: u64,
        bar: &ProgressBar,
    ) -> Result<Value, Failure> {
        let metadata = format!(
            "filename {}",
            base64::engine::general_purpose::STANDARD.encode(name)
        );
        let create = self
            .http
            .post(format!("{}/v1/uploads", self.base))
            .header("tus-resumable", TUS_VERSION)
            .header("upload-length", len)
            .header("upload-metadata", metadata);
        let created = self.send(create, StatusCode::CREATED).await?;
        let location = created
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| unreachable("the server gave no upload location"))?;
        let url = self.absolute(location);
        let id = url.rsplit('/').next().unwrap_or_default().to_owned();

        let (mut offset, mut failures) = (0, 0);
        while offset < len {
            let (why, at) = match self.patch(&url, path, offset, bar).await? {
                Sent::Upto(n) => {
                    // Progress: the attempts count again from here.
                    failures = 0;
                    offset = n;
                    bar.set_position(offset);
                    continue;
                }
                Sent::Resync(why) => (why, url.clone()),
                Sent::Unknown(location) => {
                    let at = self.absolute(&location);
                    (
                        "the server could not tell whether the upload committed".into(),
                        at,
                    )
                }
            };
            failures += 1;
            if failures >= ATTEMPTS {
                return Err(unreachable(format!("{why}; gave up resuming")));
            }
            tokio::time::sleep((PAUSE * failures).min(MAX_PAUSE)).await;
            // A completed upload answers Upload-Offset = Upload-Length
            // (its final PATCH's answer was lost): done.
            if let Ok(n) = self.offset(&at).await {
                offset = n;
            }
            bar.set_position(offset);
        }
        let file = self
            .send(
                self.http.get(format!("{}/v1/files/{id}", self.base)),
                StatusCode::OK,
            )
            .await?;
        file.json().await.map_err(unreachable)
    }

    /// One PATCH with the file from `offset` to its end.
    async fn patch(
        &self,
        url: &str,
        path: &Path,
        offset: u64,
        bar: &ProgressBar,
    ) -> Result<Sent, Failure> {
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| unreachable(format!("{}: {e}", path.display())))?;
        file.seek(SeekFrom::Start(offset))
            .await
            .map_err(unreachable)?;
        let progress = bar.clone();
        let body =
            ReaderStream::new(file).inspect_ok(move |chunk| progress.inc(chunk.len() as u64));
        let res = self
            .http
            .patch(url)
            .bearer_auth(&self.key)
            .header("tus-resumable", TUS_VERSION)
            .header("upload-offset", offset)
            .header(header::CONTENT_TYPE, "application/offset+octet-stream")
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await;
        let res = match res {
            Ok(res) => res,
            Err(e) => return Ok(Sent::Resync(e.to_string())),
        };
        match res.status() {
            StatusCode::NO_CONTENT => Ok(Sent::Upto(stored_offset(&res).unwrap_or(offset))),
            StatusCode::CONFLICT => Ok(Sent::Resync("the upload's offset moved".into())),
            // The server is still finishing the PATCH whose connection dropped.
            StatusCode::LOCKED => Ok(Sent::Resync("the upload is busy".into())),
            StatusCode::GATEWAY_TIMEOUT => Ok(Sent::Unknown(
                res.headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(url)
                    .to_owned(),
            )),
            s if s.is_server_error() => Ok(Sent::Resync(format!("the server answered {s}"))),
            _ => Err(refused(res).await),
        }
    }

    /// `location` (as a server's `Location` gives it) as a full URL on the
    /// server the CLI talks to: the key is never sent to another origin
    /// (a proxy's or a hostile answer's), only the path is followed.
    fn absolute(&self, location: &str) -> String {
        if location.starts_with(&format!("{}/", self.base)) {
            return location.to_owned();
        }
        let path = match location.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
            None => location,
        };
        // Never glued onto the host (`@elsewhere/…`, `.elsewhere/…`).
        match path.starts_with('/') {
            true => format!("{}{path}", self.base),
            false => format!("{}/{path}", self.base),
        }
    }

    /// How much of the upload the server has.
    async fn offset(&self, url: &str) -> Result<u64, Failure> {
        let head = self.http.head(url).header("tus-resumable", TUS_VERSION);
        let res = self.send(head, StatusCode::OK).await?;
        stored_offset(&res).ok_or_else(|| unreachable("the server gave no Upload-Offset"))
    }
}

fn stored_offset(res: &reqwest::Response) -> Option<u64> {
    res.headers()
        .get("upload-offset")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::Api;

    #[test]
    fn a_location_is_followed_on_the_server_the_cli_talks_to_only() {
        let api = Api::new("http://127.0.0.1:8080", "key");
        let ours = "http://127.0.0.1:8080/v1/uploads/1";
        assert_eq!(api.absolute(ours), ours);
        assert_eq!(api.absolute("/v1/uploads/1"), ours);
        assert_eq!(api.absolute("https://elsewhere.example/v1/uploads/1"), ours);
        assert_eq!(
            api.absolute("http://127.0.0.1:8080.elsewhere.example/v1/uploads/1"),
            ours
        );
        for glued in [
            "@elsewhere.example/v1/uploads/1",
            ".elsewhere.example/v1/uploads/1",
        ] {
            assert!(
                api.absolute(glued).starts_with("http://127.0.0.1:8080/"),
                "{glued}"
            );
        }
    }
}
