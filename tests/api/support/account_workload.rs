//! The fault suite's account writes (issue 25): the admin (or the user)
//! mints the user another key, a client mints a token with one of the user's keys, a key
//! is revoked (by its user or the admin), the admin changes a user's quota;
//! and uploads go now and then with a minted key or token instead of the
//! user's first key (`Op::Upload`'s `via`), revoked ones among them, which
//! must be refused once the revocation is acknowledged and the auth cache
//! has forgotten it. One user is deleted mid-run (`delete_user`). The
//! checker's side is `accounts.rs`.

use std::time::{Duration, Instant};

use rand::{Rng, rngs::StdRng, seq::IndexedRandom};
use serde_json::json;

use crate::{
    helpers::ADMIN_KEY,
    support::{
        history::{Answer, Op},
        workload::{Cred, World},
    },
};

/// The user whose quota the workload changes (not the hot one, whose
/// uploads the other checks need most).
pub const QUOTA_USER: usize = 2;
/// How many minted credentials a user's uploads pick from (the newest).
const CREDS_KEPT: usize = 6;
/// A token's lifetime: longer than any run, so only a revocation ends one.
const TOKEN_SECS: u64 = 3600;
/// How long an admin delete of a user is sent again until it is answered.
const DELETE_USER_FOR: Duration = Duration::from_secs(120);

impl World {
    /// One account write for user `u`, of a random kind.
    pub(super) async fn account_op(&self, u: usize, rng: &mut StdRng) {
        match rng.random_range(0..10) {
            0..3 => self.mint_key(u, rng).await,
            3..6 => self.mint_token(u, rng).await,
            6..8 => self.revoke_key(u, rng).await,
            _ if u == QUOTA_USER => self.set_quota(u, rng).await,
            _ => self.mint_token(u, rng).await,
        }
    }

    /// The credential an upload of user `u` goes with: now and then a
    /// minted one (revoked ones too); `None`: the user's first key.
    pub(super) fn credential(&self, u: usize, rng: &mut StdRng) -> Option<Cred> {
        if !rng.random_bool(0.3) {
            return None;
        }
        let creds = self.users[u].creds.lock().unwrap();
        let newest = &creds[creds.len().saturating_sub(CREDS_KEPT)..];
        newest.choose(rng).cloned()
    }

    async fn admin(&self, req: reqwest::RequestBuilder) -> (Answer, serde_json::Value) {
        self.send_as(ADMIN_KEY, req).await
    }

    async fn mint_key(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let name = format!("key{}", self.next_name());
        let base = self.base(rng);
        let body = json!({ "name": name });
        let invoked = Instant::now();
        // The admin's, or the user's own with their first key.
        let (answer, res) = if rng.random_bool(0.5) {
            let path = format!("/v1/admin/users/{}/keys", user.id);
            self.admin(self.client.post(format!("{base}{path}")).json(&body))
                .await
        } else {
            let req = self.client.post(format!("{base}/v1/me/keys")).json(&body);
            self.send(user, req).await
        };
        let key_id = res["id"].as_str().map(str::to_owned);
        if let (Answer::Ok, Some(id), Some(secret)) = (&answer, &key_id, res["api_key"].as_str()) {
            user.creds.lock().unwrap().push(Cred {
                name: name.clone(),
                secret: secret.to_owned(),
                key_id: Some(id.clone()),
                token: false,
            });
        }
        let op = Op::MintKey { user: u, name };
        self.record(op, invoked, answer, None);
    }

    /// A token with `files:write`, minted with a minted key of the user's
    /// (one that may have been revoked, too) or their first one.
    async fn mint_token(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let parent = self.credential(u, rng).filter(|c| !c.token);
        let name = format!("token{}", self.next_name());
        let base = self.base(rng);
        let req = (self.client)
            .post(format!("{base}/v1/tokens"))
            .json(&json!({"scopes": ["files:write"], "expires_in": TOKEN_SECS}));
        let invoked = Instant::now();
        let (answer, res) = match &parent {
            Some(p) => self.send_as(&p.secret, req).await,
            None => self.send(user, req).await,
        };
        if let (Answer::Ok, Some(secret)) = (&answer, res["token"].as_str()) {
            user.creds.lock().unwrap().push(Cred {
                name: name.clone(),
                secret: secret.to_owned(),
                key_id: parent.as_ref().and_then(|p| p.key_id.clone()),
                token: true,
            });
        }
        let op = Op::MintToken {
            user: u,
            name,
            parent: parent.map(|p| p.name),
        };
        self.record(op, invoked, answer, None);
    }

    /// Revokes a minted key of the user's (theirs or the admin's call); it
    /// stays among the credentials uploads pick, to be refused.
    async fn revoke_key(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let key = {
            let creds = user.creds.lock().unwrap();
            let keys: Vec<&Cred> = creds.iter().filter(|c| !c.token).collect();
            keys.choose(rng).map(|c| (*c).clone())
        };
        let Some(Cred {
            name,
            key_id: Some(key_id),
            ..
        }) = key
        else {
            return;
        };
        let base = self.base(rng);
        let invoked = Instant::now();
        let (answer, _) = if rng.random_bool(0.5) {
            let req = (self.client).delete(format!("{base}/v1/me/keys/{key_id}"));
            self.send(user, req).await
        } else {
            let path = format!("/v1/admin/users/{}/keys/{key_id}", user.id);
            self.admin(self.client.delete(format!("{base}{path}")))
                .await
        };
        let op = Op::RevokeKey { user: u, name };
        self.record(op, invoked, answer, None);
    }

    /// Sets the user's quota: the default again, far above anything they
    /// hold, or under a kilobyte (every upload past it must be refused).
    async fn set_quota(&self, u: usize, rng: &mut StdRng) {
        let n = self.next_name() as u64;
        let quota = match rng.random_range(0..3) {
            0 => None,
            1 => Some((1 << 30) + n),
            _ => Some(n % 1000),
        };
        let base = self.base(rng);
        let req = (self.client)
            .patch(format!("{base}/v1/admin/users/{}", self.users[u].id))
            .json(&json!({ "quota_bytes": quota }));
        let invoked = Instant::now();
        let (answer, _) = self.admin(req).await;
        self.record(Op::SetQuota { user: u, quota }, invoked, answer, None);
    }

    /// Deletes user `u` (the admin's `DELETE`), sent again until it is
    /// answered: 202 (the deletion began), or 404 (an earlier try's
    /// deletion has already ended). Every try is in the history.
    pub async fn delete_user(&self, u: usize) {
        let deadline = Instant::now() + DELETE_USER_FOR;
        for attempt in 0.. {
            let base = &self.bases[attempt % self.bases.len()];
            let path = format!("{base}/v1/admin/users/{}", self.users[u].id);
            let invoked = Instant::now();
            let (answer, _) = self.admin(self.client.delete(&path)).await;
            let settled = matches!(&answer, Answer::Ok)
                || matches!(&answer, Answer::Failed(c) if c == "not_found");
            self.record(Op::DeleteUser { user: u }, invoked, answer, None);
            if settled || Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
