//! How the client talks to the server: the API's address and key, one
//! request's send, and what a failure is (and its exit code).

use reqwest::{Response, StatusCode};
use serde_json::Value;

/// Exit codes: 0 all done; 1 the server refused something (its message is
/// printed); 2 bad usage (clap's); 3 the server could not be reached or a
/// local file could not be read or written.
#[derive(Debug)]
pub enum Failure {
    Refused(String),
    Unreachable(String),
}

impl Failure {
    pub(super) fn code(&self) -> u8 {
        match self {
            Self::Refused(_) => 1,
            Self::Unreachable(_) => 3,
        }
    }

    pub(super) fn message(&self) -> &str {
        match self {
            Self::Refused(m) | Self::Unreachable(m) => m,
        }
    }
}

/// The server at `base`, asked with the user's `key`.
pub struct Api {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
    pub(super) key: String,
}

pub(super) fn unreachable(e: impl std::fmt::Display) -> Failure {
    Failure::Unreachable(e.to_string())
}

/// The API's own words for a refusal: `error.message`, else the status.
pub(super) async fn refused(res: Response) -> Failure {
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    let message = body["error"]["message"].as_str().unwrap_or(status.as_str());
    Failure::Refused(format!("{message} ({status})"))
}

impl Api {
    pub fn new(base: &str, key: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            key: key.to_owned(),
        }
    }

    pub(super) async fn send(
        &self,
        req: reqwest::RequestBuilder,
        ok: StatusCode,
    ) -> Result<Response, Failure> {
        let res = req
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(unreachable)?;
        if res.status() == ok {
            Ok(res)
        } else {
            Err(refused(res).await)
        }
    }
}
