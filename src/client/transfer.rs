//! The client's calls: uploads and downloads streamed from and to disk
//! with a progress bar each, and the small calls around them.

use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::{
    api::{Api, Failure, unreachable},
    resumable::RESUMABLE_FROM,
};

/// Files listed per request.
const PAGE: usize = 1000;
const BAR_TEMPLATE: &str = "{msg:20!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";

fn bar(bars: &MultiProgress, len: u64, name: &str) -> ProgressBar {
    let bar = bars.add(ProgressBar::new(len));
    if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(name.to_owned());
    bar
}

impl Api {
    /// Streams the file from disk as the raw body (a large one resumably,
    /// see [`super::resumable`]); the created file.
    pub async fn upload(&self, path: &Path, bars: &MultiProgress) -> Result<Value, Failure> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| unreachable(format!("{}: {e}", path.display())))?;
        let len = file.metadata().await.map_err(unreachable)?.len();
        let name = path
            .file_name()
            .map_or_else(|| "upload".into(), |n| n.to_string_lossy().into_owned());
        let bar = bar(bars, len, &name);
        if len >= RESUMABLE_FROM {
            let file = self.upload_resumable(path, &name, len, &bar).await;
            bar.finish();
            return file;
        }
        let progress = bar.clone();
        let body =
            ReaderStream::new(file).inspect_ok(move |chunk| progress.inc(chunk.len() as u64));
        let url = format!(
            "{}/v1/files?filename={}",
            self.base,
            utf8_percent_encode(&name, NON_ALPHANUMERIC)
        );
        let req = self
            .http
            .post(url)
            .header("content-type", "application/octet-stream")
            .header("content-length", len)
            .body(reqwest::Body::wrap_stream(body));
        let res = self.send(req, StatusCode::CREATED).await;
        bar.finish();
        res?.json().await.map_err(unreachable)
    }

    /// Streams the file to `output` (default: its own name here); what was written.
    pub async fn download(&self, id: &str, output: Option<PathBuf>) -> Result<Value, Failure> {
        let file_url = format!(
            "{}/v1/files/{}",
            self.base,
            utf8_percent_encode(id, NON_ALPHANUMERIC)
        );
        let meta: Value = self
            .send(self.http.get(&file_url), StatusCode::OK)
            .await?
            .json()
            .await
            .map_err(unreachable)?;
        let name = meta["filename"].as_str().unwrap_or(id);
        // Only the last component of the stored name, never a path.
        let path = output
            .unwrap_or_else(|| PathBuf::from(Path::new(name).file_name().unwrap_or(id.as_ref())));
        let res = self
            .send(self.http.get(format!("{file_url}/content")), StatusCode::OK)
            .await?;
        let bar = bar(
            &MultiProgress::new(),
            meta["size"].as_u64().unwrap_or(0),
            name,
        );
        let written = async {
            let mut out = tokio::fs::File::create(&path).await?;
            let mut body = res.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(std::io::Error::other)?;
                out.write_all(&chunk).await?;
                bar.inc(chunk.len() as u64);
            }
            out.flush().await
        }
        .await;
        bar.finish();
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(unreachable(format!("{}: {e}", path.display())));
        }
        Ok(json!({"id": id, "path": path, "size": meta["size"]}))
    }

    /// Every file, a page at a time.
    pub async fn list(&self) -> Result<Vec<Value>, Failure> {
        let mut files = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut req = self
                .http
                .get(format!("{}/v1/files", self.base))
                .query(&[("limit", PAGE)]);
            if let Some(c) = &cursor {
                req = req.query(&[("cursor", c)]);
            }
            let page: Value = self
                .send(req, StatusCode::OK)
                .await?
                .json()
                .await
                .map_err(unreachable)?;
            files.extend(page["files"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return Ok(files),
            }
        }
    }

    pub async fn delete(&self, id: &str) -> Result<(), Failure> {
        let url = format!(
            "{}/v1/files/{}",
            self.base,
            utf8_percent_encode(id, NON_ALPHANUMERIC)
        );
        self.send(self.http.delete(url), StatusCode::NO_CONTENT)
            .await
            .map(drop)
    }

    /// Attaches a file to a session or an agent (`kind` is the path segment).
    pub async fn attach(&self, kind: &str, container: &str, file_id: &str) -> Result<(), Failure> {
        let url = format!(
            "{}/v1/{kind}/{}/files",
            self.base,
            utf8_percent_encode(container, NON_ALPHANUMERIC)
        );
        let req = self.http.post(url).json(&json!({"file_id": file_id}));
        self.send(req, StatusCode::OK).await.map(drop)
    }
}
