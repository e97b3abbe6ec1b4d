//! What the accounts hold at the end (`accounts.rs` checks it): each live
//! user's keys (by name, page by page) and own quota, read through the
//! admin API, what each credential minted for them answers, and
//! everything of a deleted user's still in a store: every document of every
//! collection that names the user, every object whose key does.

use std::collections::{BTreeMap, BTreeSet};

use filedock::http::AppState;
use serde_json::Value;

use crate::{
    helpers::ADMIN_KEY,
    support::{
        readback::documents,
        workload::{Cred, UserWorld},
    },
};

/// One live user's account as read back.
#[derive(Clone, Debug, Default)]
pub struct FinalAccount {
    /// The names of the keys `GET /v1/admin/users/{id}/keys` lists (every page).
    pub keys: BTreeSet<String>,
    /// Names a page listed again (a page boundary that moved, or a key
    /// stored twice).
    pub listed_twice: Vec<String>,
    /// The user's own quota (`None`: the default).
    pub quota: Option<u64>,
    /// Every credential minted for the user with a 201, by name: the
    /// status `GET /v1/me` with it answered at each instance.
    pub probed: BTreeMap<String, Vec<u16>>,
}

/// Small pages, so that the read-back crosses several of them.
const KEYS_PAGE: usize = 4;

async fn admin_get(client: &reqwest::Client, url: String) -> Value {
    let res = client.get(url).bearer_auth(ADMIN_KEY).send().await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    res.json().await.unwrap()
}

/// `user`'s account as the admin reads it, and its credentials tried at
/// every instance of `bases` (the first reads).
pub async fn read_account(bases: &[String], user: &UserWorld) -> FinalAccount {
    let client = reqwest::Client::new();
    let base = &bases[0];
    let mut fin = FinalAccount::default();
    let mut cursor = String::new();
    loop {
        let url = format!(
            "{base}/v1/admin/users/{}/keys?limit={KEYS_PAGE}{cursor}",
            user.id
        );
        let page = admin_get(&client, url).await;
        for k in page["keys"].as_array().unwrap() {
            let name = k["name"].as_str().unwrap().to_owned();
            if !fin.keys.insert(name.clone()) {
                fin.listed_twice.push(name);
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let got = admin_get(&client, format!("{base}/v1/admin/users/{}", user.id)).await;
    fin.quota = match got["quota_is_default"].as_bool() {
        Some(false) => got["quota_bytes"].as_u64(),
        _ => None,
    };
    fin.probed = probe(bases, user).await;
    fin
}

/// What `GET /v1/me` answers, at each instance, with each credential
/// minted for `user` with a 201 (and with their first key, as `""`).
pub async fn probe(bases: &[String], user: &UserWorld) -> BTreeMap<String, Vec<u16>> {
    let client = reqwest::Client::new();
    let mut creds = user.creds.lock().unwrap().clone();
    creds.push(Cred {
        name: String::new(),
        secret: user.key.clone(),
        key_id: None,
        token: false,
    });
    let mut probed = BTreeMap::new();
    for c in creds {
        let mut statuses = Vec::new();
        for base in bases {
            let req = client.get(format!("{base}/v1/me")).bearer_auth(&c.secret);
            statuses.push(req.send().await.map_or(0, |r| r.status().as_u16()));
        }
        probed.insert(c.name, statuses);
    }
    probed
}

/// Everything that still names `user_id`: documents (as `collection: doc`)
/// and objects (their keys). An orphan record whose object is deleted is
/// the log of that deletion, not something of the user's: an upload that
/// was still streaming when the deletion ended, refused at its commit,
/// leaves one. Nor is the `user.deleted` event the deletion keeps, nor a
/// dead letter of it (the receiver failed past the maximum age).
pub async fn leftovers(state: &AppState, user_id: &str) -> Vec<String> {
    let uri = std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap();
    let db = mongodb::Client::with_uri_str(uri)
        .await
        .unwrap()
        .database(&state.settings.mongodb_db);
    let mut left = Vec::new();
    for collection in db.list_collection_names().await.unwrap() {
        for d in documents(&db, &collection).await {
            if collection == "orphan_minio_objects" && d.get_str("status") == Ok("deleted") {
                continue;
            }
            // The one event a deletion keeps (the admin's feed shows it
            // until the retention removes it).
            if collection == "events" && d.get_str("type") == Ok("user.deleted") {
                continue;
            }
            let event = d.get_document("event").ok();
            let letter_of = event.and_then(|e| e.get_str("type").ok());
            if collection == "webhook_dead" && letter_of == Some("user.deleted") {
                continue;
            }
            let text = d.to_string();
            if text.contains(user_id) {
                left.push(format!("{collection}: {text}"));
            }
        }
    }
    let objects = state.ports.blobs.list("").await.unwrap();
    left.extend(
        objects
            .into_iter()
            .filter(|o| o.key.contains(user_id))
            .map(|o| format!("object {}", o.key)),
    );
    left
}
