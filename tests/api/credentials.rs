//! A revoked credential stays revoked (issue 42): a key that another
//! instance still remembers mints neither keys nor tokens once it is
//! revoked; a user holds at most `FILEDOCK_MAX_KEYS_PER_USER` keys and
//! `FILEDOCK_MAX_TOKENS_PER_USER` live tokens, however many mints race; the
//! key lists are paged.

use std::{collections::HashSet, time::Duration};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::keys::{admin, admin_key_for};

/// `user` holding the secret `secret` (a key's or a token's).
fn holding(user: &TestUser, secret: &Value) -> TestUser {
    TestUser {
        id: user.id.clone(),
        key: secret.as_str().expect("a secret").into(),
    }
}

/// The ids of `user`'s keys, as the admin lists them (every page).
async fn key_ids(app: &TestApp, user: &TestUser) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = cursor.map_or(String::new(), |c| format!("&cursor={c}"));
        let path = format!("/v1/admin/users/{}/keys?limit=3{q}", user.id);
        let (status, page) = app.json("GET", path, &admin(), None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let keys = page["keys"].as_array().unwrap();
        assert!(keys.len() <= 3, "a page holds at most its limit");
        ids.extend(keys.iter().map(|k| k["id"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return ids,
        }
    }
}

async fn mint_key(app: &TestApp, by: &TestUser, name: &str) -> (StatusCode, Value) {
    let body = json!({ "name": name });
    app.json("POST", "/v1/me/keys", by, Some(body)).await
}

async fn mint_token(app: &TestApp, by: &TestUser, secs: u64) -> (StatusCode, Value) {
    let body = json!({"scopes": ["files:read"], "expires_in": secs});
    app.json("POST", "/v1/tokens", by, Some(body)).await
}

async fn status_of_me(app: &TestApp, user: &TestUser) -> StatusCode {
    app.json("GET", "/v1/me", user, None).await.0
}

/// The leak the issue found: a revoked key, still remembered by another
/// instance, minted a key that never expires. Now the mint's transaction
/// finds its key gone: 401, and nothing is stored. A token it minted
/// before the revocation dies with it once the window has passed.
#[tokio::test]
async fn a_revoked_key_mints_nothing_on_an_instance_that_still_remembers_it() {
    if !real_backends() {
        // The embedded store is one process's: there is no second instance
        // (its insert's check is tested by the race below).
        return;
    }
    const CACHED_FOR: Duration = Duration::from_secs(2);
    let mut settings = test_settings();
    settings.auth_cache_ttl = CACHED_FOR;
    let first = spawn_app_with(settings.clone()).await;
    let second = spawn_app_with(settings).await;
    let ann = first.create_user("ann").await;
    let leaked = holding(
        &ann,
        &admin_key_for(&first, &ann, "leaked").await["api_key"],
    );
    let (status, before) = mint_token(&second, &leaked, 600).await;
    assert_eq!(status, StatusCode::CREATED, "{before}");
    let before = holding(&ann, &before["token"]);
    // The second instance remembers the key now.
    assert_eq!(status_of_me(&second, &leaked).await, StatusCode::OK);
    let leaked_id = key_ids(&first, &ann).await[1].clone();
    let path = format!("/v1/me/keys/{leaked_id}");
    let (status, _) = first.json("DELETE", path, &ann, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Within the window: the second instance still takes the key...
    assert_eq!(status_of_me(&second, &leaked).await, StatusCode::OK);
    // ...but it mints nothing.
    let (status, body) = mint_key(&second, &leaked, "forever").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated");
    let (status, body) = mint_token(&second, &leaked, 600).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(key_ids(&first, &ann).await.len(), 1, "only ann's first key");

    // Past the window, neither the key nor its earlier token works anywhere.
    tokio::time::sleep(CACHED_FOR + Duration::from_millis(200)).await;
    for app in [&first, &second] {
        assert_eq!(status_of_me(app, &leaked).await, StatusCode::UNAUTHORIZED);
        assert_eq!(status_of_me(app, &before).await, StatusCode::UNAUTHORIZED);
    }
}

/// Mints racing their key's revocation: each answer is the truth. A key
/// or token answered 201 is stored (and the key works: it was minted
/// before the revocation), one answered 401 is not; once the revocation
/// has answered, every mint with the key is refused.
#[tokio::test]
async fn mints_racing_their_keys_revocation_answer_what_was_stored() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let doomed_key = admin_key_for(&app, &ann, "doomed").await;
    let doomed = holding(&ann, &doomed_key["api_key"]);
    let doomed_id = doomed_key["id"].as_str().unwrap().to_owned();
    let mints = join_all((0..24).map(|i| {
        let (app, doomed) = (&app, &doomed);
        async move {
            tokio::time::sleep(Duration::from_millis(i * 3)).await;
            if i % 2 == 0 {
                ("key", mint_key(app, doomed, &format!("k{i}")).await)
            } else {
                ("token", mint_token(app, doomed, 600).await)
            }
        }
    }));
    let revoke = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let path = format!("/v1/me/keys/{doomed_id}");
        app.json("DELETE", path, &ann, None).await.0
    };
    let (mints, revoked) = tokio::join!(mints, revoke);
    assert_eq!(revoked, StatusCode::NO_CONTENT);
    let stored: HashSet<String> = key_ids(&app, &ann).await.into_iter().collect();
    let (mut made, mut refused) = (0, 0);
    for (kind, (status, body)) in &mints {
        match (*kind, *status) {
            ("key", StatusCode::CREATED) => {
                made += 1;
                let id = body["id"].as_str().unwrap();
                assert!(stored.contains(id), "a key answered 201 is stored");
                let minted = holding(&ann, &body["api_key"]);
                assert_eq!(status_of_me(&app, &minted).await, StatusCode::OK);
            }
            ("token", StatusCode::CREATED) => made += 1,
            (_, StatusCode::UNAUTHORIZED) => refused += 1,
            other => panic!("{other:?}: {body}"),
        }
    }
    // ann's first key, the keys answered 201; never the revoked one.
    let keys_made = mints
        .iter()
        .filter(|(k, (s, _))| *k == "key" && *s == StatusCode::CREATED)
        .count();
    assert_eq!(stored.len(), 1 + keys_made, "nothing stored unanswered");
    assert!(!stored.contains(&doomed_id));
    assert_eq!(made + refused, 24);
    // After the revocation: refused, on this instance at once.
    assert_eq!(
        mint_key(&app, &doomed, "late").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        mint_token(&app, &doomed, 60).await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// 20 key mints and 30 token mints at once against caps of 5 keys and 10
/// live tokens: exactly what fits is made (counted in the store), the
/// rest answered 409 with nothing stored; a token that expires frees its
/// place.
#[tokio::test]
async fn concurrent_mints_never_pass_the_caps_on_keys_and_live_tokens() {
    let mut settings = test_settings();
    settings.max_keys_per_user = 5;
    settings.max_tokens_per_user = 10;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let names: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let keys = join_all(names.iter().map(|n| mint_key(&app, &ann, n))).await;
    let count = |answers: &[(StatusCode, Value)], status| {
        answers.iter().filter(|(s, _)| *s == status).count()
    };
    assert_eq!(count(&keys, StatusCode::CREATED), 4, "{keys:?}");
    assert_eq!(count(&keys, StatusCode::CONFLICT), 16);
    assert!(
        keys.iter()
            .filter(|(s, _)| *s == StatusCode::CONFLICT)
            .all(|(_, b)| b["error"]["code"] == "too_many_keys")
    );
    assert_eq!(key_ids(&app, &ann).await.len(), 5, "stored: the cap");
    let (status, body) = app
        .json(
            "POST",
            format!("/v1/admin/users/{}/keys", ann.id),
            &admin(),
            Some(json!({"name": "by the admin"})),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::CONFLICT, &json!("too_many_keys"))
    );

    // Two that expire in a second, then 30 racing for the 8 places left.
    for _ in 0..2 {
        assert_eq!(mint_token(&app, &ann, 1).await.0, StatusCode::CREATED);
    }
    let tokens = join_all((0..30).map(|_| mint_token(&app, &ann, 600))).await;
    assert_eq!(count(&tokens, StatusCode::CREATED), 8, "{tokens:?}");
    assert_eq!(count(&tokens, StatusCode::CONFLICT), 22);
    assert!(
        tokens
            .iter()
            .filter(|(s, _)| *s == StatusCode::CONFLICT)
            .all(|(_, b)| b["error"]["code"] == "too_many_tokens")
    );
    let (status, _) = mint_token(&app, &ann, 600).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Once the two have expired, two more fit (and no third).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let later = join_all((0..3).map(|_| mint_token(&app, &ann, 600))).await;
    assert_eq!(count(&later, StatusCode::CREATED), 2, "{later:?}");
    // Every token answered 201 works.
    for (_, t) in tokens
        .iter()
        .chain(&later)
        .filter(|(s, _)| *s == StatusCode::CREATED)
    {
        assert_eq!(
            status_of_me(&app, &holding(&ann, &t["token"])).await,
            StatusCode::OK
        );
    }
}

/// The key lists page as the file lists do: `limit`, `cursor`,
/// `next_cursor`, oldest first, each key once.
#[tokio::test]
async fn key_lists_are_paged() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    for i in 0..6 {
        assert_eq!(
            mint_key(&app, &ann, &format!("k{i}")).await.0,
            StatusCode::CREATED
        );
    }
    let ids = key_ids(&app, &ann).await;
    assert_eq!(ids.len(), 7);
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "oldest first");
    let (status, page) = app.json("GET", "/v1/me/keys?limit=4", &ann, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["keys"].as_array().unwrap().len(), 4);
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = app
        .json(
            "GET",
            format!("/v1/me/keys?limit=4&cursor={cursor}"),
            &ann,
            None,
        )
        .await;
    assert_eq!(rest["keys"].as_array().unwrap().len(), 3);
    assert!(rest["next_cursor"].is_null());
    let (status, body) = app.json("GET", "/v1/me/keys?limit=0", &ann, None).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("invalid_request"))
    );
}

/// The resend of a key's insert whose answer was lost (it applied) runs
/// after the key was listed and revoked: it must not store the key again.
/// The store keeps a revoked key's id for `REVOKED_KEPT` (then forgets it,
/// so the ids kept do not grow with history) and answers the resend as a
/// duplicate: applied before.
#[tokio::test]
async fn a_resent_key_insert_never_brings_back_a_key_revoked_meanwhile() {
    use filedock::{
        meta::{ApiKeyRecord, KeyMint, MetaError, REVOKED_KEPT},
        vocab::{ApiKeyHash, KeyId},
    };
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let meta = &app.state.ports.meta;
    let record = ApiKeyRecord {
        id: KeyId::new(),
        user_id: ann.user_id(),
        name: "resent".into(),
        hash: ApiKeyHash::from_hex(sha256_hex(b"fdk_resent")),
        created_at: filedock::meta::now(),
    };
    let mint = KeyMint { by: None, max: 100 };
    meta.insert_key(&record, mint).await.unwrap();
    assert!(meta.delete_key(&ann.user_id(), &record.id).await.unwrap());
    let resent = meta.insert_key(&record, mint).await;
    assert!(matches!(resent, Err(MetaError::Duplicate)), "{resent:?}");
    assert!(
        meta.key(&ann.user_id(), &record.id)
            .await
            .unwrap()
            .is_none()
    );
    // Forgotten once REVOKED_KEPT has passed (the sweeper's token pass).
    let later = filedock::meta::now() + REVOKED_KEPT + chrono::Duration::seconds(1);
    meta.delete_expired_tokens(later).await.unwrap();
    meta.insert_key(&record, mint).await.unwrap();
}

/// A leaked key is revocable whatever the lock backend does: in
/// production a Redis outage refuses every write that needs a lock (503),
/// but a revocation only orders itself with the user's commit lock and
/// runs its transaction without it.
#[tokio::test]
async fn a_key_is_revoked_in_production_while_redis_is_down() {
    use crate::support::servers::OwnRedis;
    if !real_backends() {
        return;
    }
    let port = free_port();
    let mut redis = OwnRedis::start(port).await;
    let mut settings = test_settings();
    settings.redis_url = Some(format!("redis://127.0.0.1:{port}/").into());
    settings.env = filedock::config::Environment::Production;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let (status, leaked) = mint_key(&app, &ann, "leaked").await;
    assert_eq!(status, StatusCode::CREATED, "{leaked}");
    let thief = holding(&ann, &leaked["api_key"]);
    assert_eq!(status_of_me(&app, &thief).await, StatusCode::OK);
    redis.stop();
    // Writes that need the lock are refused meanwhile.
    let res = app.upload_raw(&ann, "a", b"1".to_vec()).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let path = format!("/v1/me/keys/{}", leaked["id"].as_str().unwrap());
    let (status, body) = app.json("DELETE", path, &ann, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(status_of_me(&app, &thief).await, StatusCode::UNAUTHORIZED);
    assert_eq!(key_ids(&app, &ann).await.len(), 1, "the first key only");
}

/// A key or token record for `user`, minted by key `by`, expiring at `ends`.
fn token_record(
    user: &TestUser,
    by: filedock::vocab::KeyId,
    ends: chrono::DateTime<chrono::Utc>,
) -> filedock::meta::TokenRecord {
    use filedock::vocab::{ApiKeyHash, KeyId, Scope};
    let id = KeyId::new();
    filedock::meta::TokenRecord {
        id,
        hash: ApiKeyHash::from_hex(sha256_hex(id.to_string().as_bytes())),
        user_id: user.user_id(),
        key_id: by,
        scopes: vec![Scope::FilesRead],
        session_id: None,
        agent_id: None,
        created_at: filedock::meta::now(),
        expires_at: ends,
    }
}

/// The check is the store's, in the inserting transaction (each store):
/// a key or token whose minting key is gone is refused `MinterRevoked`
/// and not stored, whatever the instance that asked remembered.
#[tokio::test]
async fn the_store_refuses_what_a_revoked_key_mints() {
    use filedock::{
        meta::{ApiKeyRecord, KeyMint, MetaError},
        vocab::{ApiKeyHash, KeyId},
    };
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (status, spare) = mint_key(&app, &ann, "spare").await;
    assert_eq!(status, StatusCode::CREATED, "{spare}");
    let spare: KeyId = spare["id"].as_str().unwrap().parse().unwrap();
    let meta = &app.state.ports.meta;
    assert!(meta.delete_key(&ann.user_id(), &spare).await.unwrap());
    let key = ApiKeyRecord {
        id: KeyId::new(),
        user_id: ann.user_id(),
        name: "by a revoked key".into(),
        hash: ApiKeyHash::from_hex(sha256_hex(b"fdk_by_revoked")),
        created_at: filedock::meta::now(),
    };
    let mint = KeyMint {
        by: Some(&spare),
        max: 100,
    };
    let got = meta.insert_key(&key, mint).await;
    assert!(matches!(got, Err(MetaError::MinterRevoked)), "{got:?}");
    assert!(meta.key(&ann.user_id(), &key.id).await.unwrap().is_none());
    let ends = filedock::meta::now() + chrono::Duration::minutes(10);
    let token = token_record(&ann, spare, ends);
    let got = meta.insert_token(&token, 100).await;
    assert!(matches!(got, Err(MetaError::MinterRevoked)), "{got:?}");
    assert!(meta.token_by_hash(&token.hash).await.unwrap().is_none());
}

/// What a user stores is bounded, not only what is live: a mint deletes
/// the user's expired tokens in its transaction, so that a key's
/// revocation and a user's deletion (which delete them in one) stay small
/// however many short-lived tokens a leaked key mints.
#[tokio::test]
async fn a_mint_deletes_the_users_expired_tokens() {
    let mut settings = test_settings();
    settings.max_tokens_per_user = 3;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    for _ in 0..3 {
        assert_eq!(mint_token(&app, &ann, 1).await.0, StatusCode::CREATED);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for _ in 0..3 {
        assert_eq!(mint_token(&app, &ann, 1).await.0, StatusCode::CREATED);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, live) = mint_token(&app, &ann, 600).await;
    assert_eq!(status, StatusCode::CREATED, "{live}");
    // Of the six expired, none is left for the sweeper.
    let later = filedock::meta::now() + chrono::Duration::seconds(1);
    let meta = &app.state.ports.meta;
    assert_eq!(meta.delete_expired_tokens(later).await.unwrap(), 0);
    assert_eq!(
        status_of_me(&app, &holding(&ann, &live["token"])).await,
        StatusCode::OK
    );
}
