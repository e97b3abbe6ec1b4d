//! The fault suite's workload: clients that, for several users, upload
//! (small, multipart and medium files; some streamed, so taking the large
//! lock; some with an `Idempotency-Key`, sent again after an unknown
//! outcome; some resumable, in several tus PATCHes: `tus_workload.rs`),
//! rename, delete, attach and detach files, connect and
//! disconnect MCP servers and toolsets, and now and then delete a session
//! or an agent and make a replacement (`container_workload.rs`), recording
//! every request and its
//! answer. A new kind of operation is a row of [`KINDS`], a function below
//! and its effects in the checker.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use rand::{Rng, rngs::StdRng, seq::IndexedRandom};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{
    helpers::*,
    support::{
        cluster::PART_SIZE,
        history::{Answer, Container, Event, Holder, LinkKind, Op},
        precommit_hook::REFUSED_PREFIX,
    },
};

/// The links every client of a user toggles, one per kind and agent.
const SHARED_LINKS: [(LinkKind, &str); 2] = [
    (LinkKind::Mcp, "mcp-shared"),
    (LinkKind::Toolset, "tools-shared"),
];
/// How often an upload whose outcome is unknown is sent again with its key.
const RESENDS: u32 = 3;
/// How often an attach, a detach or a link picks a container deleted
/// before (it must answer 404 and leave nothing behind).
const DEAD_PICK: f64 = 0.05;
/// The largest small category (a declared length past it is medium).
const SMALL_MAX: usize = 10 << 20;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// A key or a token the workload minted for a user.
#[derive(Clone, Debug)]
pub struct Cred {
    pub name: String,
    pub secret: String,
    /// The key's id, or (a token) its key's: `None` for the user's first.
    pub key_id: Option<String>,
    pub token: bool,
}

/// One user of the workload and what its clients know.
pub struct UserWorld {
    pub id: String,
    pub key: String,
    /// The sessions and agents made and not deleted (or maybe deleted).
    sessions: Mutex<Vec<String>>,
    agents: Mutex<Vec<String>>,
    /// Those deleted (or maybe deleted): now and then an attach picks one.
    deleted: Mutex<Vec<Container>>,
    /// Files whose upload was acknowledged (deletes and attaches pick from them).
    files: Mutex<Vec<String>>,
    /// Attaches that were acknowledged (detaches pick from them).
    attached: Mutex<Vec<(Container, String)>>,
    /// Links of their own that clients connected (disconnects pick from them).
    own_links: Mutex<Vec<(String, LinkKind, String)>>,
    /// Keys and tokens minted for the user (`account_workload.rs`).
    pub(super) creds: Mutex<Vec<Cred>>,
}

impl UserWorld {
    pub fn new(id: String, key: String) -> Self {
        Self {
            id,
            key,
            sessions: Mutex::default(),
            agents: Mutex::default(),
            deleted: Mutex::default(),
            files: Mutex::default(),
            attached: Mutex::default(),
            own_links: Mutex::default(),
            creds: Mutex::default(),
        }
    }

    /// A file whose upload was acknowledged.
    pub(super) fn add_file(&self, id: &str) {
        let mut files = self.files.lock().unwrap();
        if !files.iter().any(|f| f == id) {
            files.push(id.to_owned());
        }
    }

    /// A file whose upload was acknowledged (maybe deleted since).
    pub(super) fn some_file(&self, rng: &mut StdRng) -> Option<String> {
        self.files.lock().unwrap().choose(rng).cloned()
    }

    /// The user's sessions or agents that are not deleted.
    pub(super) fn live(&self, kind: Holder) -> &Mutex<Vec<String>> {
        match kind {
            Holder::Session => &self.sessions,
            Holder::Agent => &self.agents,
        }
    }

    /// A container that was deleted (or maybe was).
    pub(super) fn buried(&self, container: Container) {
        self.deleted.lock().unwrap().push(container);
    }

    /// A session or agent to attach to: now and then a deleted one.
    fn container(&self, rng: &mut StdRng) -> Container {
        let kind = if rng.random_bool(0.5) {
            Holder::Session
        } else {
            Holder::Agent
        };
        self.pick(kind, rng)
    }

    /// An agent to connect on: now and then a deleted one.
    fn agent(&self, rng: &mut StdRng) -> String {
        self.pick(Holder::Agent, rng).id().to_owned()
    }

    fn pick(&self, kind: Holder, rng: &mut StdRng) -> Container {
        let dead: Vec<Container> = (self.deleted.lock().unwrap().iter())
            .filter(|c| c.kind() == kind)
            .cloned()
            .collect();
        let live = self.live(kind).lock().unwrap();
        match dead.choose(rng) {
            Some(c) if live.is_empty() || rng.random_bool(DEAD_PICK) => c.clone(),
            _ => kind.with(live.choose(rng).expect("a container").clone()),
        }
    }
}

/// What the workload shares: the instances, the users and the history.
pub struct World {
    pub bases: Vec<String>,
    pub users: Vec<UserWorld>,
    pub history: Mutex<Vec<Event>>,
    /// Numbers names (of uploads, renames, links) so each is unique.
    names: AtomicUsize,
    pub(super) client: reqwest::Client,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Upload,
    /// A resumable (tus) upload: `tus_workload.rs`.
    Tus,
    Rename,
    Delete,
    Attach,
    Detach,
    SharedLink,
    OwnLink,
    OwnUnlink,
    /// Deletes a session or an agent and makes a replacement.
    DeleteContainer,
    /// Keys, tokens and quotas: `account_workload.rs`.
    Account,
    /// A signed link made with a minted credential: `signed_links.rs`.
    SignedLink,
}

/// The operation kinds and their weights.
const KINDS: [(Kind, u32); 12] = [
    (Kind::Upload, 32),
    (Kind::Tus, 8),
    (Kind::Rename, 6),
    (Kind::Delete, 10),
    (Kind::Attach, 16),
    (Kind::Detach, 7),
    (Kind::SharedLink, 12),
    (Kind::OwnLink, 10),
    (Kind::OwnUnlink, 7),
    (Kind::DeleteContainer, 3),
    (Kind::Account, 4),
    (Kind::SignedLink, 3),
];

/// A request to send: method, path, and its body.
struct Request {
    method: Method,
    path: String,
    json: Option<Value>,
}

impl World {
    pub fn new(bases: Vec<String>, users: Vec<UserWorld>) -> Self {
        Self {
            bases,
            users,
            history: Mutex::default(),
            names: AtomicUsize::new(0),
            client: reqwest::Client::new(),
        }
    }

    pub(super) fn next_name(&self) -> usize {
        self.names.fetch_add(1, Ordering::SeqCst)
    }

    pub(super) fn record(&self, op: Op, invoked: Instant, answer: Answer, file_id: Option<String>) {
        self.history.lock().unwrap().push(Event {
            op,
            invoked,
            completed: Instant::now(),
            answer,
            file_id,
        });
    }

    /// Sends one request with the user's first key and classifies the answer.
    pub(super) async fn send(
        &self,
        user: &UserWorld,
        req: reqwest::RequestBuilder,
    ) -> (Answer, Value) {
        self.send_as(&user.key, req).await
    }

    /// Sends one request with `secret` and classifies the answer.
    pub(super) async fn send_as(
        &self,
        secret: &str,
        req: reqwest::RequestBuilder,
    ) -> (Answer, Value) {
        match req
            .bearer_auth(secret)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
        {
            // No answer (a dropped connection, a killed instance): unknown.
            Err(_) => (Answer::Unknown("transport".into()), Value::Null),
            Ok(res) => {
                let status = res.status();
                let body: Value = res.json().await.unwrap_or(Value::Null);
                let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
                let code = if code.is_empty() {
                    status.to_string()
                } else {
                    code
                };
                let answer = if status.is_success() {
                    Answer::Ok
                } else if status == StatusCode::INTERNAL_SERVER_ERROR {
                    Answer::Internal(code)
                } else if status == StatusCode::GATEWAY_TIMEOUT || code == "outcome_unknown" {
                    Answer::Unknown(code)
                } else {
                    Answer::Failed(code)
                };
                (answer, body)
            }
        }
    }

    pub(super) fn base(&self, rng: &mut StdRng) -> String {
        self.bases.choose(rng).unwrap().clone()
    }

    /// One operation of a random kind, for `user` or (`None`) a random one.
    pub async fn one_op(&self, rng: &mut StdRng, user: Option<usize>) {
        let u = user.unwrap_or_else(|| rng.random_range(0..self.users.len()));
        let total: u32 = KINDS.iter().map(|(_, w)| w).sum();
        let mut pick = rng.random_range(0..total);
        let kind = KINDS
            .iter()
            .find(|(_, w)| {
                let here = pick < *w;
                pick = pick.saturating_sub(*w);
                here
            })
            .map_or(Kind::Upload, |(k, _)| *k);
        let user = &self.users[u];
        let known = user.files.lock().unwrap().clone();
        let file = known.choose(rng).cloned();
        let (op, req) = match (kind, file) {
            (Kind::Upload, _) | (Kind::Rename | Kind::Delete | Kind::Attach, None) => {
                return self.upload(u, rng).await;
            }
            (Kind::Tus, _) => return self.tus_uploads(u, rng).await,
            (Kind::DeleteContainer, _) => return self.delete_container(u, rng).await,
            (Kind::Account, _) => return self.account_op(u, rng).await,
            (Kind::SignedLink, _) => return self.make_link(u, rng).await,
            (Kind::Rename, Some(file_id)) => {
                let name = format!("r{}.bin", self.next_name());
                let req = Request {
                    method: Method::PATCH,
                    path: format!("/v1/files/{file_id}"),
                    json: Some(json!({ "name": name })),
                };
                (
                    Op::Rename {
                        user: u,
                        file_id,
                        name,
                    },
                    req,
                )
            }
            (Kind::Delete, Some(file_id)) => {
                let req = Request {
                    method: Method::DELETE,
                    path: format!("/v1/files/{file_id}"),
                    json: None,
                };
                (Op::Delete { user: u, file_id }, req)
            }
            (Kind::Attach, Some(file_id)) => {
                let container = user.container(rng);
                let req = Request {
                    method: Method::POST,
                    path: format!("{}/files", container.path()),
                    json: Some(json!({ "file_id": file_id })),
                };
                (
                    Op::Attach {
                        user: u,
                        container,
                        file_id,
                    },
                    req,
                )
            }
            (Kind::Detach, _) => {
                let attached = user.attached.lock().unwrap().clone();
                let Some((container, file_id)) = attached.choose(rng).cloned() else {
                    return;
                };
                let req = Request {
                    method: Method::DELETE,
                    path: format!("{}/files/{file_id}", container.path()),
                    json: None,
                };
                (
                    Op::Detach {
                        user: u,
                        container,
                        file_id,
                    },
                    req,
                )
            }
            (Kind::SharedLink, _) => {
                let agent = user.agent(rng);
                let (kind, link) = *SHARED_LINKS.choose(rng).unwrap();
                self.link_op(u, agent, kind, link.to_owned(), rng.random_bool(0.5))
            }
            (Kind::OwnLink, _) => {
                let agent = user.agent(rng);
                let kind = SHARED_LINKS.choose(rng).unwrap().0;
                let link = format!("own{}", self.next_name());
                self.link_op(u, agent, kind, link, true)
            }
            (Kind::OwnUnlink, _) => {
                let mut own = user.own_links.lock().unwrap();
                if own.is_empty() {
                    return;
                }
                let i = rng.random_range(0..own.len());
                let (agent, kind, link) = own.swap_remove(i);
                drop(own);
                self.link_op(u, agent, kind, link, false)
            }
        };
        let base = self.base(rng);
        let mut builder = self
            .client
            .request(req.method, format!("{base}{}", req.path));
        if let Some(j) = req.json {
            builder = builder.json(&j);
        }
        let invoked = Instant::now();
        let (answer, _) = self.send(user, builder).await;
        if answer == Answer::Ok {
            match &op {
                Op::Attach {
                    container, file_id, ..
                } => {
                    user.attached
                        .lock()
                        .unwrap()
                        .push((container.clone(), file_id.clone()));
                }
                Op::Link {
                    agent,
                    kind,
                    link,
                    connect: true,
                    ..
                } if link.starts_with("own") => {
                    let own = (agent.clone(), *kind, link.clone());
                    user.own_links.lock().unwrap().push(own);
                }
                _ => {}
            }
        }
        self.record(op, invoked, answer, None);
    }

    fn link_op(
        &self,
        u: usize,
        agent: String,
        kind: LinkKind,
        link: String,
        connect: bool,
    ) -> (Op, Request) {
        let req = Request {
            method: if connect { Method::PUT } else { Method::DELETE },
            path: format!("/v1/agents/{agent}/{}/{link}", kind.segment()),
            json: None,
        };
        (
            Op::Link {
                user: u,
                agent,
                kind,
                link,
                connect,
            },
            req,
        )
    }

    /// One upload, of a size that may cross the S3 part size or the small
    /// category, declared or streamed; with a key (half of them), sent
    /// again while its outcome is unknown.
    async fn upload(&self, u: usize, rng: &mut StdRng) {
        let user = &self.users[u];
        let n = self.next_name();
        let size = match rng.random_range(0..100) {
            0..4 => PART_SIZE + rng.random_range(1..PART_SIZE / 2), // multipart, small
            4..7 => SMALL_MAX + rng.random_range(1..PART_SIZE / 2), // multipart, medium
            _ => rng.random_range(0..16_384),
        };
        // Without a length the category is large (a stream may be any size).
        let streamed = rng.random_bool(0.15);
        let body = Bytes::from(pseudo_random_bytes(size, n as u64));
        // One in twenty is refused by the pre-commit hook (422: nothing of
        // it may be left, nor acknowledged).
        let name = match rng.random_range(0..20) {
            0 => format!("{REFUSED_PREFIX}{n}.bin"),
            _ => format!("u{n}.bin"),
        };
        let sha256 = sha256_hex(&body);
        let key = rng.random_bool(0.5).then(|| format!("k{n}"));
        // A minted key or token (only without an `Idempotency-Key`: resends
        // go with the key the first try went with).
        let via = key.is_none().then(|| self.credential(u, rng)).flatten();
        let secret = via.as_ref().map_or(&user.key, |c| &c.secret);
        for attempt in 0..=RESENDS {
            let base = self.base(rng);
            let mut req = self
                .client
                .post(format!("{base}/v1/files?filename={name}"))
                .header("content-type", "application/octet-stream");
            req = if streamed {
                let chunks: Vec<Result<Bytes, std::io::Error>> = body
                    .chunks(256 << 10)
                    .map(|c| Ok(body.slice_ref(c)))
                    .collect();
                req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            } else {
                req.body(body.clone())
            };
            if let Some(k) = &key {
                req = req.header("idempotency-key", k);
            }
            let invoked = Instant::now();
            let (answer, res) = self.send_as(secret, req).await;
            let id = res["id"].as_str().map(str::to_owned);
            if let (Answer::Ok, Some(id)) = (&answer, &id) {
                user.add_file(id);
            }
            let again = key.is_some()
                && (matches!(&answer, Answer::Unknown(_))
                    || matches!(&answer, Answer::Failed(c) if c == "idempotency_key_in_flight"));
            let op = Op::Upload {
                user: u,
                name: name.clone(),
                sha256: sha256.clone(),
                size: size as u64,
                key: key.clone(),
                attempt,
                resumable: false,
                via: via.as_ref().map(|c| c.name.clone()),
            };
            self.record(op, invoked, answer, id);
            if !again {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300 * u64::from(attempt + 1))).await;
        }
    }
}
