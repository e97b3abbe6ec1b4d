//! A completed resumable upload stays answerable until it expires (issue
//! 20, item 3): `HEAD` says 200 with `Upload-Offset` = `Upload-Length` and
//! the file's id in `Filedock-File-Id`, a PATCH at the end offset is 204,
//! so that a client whose final PATCH lost its answer (tus-js-client asks
//! `HEAD`) finishes instead of uploading a second copy; the sweep after
//! expiry forgets it. On the embedded adapters and
//! (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::time::Duration;

use filedock::domain::sweeper::Outcome;
use reqwest::{Method, Response, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::{
    helpers::*,
    support::{fault_proxy::FaultProxy, readback::settled},
    tus::{OCTETS, TUS, content, create, data, patch, staging_left},
    tus_reserve::expire_and_sweep,
};

/// The header that names a completed upload's file.
const FILE_ID: &str = "filedock-file-id";
/// What the proxy cuts after.
const MARKER: &[u8] = b"\xfe\xedLAST-BYTES\xfa\xce";

async fn head_res(app: &TestApp, user: &TestUser, id: &str) -> Response {
    app.client
        .request(Method::HEAD, app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap()
}

/// `HEAD` until the PATCH whose answer was lost has let go of the upload.
async fn head_settled(app: &TestApp, user: &TestUser, id: &str) -> Response {
    for _ in 0..100 {
        let res = head_res(app, user, id).await;
        if res.status() != StatusCode::LOCKED {
            return res;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the upload stayed locked");
}

fn header<'a>(res: &'a Response, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_completed_upload_answers_head_and_a_patch_at_its_end() {
    let app = spawn_app().await;
    let user = app.create_user("completed").await;
    let bytes = data(300);
    let id = create(&app, &user, 300).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..100]).await.status(),
        StatusCode::NO_CONTENT
    );
    let last = patch(&app, &user, &id, 100, &bytes[100..]).await;
    assert_eq!(last.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&last, FILE_ID), Some(id.as_str()), "the final PATCH");

    let res = head_res(&app, &user, &id).await;
    assert_eq!(res.status(), StatusCode::OK, "HEAD of a completed upload");
    assert_eq!(header(&res, "upload-offset"), Some("300"));
    assert_eq!(header(&res, "upload-length"), Some("300"));
    assert_eq!(header(&res, FILE_ID), Some(id.as_str()));
    // A PATCH at the end offset (a retried final PATCH) changes nothing.
    let again = patch(&app, &user, &id, 300, &[]).await;
    assert_eq!(again.status(), StatusCode::NO_CONTENT, "PATCH at the end");
    assert_eq!(header(&again, "upload-offset"), Some("300"));
    assert_eq!(header(&again, FILE_ID), Some(id.as_str()));
    // From any other offset it is told it is out of step.
    let early = patch(&app, &user, &id, 100, &bytes[100..]).await;
    assert_eq!(early.status(), StatusCode::CONFLICT);

    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(app.list_ids(&user).await, vec![id.clone()], "one file");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

/// What tus-js-client does when its final PATCH's answer is lost: `HEAD`,
/// and on 404 create a new upload and send the whole file again. The
/// upload must say it is complete, so that one file results, not two.
#[tokio::test]
async fn a_final_patch_whose_answer_was_lost_is_found_complete_by_head() {
    let app = spawn_app().await;
    let user = app.create_user("lost-answer").await;
    let len = 6 << 20;
    let mut bytes = data(len);
    // The proxy cuts once it has forwarded these (the body's last bytes)
    // and the server has begun to answer.
    bytes[len - MARKER.len()..].copy_from_slice(MARKER);
    let id = create(&app, &user, len).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..len / 2]).await.status(),
        StatusCode::NO_CONTENT
    );
    // The final PATCH goes through a proxy that cuts the connection as the
    // server's answer starts to arrive: committed, the answer never read.
    let upstream = app.base.trim_start_matches("http://").parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    proxy.cut_after(MARKER, Duration::from_millis(100));
    let base = format!("http://{}", proxy.addr());
    let sent = app
        .client
        .patch(format!("{base}/v1/uploads/{id}"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", (len / 2).to_string())
        .body(bytes[len / 2..].to_vec())
        .send()
        .await;
    assert!(proxy.triggered(), "the answer was not cut");
    assert!(
        sent.is_err(),
        "the answer arrived: {:?}",
        sent.map(|r| r.status())
    );

    let res = head_settled(&app, &user, &id).await;
    assert_eq!(res.status(), StatusCode::OK, "HEAD after the lost answer");
    assert_eq!(
        header(&res, "upload-offset"),
        Some(len.to_string().as_str())
    );
    assert_eq!(header(&res, FILE_ID), Some(id.as_str()));
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(
        app.list_ids(&user).await,
        vec![id.clone()],
        "one file, not two"
    );
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
}

/// The same over a raw socket: the client sends the whole final PATCH and
/// closes without reading; the server still finishes it.
#[tokio::test]
async fn a_final_patch_sent_by_a_client_that_left_completes_the_upload() {
    let app = spawn_app().await;
    let user = app.create_user("left").await;
    let bytes = data(200);
    let id = create(&app, &user, 200).await;
    let addr = app.base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PATCH /v1/uploads/{id} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\n\
         tus-resumable: {TUS}\r\ncontent-type: {OCTETS}\r\nupload-offset: 0\r\n\
         content-length: 200\r\n\r\n",
        user.key
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&bytes).await.unwrap();
    socket.shutdown().await.unwrap();
    drop(socket);

    // Time for the server to read the body (a HEAD sooner would ask the
    // PATCH to stop and store what it had: tus_release.rs).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let res = head_settled(&app, &user, &id).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "upload-offset"), Some("200"));
    assert_eq!(header(&res, FILE_ID), Some(id.as_str()));
    assert_eq!(app.list_ids(&user).await, vec![id.clone()]);
}

#[tokio::test]
async fn a_completed_upload_is_forgotten_when_it_expires_and_its_file_stays() {
    let app = spawn_app().await;
    let user = app.create_user("completed-expiry").await;
    let bytes = data(100);
    let id = create(&app, &user, 100).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes).await.status(),
        StatusCode::NO_CONTENT
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(report.resumables_expired, 0, "not expired yet");
    assert_eq!(head_res(&app, &user, &id).await.status(), StatusCode::OK);

    // Expire it, as if FILEDOCK_TUS_EXPIRY_SECS had passed.
    let meta = &app.state.ports.meta;
    let mut upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(upload.committed, "the record says the file is committed");
    upload.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    assert_eq!(
        head_res(&app, &user, &id).await.status(),
        StatusCode::NOT_FOUND
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(
        (report.resumables_expired, report.orphans_deleted),
        (1, 0),
        "the record goes, the file's blob does not"
    );
    assert!(
        meta.resumable_by_id_alone(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(content(&app, &user, &id).await == bytes, "the file stays");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
}

#[tokio::test]
async fn a_completed_upload_whose_file_was_deleted_is_gone() {
    let app = spawn_app().await;
    let user = app.create_user("completed-deleted").await;
    let id = create(&app, &user, 50).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &data(50)).await.status(),
        StatusCode::NO_CONTENT
    );
    let del = app
        .client
        .delete(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        head_res(&app, &user, &id).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        patch(&app, &user, &id, 50, &[]).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
}

/// The fault suite's final sweeps wait until `settled`, which waits for a
/// committed upload's state (kept, with no intent, until its expiry): a
/// commit that lands after its client gave up leaves one that the first
/// final pass does not see expired, and a check then would count it as
/// left half-done.
#[tokio::test]
async fn settled_waits_for_a_committed_upload_s_state_to_expire() {
    let app = spawn_app().await;
    let user = app.create_user("settled").await;
    let id = create(&app, &user, 10).await;
    assert!(!settled(&app.state).await, "an open upload's intent");
    assert_eq!(
        patch(&app, &user, &id, 0, &data(10)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.intents().await, 0, "the commit took the intent");
    assert!(!settled(&app.state).await, "the committed state is kept");

    expire_and_sweep(&app, &id).await;
    assert!(settled(&app.state).await, "swept at its expiry");
}
