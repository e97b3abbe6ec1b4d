//! A workload that takes every request path a user (and the admin, for
//! them) can take once, each answer checked, for the `shard_keys` test:
//! accounts and keys, tokens, plain uploads (alone, with an
//! `Idempotency-Key`, and committed as a group), reads, renames, links,
//! resumable uploads (whole, deferred, ended), sessions and agents with
//! their files, MCPs and toolsets, the events, the deletes, the admin's
//! reads, and a user's deletion carried to its end by the sweeper. `mark` names each step, so
//! that a command can be told by the step that sent it.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{
    group_commit::{hold_commit_lock, until_waiting},
    helpers::{ADMIN_KEY, TestApp, TestUser},
    tus::{OCTETS, TUS, content, create, data, head, patch},
    tus_defer::{create_deferred, patch_declaring},
    tus_limits::terminate,
};

/// Runs the workload on `app`; `mark` is told each step as it begins.
pub async fn every_path(app: &TestApp, mark: &(dyn Fn(&str) + Sync)) {
    let admin = TestUser {
        id: String::new(),
        key: ADMIN_KEY.into(),
    };
    mark("health");
    for path in ["/", "/healthz", "/readyz", "/metrics"] {
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    mark("create users");
    let ann = app.create_user("ann").await;
    let bob = app.create_user("bob").await;

    mark("account");
    expect(app.json("GET", "/v1/me", &ann, None).await, StatusCode::OK);
    let user = format!("/v1/admin/users/{}", ann.id);
    expect(
        app.json("GET", user.clone(), &admin, None).await,
        StatusCode::OK,
    );
    let quota = Some(json!({"quota_bytes": 1 << 30}));
    expect(
        app.json("PATCH", user.clone(), &admin, quota).await,
        StatusCode::OK,
    );
    let listed = app.json("GET", "/v1/admin/users", &admin, None).await;
    expect(listed, StatusCode::OK);

    mark("keys");
    let laptop = Some(json!({"name": "laptop"}));
    let key = expect(
        app.json("POST", "/v1/me/keys", &ann, laptop).await,
        StatusCode::CREATED,
    );
    let with_laptop = TestUser {
        id: ann.id.clone(),
        key: key["api_key"].as_str().unwrap().into(),
    };
    expect(
        app.json("GET", "/v1/me/keys", &with_laptop, None).await,
        StatusCode::OK,
    );
    let revoke = format!("/v1/me/keys/{}", key["id"].as_str().unwrap());
    expect(
        app.json("DELETE", revoke, &ann, None).await,
        StatusCode::NO_CONTENT,
    );
    let keys = format!("{user}/keys");
    let spare = Some(json!({"name": "spare"}));
    let spare = expect(
        app.json("POST", keys.clone(), &admin, spare).await,
        StatusCode::CREATED,
    );
    expect(
        app.json("GET", keys.clone(), &admin, None).await,
        StatusCode::OK,
    );
    let revoke = format!("{keys}/{}", spare["id"].as_str().unwrap());
    expect(
        app.json("DELETE", revoke, &admin, None).await,
        StatusCode::NO_CONTENT,
    );

    mark("tokens");
    let scopes =
        json!({"scopes": ["files:read", "files:write", "sessions:write"], "expires_in": 600});
    let token = app.json("POST", "/v1/tokens", &ann, Some(scopes)).await;
    let token = TestUser {
        id: ann.id.clone(),
        key: expect(token, StatusCode::CREATED)["token"]
            .as_str()
            .unwrap()
            .into(),
    };
    expect(
        app.json("GET", "/v1/files", &token, None).await,
        StatusCode::OK,
    );

    mark("plain uploads");
    let plain = id_of(&app.upload_json(&ann, "plain.txt", b"plain".to_vec()).await);
    let multipart = app
        .upload_multipart(&ann, "form.txt", b"form".to_vec())
        .await;
    assert_eq!(multipart.status(), StatusCode::CREATED);
    let keyed = keyed_upload(app, &ann, "first-key", b"keyed").await;
    assert_eq!(
        keyed_upload(app, &ann, "first-key", b"keyed").await,
        keyed,
        "a replay"
    );

    mark("group commit");
    let tus_id = create(app, &ann, 600).await;
    let first = patch(app, &ann, &tus_id, 0, &data(600)[..300]).await;
    assert_eq!(first.status(), StatusCode::NO_CONTENT);
    let held = hold_commit_lock(app, &ann).await;
    let sent = [
        spawn_upload(app, &ann, Some("group-key")),
        spawn_upload(app, &ann, None),
        spawn_patch(app, &ann, &tus_id, 300, data(600)[300..].to_vec()),
    ];
    until_waiting(app, sent.len()).await;
    held.release().await;
    for s in sent {
        assert!(s.await.unwrap().is_success(), "a grouped commit");
    }
    assert_eq!(content(app, &ann, &tus_id).await, data(600));

    mark("file reads");
    expect(
        app.json("GET", "/v1/files", &ann, None).await,
        StatusCode::OK,
    );
    let file = format!("/v1/files/{plain}");
    expect(
        app.json("GET", file.clone(), &ann, None).await,
        StatusCode::OK,
    );
    assert_eq!(app.download(&ann, &plain).await.status(), StatusCode::OK);
    let renamed = Some(json!({"name": "renamed.txt"}));
    expect(
        app.json("PATCH", file.clone(), &ann, renamed).await,
        StatusCode::OK,
    );
    // Another user's read of it: not found, by their own id.
    expect(
        app.json("GET", file.clone(), &bob, None).await,
        StatusCode::NOT_FOUND,
    );

    mark("links");
    let link = Some(json!({"expires_in": 600}));
    let link = app.json("POST", format!("{file}/links"), &ann, link).await;
    let url = expect(link, StatusCode::CREATED)["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        app.client.get(&url).send().await.unwrap().status(),
        StatusCode::OK
    );

    mark("resumable uploads");
    let options = (app.client.request(Method::OPTIONS, app.url("/v1/uploads")))
        .header("tus-resumable", TUS)
        .send();
    assert_eq!(options.await.unwrap().status(), StatusCode::NO_CONTENT);
    let whole = create(app, &ann, 100).await;
    assert_eq!(head(app, &ann, &whole).await, (StatusCode::OK, Some(0)));
    let done = patch(app, &ann, &whole, 0, &data(100)).await;
    assert_eq!(done.status(), StatusCode::NO_CONTENT);
    let deferred = create_deferred(app, &ann).await;
    let part = patch(app, &ann, &deferred, 0, &data(50)[..20]).await;
    assert_eq!(part.status(), StatusCode::NO_CONTENT);
    let declared = patch_declaring(app, &ann, &deferred, 20, 50, &data(50)[20..]).await;
    assert_eq!(declared.status(), StatusCode::NO_CONTENT);
    let ended = create(app, &ann, 100).await;
    assert_eq!(terminate(app, &ann, &ended).await, StatusCode::NO_CONTENT);

    mark("sessions and agents");
    let session = expect(
        app.json("POST", "/v1/sessions", &ann, None).await,
        StatusCode::CREATED,
    );
    let session = format!("/v1/sessions/{}", session["id"].as_str().unwrap());
    let agent = Some(json!({"name": "helper"}));
    let agent = expect(
        app.json("POST", "/v1/agents", &ann, agent).await,
        StatusCode::CREATED,
    );
    let agent = format!("/v1/agents/{}", agent["id"].as_str().unwrap());
    for list in ["/v1/sessions", "/v1/agents"] {
        expect(app.json("GET", list, &ann, None).await, StatusCode::OK);
    }
    for container in [&session, &agent] {
        expect(
            app.json("GET", container.clone(), &ann, None).await,
            StatusCode::OK,
        );
        let files = format!("{container}/files");
        for f in [&plain, &keyed, &plain] {
            let attach = Some(json!({"file_id": f}));
            expect(
                app.json("POST", files.clone(), &ann, attach).await,
                StatusCode::OK,
            );
        }
        expect(
            app.json("DELETE", format!("{files}/{keyed}"), &ann, None)
                .await,
            StatusCode::OK,
        );
    }
    for link in ["mcps/github", "toolsets/search"] {
        let path = format!("{agent}/{link}");
        expect(
            app.json("PUT", path.clone(), &ann, None).await,
            StatusCode::OK,
        );
        expect(
            app.json("DELETE", path.clone(), &ann, None).await,
            StatusCode::OK,
        );
        expect(app.json("PUT", path, &ann, None).await, StatusCode::OK);
    }

    mark("events");
    let page = expect(
        app.json("GET", "/v1/events", &ann, None).await,
        StatusCode::OK,
    );
    let after = format!(
        "/v1/events?after={}&wait=1",
        page["cursor"].as_str().unwrap()
    );
    expect(app.json("GET", after, &ann, None).await, StatusCode::OK);
    expect(
        app.json("GET", "/v1/events", &admin, None).await,
        StatusCode::OK,
    );

    mark("deletes");
    // Attached to the session and the agent: the delete takes it off both.
    expect(
        app.json("DELETE", file, &ann, None).await,
        StatusCode::NO_CONTENT,
    );
    // Made with an `Idempotency-Key`: the delete frees the key.
    let made_with_key = format!("/v1/files/{keyed}");
    expect(
        app.json("DELETE", made_with_key, &ann, None).await,
        StatusCode::NO_CONTENT,
    );
    expect(
        app.json(
            "POST",
            format!("{session}/files"),
            &ann,
            Some(json!({"file_id": tus_id})),
        )
        .await,
        StatusCode::OK,
    );
    // Holding a file: the delete takes itself off the file.
    expect(
        app.json("DELETE", session, &ann, None).await,
        StatusCode::NO_CONTENT,
    );
    expect(
        app.json("DELETE", agent, &ann, None).await,
        StatusCode::NO_CONTENT,
    );

    mark("a user with everything");
    let theirs = keyed_upload(app, &bob, "bobs-key", b"bob's").await;
    let session = expect(
        app.json("POST", "/v1/sessions", &bob, None).await,
        StatusCode::CREATED,
    );
    let attach = Some(json!({"file_id": theirs}));
    let path = format!("/v1/sessions/{}/files", session["id"].as_str().unwrap());
    expect(app.json("POST", path, &bob, attach).await, StatusCode::OK);
    let agent = expect(
        app.json("POST", "/v1/agents", &bob, Some(json!({"name": "b"})))
            .await,
        StatusCode::CREATED,
    );
    let path = format!("/v1/agents/{}/mcps/github", agent["id"].as_str().unwrap());
    expect(app.json("PUT", path, &bob, None).await, StatusCode::OK);
    let open = create(app, &bob, 1000).await;
    let part = patch(app, &bob, &open, 0, &data(1000)[..10]).await;
    assert_eq!(part.status(), StatusCode::NO_CONTENT);
    let mint = json!({"scopes": ["files:read"], "expires_in": 600});
    expect(
        app.json("POST", "/v1/tokens", &bob, Some(mint)).await,
        StatusCode::CREATED,
    );
    expect(
        app.json("POST", "/v1/me/keys", &bob, Some(json!({"name": "k"})))
            .await,
        StatusCode::CREATED,
    );

    mark("admin");
    expect(
        app.json("GET", "/v1/admin/orphans", &admin, None).await,
        StatusCode::OK,
    );
    expect(
        app.json("GET", "/v1/admin/queue", &admin, None).await,
        StatusCode::OK,
    );

    mark("user deletion");
    let theirs = format!("/v1/admin/users/{}", bob.id);
    expect(
        app.json("DELETE", theirs.clone(), &admin, None).await,
        StatusCode::ACCEPTED,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        expect(
            app.json("POST", "/v1/admin/sweep", &admin, None).await,
            StatusCode::OK,
        );
        let (status, _) = app.json("GET", theirs.clone(), &admin, None).await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the deletion ends");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    mark("done");
}

/// The answer's body, once its status is `want`.
fn expect((status, body): (StatusCode, Value), want: StatusCode) -> Value {
    assert_eq!(status, want, "{body}");
    body
}

fn id_of(body: &Value) -> String {
    body["id"].as_str().unwrap().to_owned()
}

/// A plain upload with `Idempotency-Key: key`; the file's id.
async fn keyed_upload(app: &TestApp, user: &TestUser, key: &str, body: &[u8]) -> String {
    let res = app
        .client
        .post(app.url("/v1/files?filename=keyed.txt"))
        .bearer_auth(&user.key)
        .header("idempotency-key", key)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    id_of(&res.json().await.unwrap())
}

/// A plain upload sent in a task of its own (it waits on the commit lock).
fn spawn_upload(
    app: &TestApp,
    user: &TestUser,
    key: Option<&str>,
) -> tokio::task::JoinHandle<StatusCode> {
    let mut req = (app.client.post(app.url("/v1/files?filename=g.bin")))
        .bearer_auth(&user.key)
        .body(b"grouped".to_vec());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    tokio::spawn(async move { req.send().await.unwrap().status() })
}

/// A tus PATCH sent in a task of its own.
fn spawn_patch(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    offset: usize,
    bytes: Vec<u8>,
) -> tokio::task::JoinHandle<StatusCode> {
    let req = (app.client)
        .request(Method::PATCH, app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", offset.to_string())
        .body(bytes);
    tokio::spawn(async move { req.send().await.unwrap().status() })
}
