//! Signed links in the fault suite (issue 42, item 3): now and then a
//! client makes a link to one of the user's files with a minted key or
//! token (revoked ones among them, and now and then its key is revoked
//! right after and one more link made with it on the instance that made
//! the first, which may still trust it), on either instance (`Op::MakeLink`). The checker's side:
//! - a link made with a credential whose key's revocation was acknowledged
//!   before the request was sent, past the auth cache's lifetime, is a
//!   violation (`accounts.rs` `check_credentials`, as for uploads: within
//!   the window an instance that still trusts the key signs one);
//! - at the end, long past the window, every link answered 201 is tried at
//!   every instance: one whose key is not listed (revoked) is refused (403
//!   `link_revoked`; `link_expired` once expired; 404 if its file is gone);
//!   one whose key is listed gives its file's bytes if the file is live
//!   (404 if not), unless it expired;
//! - no link of a deleted user's downloads.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, rngs::StdRng};
use serde_json::json;
use sha2::Digest;

use crate::support::{
    account_readback::FinalAccount,
    accounts::SLACK,
    history::{Answer, Event, FinalUser, Op},
    mints::revoked_at,
    verdict::Verdict,
    workload::{Cred, World},
};

/// A link's lifetime: longer than any run, so only a revocation ends one.
const LINK_SECS: u64 = 3600;
/// How often a link lives a few seconds only (expired at the end).
const SHORT: f64 = 0.1;
/// How often a link's key is revoked right after the link was made.
const REVOKE_AFTER: f64 = 0.3;

impl World {
    /// A link to one of user `u`'s files with one of their newest minted
    /// credentials (maybe revoked), at a random instance; now and then its
    /// key revoked at once after (at either instance), and one more link
    /// made with it where the first was, which may still trust the key
    /// (`FILEDOCK_AUTH_CACHE_SECS`): a 201 there is allowed, but the link
    /// must be refused at the end.
    pub(super) async fn make_link(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let (Some(file_id), Some(cred)) = (user.some_file(rng), self.minted(u, rng, false)) else {
            return self.nothing_to_link(u, rng).await;
        };
        let base = self.base(rng);
        let made = self.link_with(u, &file_id, &cred, &base, rng).await;
        if !made || !rng.random_bool(REVOKE_AFTER) {
            return;
        }
        let key = {
            let creds = user.creds.lock().unwrap();
            (creds.iter())
                .find(|c| !c.token && c.key_id.is_some() && c.key_id == cred.key_id)
                .cloned()
        };
        if let Some(key) = key {
            let (revoking, own) = (self.base(rng), rng.random_bool(0.5));
            self.revoke(u, key, &revoking, own).await;
            self.link_with(u, &file_id, &cred, &base, rng).await;
        }
    }

    /// One link to `file_id` made with `cred` at `base`; whether it was.
    async fn link_with(
        &self,
        u: usize,
        file_id: &str,
        cred: &Cred,
        base: &str,
        rng: &mut StdRng,
    ) -> bool {
        let expires_in = if rng.random_bool(SHORT) {
            rng.random_range(1..4)
        } else {
            LINK_SECS
        };
        let req = (self.client)
            .post(format!("{base}/v1/files/{file_id}/links"))
            .json(&json!({ "expires_in": expires_in }));
        let invoked = Instant::now();
        let (answer, res) = self.send_as(&cred.secret, req).await;
        let url = (res["url"].as_str())
            .filter(|_| answer == Answer::Ok)
            .map(str::to_owned);
        let made = url.is_some();
        let op = Op::MakeLink {
            user: u,
            file_id: file_id.to_owned(),
            via: cred.name.clone(),
            url,
        };
        self.record(op, invoked, answer, None);
        made
    }

    /// Nothing to link with yet: an account write instead (it mints
    /// credentials), if the user has none.
    async fn nothing_to_link(&self, u: usize, rng: &mut StdRng) {
        if self.users[u].creds.lock().unwrap().is_empty() {
            self.account_op(u, rng).await;
        }
    }
}

/// What one instance answered to a link at the end.
#[derive(Clone, Debug)]
pub struct Probe {
    pub base: String,
    pub status: u16,
    pub code: String,
    /// The SHA-256 of the bytes a 200 gave.
    pub sha256: Option<String>,
}

/// A link answered 201 and what each instance answers to it now.
#[derive(Clone, Debug)]
pub struct ProbedLink {
    pub file_id: String,
    pub via: String,
    /// Past its `expires` when it was tried.
    pub expired: bool,
    pub probes: Vec<Probe>,
}

/// Every link of `history` answered 201, tried at each instance of `bases`
/// (without a key).
pub async fn probe_links(bases: &[String], history: &[&Event]) -> Vec<ProbedLink> {
    let client = reqwest::Client::new();
    let mut out = Vec::new();
    for e in history {
        let Op::MakeLink {
            file_id,
            via,
            url: Some(url),
            ..
        } = &e.op
        else {
            continue;
        };
        let path = &url[url.find("/v1/links/").expect("a link's path")..];
        let mut probes = Vec::new();
        for base in bases {
            let res = client.get(format!("{base}{path}")).send().await;
            let probe = match res {
                Err(err) => Probe {
                    base: base.clone(),
                    status: 0,
                    code: err.to_string(),
                    sha256: None,
                },
                Ok(res) => {
                    let status = res.status().as_u16();
                    let body = res.bytes().await.unwrap_or_default();
                    let (code, sha256) = if status == 200 {
                        (
                            String::new(),
                            Some(hex::encode(sha2::Sha256::digest(&body))),
                        )
                    } else {
                        let v: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        (v["error"]["code"].as_str().unwrap_or("").to_owned(), None)
                    };
                    Probe {
                        base: base.clone(),
                        status,
                        code,
                        sha256,
                    }
                }
            };
            probes.push(probe);
        }
        out.push(ProbedLink {
            file_id: file_id.clone(),
            via: via.clone(),
            expired: expires(url).is_some_and(|at| now_secs() >= at),
            probes,
        });
    }
    out
}

fn now_secs() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    now.as_secs() as i64
}

/// A link's `expires` (Unix seconds).
fn expires(url: &str) -> Option<i64> {
    let query = url.split_once('?')?.1;
    (query.split('&'))
        .find_map(|kv| kv.strip_prefix("expires="))
        .and_then(|v| v.parse().ok())
}

/// The key behind the credential named `cred`: itself (a minted key), or
/// the key a token was minted with (`None`: the user's first key).
fn key_of<'a>(history: &[&'a Event], cred: &'a str) -> Option<&'a str> {
    history.iter().find_map(|e| match &e.op {
        Op::MintKey { name, .. } if name == cred => Some(Some(cred)),
        Op::MintToken { name, parent, .. } if name == cred => Some(parent.as_deref()),
        _ => None,
    })?
}

/// What the links' read-back proved, for the run's line.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkTally {
    /// Links answered 201 and tried at the end.
    pub checked: usize,
    /// Of those, links whose key was revoked, refused `link_revoked` at
    /// every instance.
    pub revoked_refused: usize,
    /// Links whose key is listed that gave their file's bytes everywhere.
    pub downloaded: usize,
}

/// Checks live user `u`'s links against their keys (`account`) and files
/// (`user`) at the end.
pub fn check_links(
    history: &[&Event],
    u: usize,
    account: &FinalAccount,
    user: &FinalUser,
    links: &[ProbedLink],
    tally: &mut LinkTally,
    v: &mut Verdict,
) {
    for l in links {
        tally.checked += 1;
        let key = key_of(history, &l.via);
        let alive = key.is_none_or(|k| account.keys.contains(k));
        let file = user.files.get(&l.file_id);
        let ok = |p: &Probe| match (p.status, p.code.as_str()) {
            (403, "link_expired") => l.expired,
            (403, "link_revoked") => !alive,
            (404, _) => file.is_none(),
            (200, _) => {
                alive && !l.expired && file.is_some_and(|f| p.sha256.as_ref() == Some(&f.sha256))
            }
            _ => false,
        };
        if let Some(p) = l.probes.iter().find(|p| !ok(p)) {
            let acked = key.and_then(|k| revoked_at(history, k)).is_some();
            v.note(
                |v| &mut v.lost,
                format!(
                    "user {u}: link to {} made with {} (key {key:?}: listed {alive}, revocation acknowledged {acked}; file live {}; expired {}) answers {} {} at {}",
                    l.file_id,
                    l.via,
                    file.is_some(),
                    l.expired,
                    p.status,
                    p.code,
                    p.base
                ),
            );
            continue;
        }
        let all = |s: u16, c: &str| l.probes.iter().all(|p| p.status == s && p.code == c);
        tally.revoked_refused += usize::from(!alive && all(403, "link_revoked"));
        tally.downloaded += usize::from(l.probes.iter().all(|p| p.status == 200));
    }
}

/// No link of deleted user `u`'s downloads at the end.
pub fn check_deleted_links(u: usize, links: &[ProbedLink], v: &mut Verdict) {
    for l in links {
        if let Some(p) = l.probes.iter().find(|p| p.status == 200 || p.status == 0) {
            let note = format!(
                "user {u}, deleted: link to {} made with {} answers {} at {}",
                l.file_id, l.via, p.status, p.base
            );
            v.note(|v| &mut v.lost, note);
        }
    }
}

/// The links' part of the run's line: links sent/made, tried at the end,
/// those of a revoked key refused everywhere, those that downloaded; links
/// sent with a credential after its key's revocation was acknowledged
/// (sent/made: made ones only within the auth cache's window).
pub fn links_summary(history: &[Event], tally: LinkTally) -> String {
    let all: Vec<&Event> = history.iter().collect();
    let (mut sent, mut made) = (0, 0);
    let (mut after, mut after_made, mut latest) = (0, 0, 0);
    for e in &all {
        let Op::MakeLink { via, .. } = &e.op else {
            continue;
        };
        sent += 1;
        made += usize::from(e.answer == Answer::Ok);
        let at = key_of(&all, via).and_then(|k| revoked_at(&all, k));
        if let Some(at) = at.filter(|at| e.invoked > *at) {
            after += 1;
            if e.answer == Answer::Ok {
                after_made += 1;
                latest = latest.max((e.invoked - at).as_micros());
            }
        }
    }
    format!(
        "links={sent}/{made} links_checked={} revoked_links_refused={} links_downloaded={} links_after_revocation={after}/{after_made} latest_link_after_revocation_us={latest} link_window_ms={}",
        tally.checked,
        tally.revoked_refused,
        tally.downloaded,
        (crate::support::cluster::AUTH_CACHE + SLACK).as_millis(),
    )
}
