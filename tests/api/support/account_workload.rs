//! The fault suite's account writes (issue 25): the admin (or the user)
//! mints the user another key, a client mints a token with one of the user's keys, a key
//! is revoked (by its user or the admin), the admin changes a user's quota;
//! and uploads go now and then with a minted key or token instead of the
//! user's first key (`Op::Upload`'s `via`), revoked ones among them, which
//! must be refused once the revocation is acknowledged and the auth cache
//! has forgotten it. Keys and tokens are minted with minted keys too,
//! revoked ones among them, and now and then a key's revocation is raced
//! by its mints on an instance that still trusts it (`race_revocation`).
//! One user is deleted mid-run (`delete_user`). The checker's side is
//! `accounts.rs` and `mints.rs`.

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

/// Who mints a key.
enum Minter {
    Admin,
    /// The user, with their first key.
    FirstKey,
    /// The user, with a key minted before (maybe revoked since).
    Key(Cred),
}

impl World {
    /// One account write for user `u`, of a random kind.
    pub(super) async fn account_op(&self, u: usize, rng: &mut StdRng) {
        match rng.random_range(0..12) {
            0..3 => self.mint_key(u, rng).await,
            3..6 => self.mint_token(u, rng).await,
            6..8 => self.revoke_key(u, rng).await,
            8..10 => self.race_revocation(u, rng).await,
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
        self.minted(u, rng, false)
    }

    /// One of the newest credentials minted for user `u` (a key only if
    /// `key`), revoked ones too.
    pub(super) fn minted(&self, u: usize, rng: &mut StdRng, key: bool) -> Option<Cred> {
        let creds = self.users[u].creds.lock().unwrap();
        let creds: Vec<&Cred> = creds.iter().filter(|c| !(key && c.token)).collect();
        let newest = &creds[creds.len().saturating_sub(CREDS_KEPT)..];
        newest.choose(rng).map(|c| (*c).clone())
    }

    async fn admin(&self, req: reqwest::RequestBuilder) -> (Answer, serde_json::Value) {
        self.send_as(ADMIN_KEY, req).await
    }

    /// A key minted by the admin, by the user with their first key, or
    /// with a key minted before (one that may have been revoked: refused).
    async fn mint_key(&self, u: usize, rng: &mut StdRng) {
        let base = self.base(rng);
        match rng.random_range(0..3) {
            0 => self.mint_key_with(u, Minter::Admin, &base).await,
            1 => self.mint_key_with(u, Minter::FirstKey, &base).await,
            _ => match self.minted(u, rng, true) {
                Some(p) => self.mint_key_with(u, Minter::Key(p), &base).await,
                None => self.mint_key_with(u, Minter::FirstKey, &base).await,
            },
        }
    }

    async fn mint_key_with(&self, u: usize, by: Minter, base: &str) {
        let user = &self.users[u];
        let name = format!("key{}", self.next_name());
        let body = json!({ "name": name });
        let invoked = Instant::now();
        let (answer, res) = match &by {
            Minter::Admin => {
                let path = format!("/v1/admin/users/{}/keys", user.id);
                self.admin(self.client.post(format!("{base}{path}")).json(&body))
                    .await
            }
            Minter::FirstKey => {
                let req = self.client.post(format!("{base}/v1/me/keys")).json(&body);
                self.send(user, req).await
            }
            Minter::Key(p) => {
                let req = self.client.post(format!("{base}/v1/me/keys")).json(&body);
                self.send_as(&p.secret, req).await
            }
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
        let parent = match by {
            Minter::Key(p) => Some(p.name),
            _ => None,
        };
        let op = Op::MintKey {
            user: u,
            name,
            parent,
        };
        self.record(op, invoked, answer, None);
    }

    /// A token with `files:write` and `files:read` (links), minted with a minted key of the user's
    /// (one that may have been revoked, too) or their first one.
    async fn mint_token(&self, u: usize, rng: &mut StdRng) {
        let parent = self.credential(u, rng).filter(|c| !c.token);
        let base = self.base(rng);
        self.mint_token_with(u, parent, &base).await;
    }

    async fn mint_token_with(&self, u: usize, parent: Option<Cred>, base: &str) {
        let user = &self.users[u];
        let name = format!("token{}", self.next_name());
        let req = (self.client)
            .post(format!("{base}/v1/tokens"))
            .json(&json!({"scopes": ["files:write", "files:read"], "expires_in": TOKEN_SECS}));
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
        let key = {
            let creds = self.users[u].creds.lock().unwrap();
            let keys: Vec<&Cred> = creds.iter().filter(|c| !c.token).collect();
            keys.choose(rng).map(|c| (*c).clone())
        };
        let Some(key) = key else {
            return;
        };
        let (base, own) = (self.base(rng), rng.random_bool(0.5));
        self.revoke(u, key, &base, own).await;
    }

    /// Revokes `key` at `base`, with the user's first key (`own`) or the admin's.
    pub(super) async fn revoke(&self, u: usize, key: Cred, base: &str, own: bool) {
        let user = &self.users[u];
        let Cred {
            name,
            key_id: Some(key_id),
            ..
        } = key
        else {
            return;
        };
        let invoked = Instant::now();
        let (answer, _) = if own {
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

    /// Issue 42's leak, raced: a minted key mints a token on one instance
    /// (which then remembers the key), is revoked on an instance while it
    /// mints a key or a token on the first, and mints once more there after
    /// the revocation was answered, while that instance may still trust it
    /// (`FILEDOCK_AUTH_CACHE_SECS`). What a revoked key may mint: nothing.
    async fn race_revocation(&self, u: usize, rng: &mut StdRng) {
        let Some(key) = self.minted(u, rng, true) else {
            return self.mint_key(u, rng).await;
        };
        let (minting, revoking) = (self.base(rng), self.base(rng));
        let own = rng.random_bool(0.5);
        let [racing_key, later_key] = [(); 2].map(|_| rng.random_bool(0.5));
        let lag = Duration::from_millis(rng.random_range(0..30));
        self.mint_token_with(u, Some(key.clone()), &minting).await;
        let mint = async {
            tokio::time::sleep(lag).await;
            self.mint_with(u, &key, &minting, racing_key).await
        };
        tokio::join!(self.revoke(u, key.clone(), &revoking, own), mint);
        self.mint_with(u, &key, &minting, later_key).await;
    }

    /// A key (`as_key`) or a token minted with `key` at `base`.
    async fn mint_with(&self, u: usize, key: &Cred, base: &str, as_key: bool) {
        if as_key {
            self.mint_key_with(u, Minter::Key(key.clone()), base).await;
        } else {
            self.mint_token_with(u, Some(key.clone()), base).await;
        }
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
