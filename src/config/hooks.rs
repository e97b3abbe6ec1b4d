//! The settings of what filedock calls out to: webhooks
//! (`FILEDOCK_WEBHOOK_*`) and the pre-commit hook
//! (`FILEDOCK_PRECOMMIT_HOOK_*`), which share the signing secret.

use std::{str::FromStr, time::Duration};

use anyhow::bail;
use secrecy::SecretString;

use super::vars::Vars;

/// Webhooks: every event delivered to each URL, signed.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    pub urls: Vec<String>,
    /// `whsec_…` (checked when the signer is made from it).
    pub secret: SecretString,
    /// An event not delivered this long after it was written is given up
    /// on (a dead letter).
    pub max_age: Duration,
    /// Owners delivered to at once, per endpoint and instance.
    pub concurrency: usize,
    /// One attempt's limit.
    pub timeout: Duration,
    /// The longest pause between two attempts at one event.
    pub retry_max: Duration,
}

/// The pre-commit hook: asked, once an upload's bytes are stored and
/// before its commit, whether it may commit.
#[derive(Clone, Debug)]
pub struct PrecommitSettings {
    pub url: String,
    /// `FILEDOCK_WEBHOOK_SECRET`: its calls are signed as webhooks are.
    pub secret: SecretString,
    /// One call's limit.
    pub timeout: Duration,
    /// What a timeout, a 5xx or no answer means.
    pub on_failure: HookFailure,
}

/// `FILEDOCK_PRECOMMIT_HOOK_FAILURE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookFailure {
    /// The upload is refused (503, nothing stored).
    Reject,
    /// The upload commits as if the hook had said yes.
    Allow,
}

impl FromStr for HookFailure {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "reject" => Ok(Self::Reject),
            "allow" => Ok(Self::Allow),
            other => {
                bail!("FILEDOCK_PRECOMMIT_HOOK_FAILURE must be reject or allow, not {other:?}")
            }
        }
    }
}

/// `FILEDOCK_WEBHOOK_*`: `None` without a URL.
pub(super) fn webhook_settings<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
) -> anyhow::Result<Option<WebhookSettings>> {
    let Some(list) = vars.get("WEBHOOK_URL").filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let urls: Vec<String> = list
        .split(',')
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect();
    if let Some(bad) = urls
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        // Named by its place, not shown: a URL may carry credentials.
        let place = urls.iter().position(|u| u == bad).unwrap_or(0) + 1;
        bail!(
            "FILEDOCK_WEBHOOK_URL: each URL must start with http:// or https:// (URL {place} of the list does not)"
        );
    }
    let Some(secret) = vars.get("WEBHOOK_SECRET") else {
        bail!(
            "FILEDOCK_WEBHOOK_URL needs FILEDOCK_WEBHOOK_SECRET (whsec_ + base64 of 24 or more random bytes)"
        );
    };
    let settings = WebhookSettings {
        urls,
        secret: SecretString::from(secret),
        max_age: vars.secs("WEBHOOK_MAX_AGE_SECS")?,
        concurrency: vars.value("WEBHOOK_CONCURRENCY")?,
        timeout: vars.secs("WEBHOOK_TIMEOUT_SECS")?,
        retry_max: vars.secs("WEBHOOK_RETRY_MAX_SECS")?,
    };
    if settings.concurrency == 0
        || settings.timeout.is_zero()
        || settings.retry_max.is_zero()
        || settings.max_age.is_zero()
    {
        bail!(
            "FILEDOCK_WEBHOOK_CONCURRENCY, _TIMEOUT_SECS, _RETRY_MAX_SECS and _MAX_AGE_SECS must be more than 0"
        );
    }
    Ok(Some(settings))
}

/// `FILEDOCK_PRECOMMIT_HOOK_*`: `None` without a URL.
pub(super) fn precommit_settings<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
) -> anyhow::Result<Option<PrecommitSettings>> {
    let Some(url) = vars.get("PRECOMMIT_HOOK_URL").map(|u| u.trim().to_owned()) else {
        return Ok(None);
    };
    if url.is_empty() {
        return Ok(None);
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("FILEDOCK_PRECOMMIT_HOOK_URL must start with http:// or https://");
    }
    let Some(secret) = vars.get("WEBHOOK_SECRET") else {
        bail!(
            "FILEDOCK_PRECOMMIT_HOOK_URL needs FILEDOCK_WEBHOOK_SECRET (its calls are signed as webhooks are)"
        );
    };
    let settings = PrecommitSettings {
        url,
        secret: SecretString::from(secret),
        timeout: vars.secs("PRECOMMIT_HOOK_TIMEOUT_SECS")?,
        on_failure: vars.value("PRECOMMIT_HOOK_FAILURE")?,
    };
    if settings.timeout.is_zero() {
        bail!("FILEDOCK_PRECOMMIT_HOOK_TIMEOUT_SECS must be more than 0");
    }
    Ok(Some(settings))
}
