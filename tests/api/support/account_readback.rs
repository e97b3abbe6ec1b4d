//! What the accounts hold at the end (`accounts.rs` checks it): each live
//! user's keys (by name) and own quota, read through the admin API, and
//! everything of a deleted user's still in a store: every document of every
//! collection that names the user, every object whose key does.

use std::collections::BTreeSet;

use filedock::http::AppState;
use serde_json::Value;

use crate::{helpers::ADMIN_KEY, support::readback::documents};

/// One live user's account as read back.
#[derive(Clone, Debug, Default)]
pub struct FinalAccount {
    /// The names of the keys `GET /v1/admin/users/{id}/keys` lists.
    pub keys: BTreeSet<String>,
    /// The user's own quota (`None`: the default).
    pub quota: Option<u64>,
}

async fn admin_get(client: &reqwest::Client, url: String) -> Value {
    let res = client.get(url).bearer_auth(ADMIN_KEY).send().await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    res.json().await.unwrap()
}

pub async fn read_account(base: &str, user_id: &str) -> FinalAccount {
    let client = reqwest::Client::new();
    let keys = admin_get(&client, format!("{base}/v1/admin/users/{user_id}/keys")).await;
    let user = admin_get(&client, format!("{base}/v1/admin/users/{user_id}")).await;
    FinalAccount {
        keys: (keys["keys"].as_array().unwrap().iter())
            .map(|k| k["name"].as_str().unwrap().to_owned())
            .collect(),
        quota: match user["quota_is_default"].as_bool() {
            Some(false) => user["quota_bytes"].as_u64(),
            _ => None,
        },
    }
}

/// Everything that still names `user_id`: documents (as `collection: doc`)
/// and objects (their keys). An orphan record whose object is deleted is
/// the log of that deletion, not something of the user's: an upload that
/// was still streaming when the deletion ended, refused at its commit,
/// leaves one.
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
