//! Calls out to other services over HTTP, signed the Standard Webhooks way
//! (standardwebhooks.com): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature` (`v1,` + base64 of HMAC-SHA256 of
//! `{id}.{timestamp}.{body}` under the secret `whsec_…` names). The
//! webhooks' dispatcher (`domain::webhooks`) sends events with it, and
//! the pre-commit hook (`domain::upload::precommit`) asks with it.

mod sign;

use std::time::Duration;

pub use self::sign::Signer;

/// The most of an answer's body read (and dropped).
const DRAIN_BYTES: usize = 64 * 1024;

/// `url` as it may be shown and kept: without user info, query or
/// fragment (where credentials go).
pub fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "<not a URL>".into(),
    }
}

/// What one attempt at a call met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The receiver answered 2xx.
    Accepted(u16),
    /// Any other answer, or none: what it was, for the log and a dead
    /// letter (never the body sent, nor the secret).
    Refused(String),
}

/// Sends signed calls; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct Caller {
    client: reqwest::Client,
    signer: Signer,
}

impl Caller {
    /// Each call gives up after `timeout` (connecting included).
    pub fn new(signer: Signer, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A receiver's redirect is not followed: the signature is for
            // the URL configured.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("filedock-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, signer })
    }

    /// POSTs `body` (JSON) to `url` as message `id`, signed at this second.
    pub async fn post(&self, url: &str, id: &str, body: &[u8]) -> Answer {
        match self.send(url, id, body).await {
            Ok(r) => {
                let status = r.status();
                drain(r).await;
                match status.is_success() {
                    true => Answer::Accepted(status.as_u16()),
                    false => Answer::Refused(format!("answered {}", status.as_u16())),
                }
            }
            Err(e) => Answer::Refused(failure(&e)),
        }
    }

    /// POSTs `body` to `url` as message `id`, signed, and reads its answer
    /// as a yes or a no (see [`Asked`]).
    pub async fn ask(&self, url: &str, id: &str, body: &[u8]) -> Asked {
        match self.send(url, id, body).await {
            Ok(r) if r.status().is_success() => {
                drain(r).await;
                Asked::Yes
            }
            Ok(r)
                if r.status().is_client_error() && !CALL_FAILED.contains(&r.status().as_u16()) =>
            {
                let status = r.status().as_u16();
                Asked::No(reason_of(status, &read_capped(r).await))
            }
            Ok(r) => {
                let status = r.status().as_u16();
                drain(r).await;
                Asked::Failed(format!("answered {status}"))
            }
            Err(e) => Asked::Failed(failure(&e)),
        }
    }

    /// Sends the request, signed at this second.
    async fn send(
        &self,
        url: &str,
        id: &str,
        body: &[u8],
    ) -> Result<reqwest::Response, reqwest::Error> {
        let timestamp = chrono::Utc::now().timestamp();
        let signature = self.signer.sign(id, timestamp, body);
        self.client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.to_vec())
            .send()
            .await
    }
}

/// What a hook asked whether something may go on answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// 2xx.
    Yes,
    /// A 4xx but those of [`CALL_FAILED`], with the reason it gave: its
    /// body's `reason` if it is JSON with one, else its text (at most
    /// [`REASON_CHARS`] characters, control and direction characters
    /// taken out).
    No(String),
    /// No answer in time, none at all, a 5xx, a 3xx or a 4xx of
    /// [`CALL_FAILED`]: what it was.
    Failed(String),
}

/// The 4xx answers that say the call itself failed (its credentials, its
/// address, its method, a proxy, a timeout, a rate limit), not that the
/// hook refused what it was asked about: failures, as a 5xx is.
pub const CALL_FAILED: [u16; 7] = [401, 403, 404, 405, 407, 408, 429];

/// The most of a refusal's reason passed on.
pub const REASON_CHARS: usize = 500;

/// Up to [`DRAIN_BYTES`] of an answer's body.
async fn read_capped(mut answer: reqwest::Response) -> Vec<u8> {
    let mut read = Vec::new();
    while let Ok(Some(chunk)) = answer.chunk().await {
        read.extend_from_slice(&chunk);
        if read.len() > DRAIN_BYTES {
            break;
        }
    }
    read
}

/// A refusal's reason: the body's `reason` if it is JSON with one, else
/// its text; cut to [`REASON_CHARS`] characters; its status if empty.
fn reason_of(status: u16, body: &[u8]) -> String {
    let json = serde_json::from_slice::<serde_json::Value>(body).ok();
    let text = match json.as_ref().and_then(|j| j["reason"].as_str()) {
        Some(reason) => reason.trim().to_owned(),
        None => String::from_utf8_lossy(body).trim().to_owned(),
    };
    // Shown to the client and logged: no control characters (a terminal's
    // escapes) nor direction overrides (text that reads otherwise).
    let shown = |c: &char| {
        !c.is_control() && !matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    let text: String = text.chars().filter(shown).take(REASON_CHARS).collect();
    match text.trim().is_empty() {
        true => format!("answered {status}"),
        false => text.trim().to_owned(),
    }
}

/// What a call that got no answer met.
fn failure(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        format!("failed: {}", without_url(e))
    }
}

/// The bytes of an answer read up to [`DRAIN_BYTES`], so that its
/// connection goes back to the pool (a new one per event costs a
/// handshake each); a longer answer closes it.
async fn drain(mut answer: reqwest::Response) {
    let mut read = 0;
    while let Ok(Some(chunk)) = answer.chunk().await {
        read += chunk.len();
        if read > DRAIN_BYTES {
            return;
        }
    }
}

/// A reqwest error's text without the URL (which may carry credentials).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_the_json_reason_or_the_text_cut_and_cleaned() {
        assert_eq!(
            reason_of(422, br#"{"reason": "no executables"}"#),
            "no executables"
        );
        assert_eq!(reason_of(400, b"  plain words \n"), "plain words");
        assert_eq!(reason_of(409, b""), "answered 409");
        assert_eq!(
            reason_of(422, "a\u{1b}[31mred\u{202e}txt".as_bytes()),
            "a[31mredtxt"
        );
        assert_eq!(
            reason_of(422, "x".repeat(900).as_bytes()).len(),
            REASON_CHARS
        );
    }
}
