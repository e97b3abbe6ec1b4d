//! A webhook receiver in the test process: it verifies every request with
//! the `standardwebhooks` crate (a Standard Webhooks verifier, never
//! filedock's own signing code), records it, and answers as told at run
//! time: 2xx, 500 (to everyone, to some owners, or to some events), slowly
//! (to everyone, or to some owners), or not at all ("down": nothing listens on its port, so connections are
//! refused, until it is "up" again on the same port).
//!
//! A request is recorded as it arrives, with the answer decided for it
//! then and the connection's peer (the sender's address and port); its
//! `answered` is set only once the answer is handed to hyper to write,
//! just before the handler returns it (after a slow answer's delay). A
//! request whose handler was dropped first (the receiver went down, the
//! sender dropped the connection) stays unanswered. So
//! [`WebhookReceiver::accepted`] is every delivery whose 2xx was sent: a
//! 2xx decided but never sent does not count as delivered, which is what
//! the at-least-once and order checks ([`check_order`]) are about.
//!
//! A request that fails verification is still answered by the behaviour
//! (so a signing bug is reported by the checks, not hidden as retries).
//!
//! As the pre-commit hook (`FILEDOCK_PRECOMMIT_HOOK_URL`), it may also
//! answer chosen requests, by their body's `data.filename`, with a status
//! and a body of its own ([`Reply`]: a JSON `{"reason": …}`, plain text, or
//! nothing) — [`WebhookReceiver::reply_to_filenames`] — and, as a hook
//! that checks the bytes, read its `data.read_url` before answering
//! ([`WebhookReceiver::read_urls_first`]; what it read:
//! [`WebhookReceiver::read_during`]).

use std::{
    collections::{HashMap, HashSet, hash_map::Entry},
    fmt::Write as _,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Extension, Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use base64::{Engine, engine::general_purpose::STANDARD};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use serde_json::Value;
use tokio::{net::TcpListener, sync::Notify, task::JoinHandle, task::JoinSet};

/// The status of a refusal.
const FAILURE: StatusCode = StatusCode::INTERNAL_SERVER_ERROR;

/// How the receiver answers (see the setters on [`WebhookReceiver`]).
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// 500 to every request.
    pub fail_all: bool,
    /// 500 to the requests whose `data.owner_id` is one of these.
    pub fail_owners: HashSet<String>,
    /// 500 to the requests whose `webhook-id` is one of these.
    pub fail_ids: HashSet<String>,
    /// Waited before answering (anything).
    pub delay: Duration,
    /// Waited before answering the requests whose `data.owner_id` is one
    /// of these (on top of `delay`).
    pub slow_owners: HashMap<String, Duration>,
    /// The status of an acceptance.
    pub ok: StatusCode,
    /// The answer to the requests whose body's `data.filename` contains
    /// the first of these patterns it contains (unless a 500 above applies
    /// first); the others are answered as the rest of the behaviour says.
    pub replies: Vec<(String, Reply)>,
}

/// An answer of its own, with a body: what a pre-commit hook refusing an
/// upload sends.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: StatusCode,
    /// Its `content-type` (none with an empty body).
    pub content_type: Option<&'static str>,
    pub body: Bytes,
}

impl Reply {
    /// `status` with the JSON body `{"reason": reason}`.
    pub fn reason(status: StatusCode, reason: &str) -> Self {
        Self {
            status,
            content_type: Some("application/json"),
            body: serde_json::to_vec(&serde_json::json!({ "reason": reason }))
                .unwrap()
                .into(),
        }
    }

    /// `status` with `text` as a `text/plain` body.
    pub fn text(status: StatusCode, text: &str) -> Self {
        Self {
            status,
            content_type: Some("text/plain; charset=utf-8"),
            body: Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    /// `status` with an empty body.
    pub fn empty(status: StatusCode) -> Self {
        Self {
            status,
            content_type: None,
            body: Bytes::new(),
        }
    }

    fn into_response(self) -> Response {
        let mut res = (self.status, self.body).into_response();
        match self.content_type {
            Some(t) => {
                res.headers_mut()
                    .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(t));
            }
            None => {
                res.headers_mut().remove(header::CONTENT_TYPE);
            }
        }
        res
    }
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            fail_all: false,
            fail_owners: HashSet::new(),
            fail_ids: HashSet::new(),
            delay: Duration::ZERO,
            slow_owners: HashMap::new(),
            ok: StatusCode::OK,
            replies: Vec::new(),
        }
    }
}

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Its place in the arrival order (0, 1, 2…).
    pub n: usize,
    pub at: Instant,
    /// The connection's peer: the sender's address and (local) port. Each
    /// connection is one sender's (one instance's connection pool).
    pub peer: SocketAddr,
    pub method: String,
    pub path: String,
    /// The `webhook-id` header ("" if missing).
    pub webhook_id: String,
    /// The `webhook-timestamp` header ("" if missing).
    pub webhook_timestamp: String,
    /// The `content-type` header ("" if missing).
    pub content_type: String,
    /// `data.owner_id` of the body.
    pub owner_id: Option<String>,
    /// `data.seq` of the body.
    pub seq: Option<i64>,
    /// `type` of the body.
    pub kind: Option<String>,
    pub body: Bytes,
    /// The body parsed (`None`: not JSON).
    pub json: Option<Value>,
    /// What the `standardwebhooks` verifier said.
    pub verified: Result<(), String>,
    /// The status the receiver decided on (sent only if `answered`).
    pub status: u16,
    /// The answer was handed to hyper to write: set just before the
    /// handler returned it, after any delay. `false` while a slow answer
    /// waits, and for good if its handler was dropped first (the receiver
    /// went down, the sender dropped the connection).
    pub answered: bool,
}

impl Delivery {
    /// Answered 2xx: the 2xx was decided and sent.
    pub fn accepted(&self) -> bool {
        self.answered && (200..300).contains(&self.status)
    }

    /// Answered, not 2xx.
    pub fn refused(&self) -> bool {
        self.answered && !(200..300).contains(&self.status)
    }

    /// The string `data.{field}` of the body, if there is one.
    pub fn data_str(&self, field: &str) -> Option<&str> {
        self.json.as_ref()?["data"][field].as_str()
    }

    /// The number `data.{field}` of the body, if there is one.
    pub fn data_u64(&self, field: &str) -> Option<u64> {
        self.json.as_ref()?["data"][field].as_u64()
    }

    /// `owner_id:seq`, or what was missing.
    fn label(&self) -> String {
        format!(
            "#{} {} ({} {}, {}{}, from {})",
            self.n,
            self.webhook_id,
            self.kind.as_deref().unwrap_or("<no type>"),
            self.seq.map_or("<no seq>".into(), |s| s.to_string()),
            self.status,
            if self.answered { "" } else { " not sent" },
            self.peer
        )
    }
}

struct Shared {
    verifier: standardwebhooks::Webhook,
    behaviour: Mutex<Behaviour>,
    log: Mutex<Vec<Delivery>>,
    /// Woken at each request recorded.
    changed: Notify,
    /// GET each request's `data.read_url` before answering it.
    read_first: AtomicBool,
    /// What those GETs read, by the request's place in the log.
    reads: Mutex<HashMap<usize, Result<Bytes, String>>>,
}

pub struct WebhookReceiver {
    port: u16,
    secret: String,
    shared: Arc<Shared>,
    /// The accept loop while up (it owns the listener and the connections).
    serving: Mutex<Option<JoinHandle<()>>>,
}

/// A fresh `whsec_` secret: base64 of 32 random bytes.
pub fn random_secret() -> String {
    format!("whsec_{}", STANDARD.encode(rand::random::<[u8; 32]>()))
}

impl WebhookReceiver {
    /// Listens on a free loopback port, answering 200, with a random secret.
    pub async fn start() -> Self {
        Self::start_with_secret(random_secret()).await
    }

    /// Listens on a free loopback port, verifying with `secret` (`whsec_…`).
    pub async fn start_with_secret(secret: String) -> Self {
        let verifier = standardwebhooks::Webhook::new(&secret).expect("a whsec_ secret");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            verifier,
            behaviour: Mutex::new(Behaviour::default()),
            log: Mutex::new(Vec::new()),
            changed: Notify::new(),
            read_first: AtomicBool::new(false),
            reads: Mutex::new(HashMap::new()),
        });
        let serving = tokio::spawn(serve(listener, shared.clone()));
        Self {
            port,
            secret,
            shared,
            serving: Mutex::new(Some(serving)),
        }
    }

    /// The URL to give `FILEDOCK_WEBHOOK_URL`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The secret it verifies with (to give `FILEDOCK_WEBHOOK_SECRET`).
    pub fn secret(&self) -> String {
        self.secret.clone()
    }

    // ---- behaviour ----

    /// Answers as `behaviour` says from now on.
    pub fn set(&self, behaviour: Behaviour) {
        *self.shared.behaviour.lock().unwrap() = behaviour;
    }

    /// Answers 200 to everything, at once.
    pub fn answer_ok(&self) {
        self.set(Behaviour::default());
    }

    /// Answers 500 to everything.
    pub fn fail_all(&self) {
        self.set(Behaviour {
            fail_all: true,
            ..Behaviour::default()
        });
    }

    /// Answers 500 to these owners' events, 200 to the others'.
    pub fn fail_owners<S: Into<String>>(&self, owners: impl IntoIterator<Item = S>) {
        self.set(Behaviour {
            fail_owners: owners.into_iter().map(Into::into).collect(),
            ..Behaviour::default()
        });
    }

    /// Answers 500 to these events (by `webhook-id`), 200 to the others.
    pub fn fail_ids<S: Into<String>>(&self, ids: impl IntoIterator<Item = S>) {
        self.set(Behaviour {
            fail_ids: ids.into_iter().map(Into::into).collect(),
            ..Behaviour::default()
        });
    }

    /// Waits `delay` before each answer (then 200).
    pub fn slow(&self, delay: Duration) {
        self.set(Behaviour {
            delay,
            ..Behaviour::default()
        });
    }

    /// Waits `delay` before answering these owners' events (then 200), and
    /// answers the others' at once.
    pub fn slow_owners<S: Into<String>>(
        &self,
        owners: impl IntoIterator<Item = S>,
        delay: Duration,
    ) {
        self.set(Behaviour {
            slow_owners: owners.into_iter().map(|o| (o.into(), delay)).collect(),
            ..Behaviour::default()
        });
    }

    /// Answers the requests whose `data.filename` contains one of the
    /// patterns with its reply (the first pattern that matches), 200 to
    /// the others.
    pub fn reply_to_filenames<S: Into<String>>(
        &self,
        replies: impl IntoIterator<Item = (S, Reply)>,
    ) {
        self.set(Behaviour {
            replies: replies.into_iter().map(|(p, r)| (p.into(), r)).collect(),
            ..Behaviour::default()
        });
    }

    /// From now on, before answering a request whose body has a
    /// `data.read_url`, GETs it (at most 30 s) and records what it read
    /// ([`Self::read_during`]), as a pre-commit hook checking the bytes
    /// does. Kept across the behaviour's changes.
    pub fn read_urls_first(&self) {
        self.shared.read_first.store(true, Ordering::SeqCst);
    }

    /// With [`Self::read_urls_first`], what the `GET` of request `d`'s
    /// `data.read_url` gave before it was answered: the bytes of a 200,
    /// else its status and body, or its error. `None`: not read (not
    /// asked to, no URL, or not yet).
    pub fn read_during(&self, d: &Delivery) -> Option<Result<Bytes, String>> {
        self.shared.reads.lock().unwrap().get(&d.n).cloned()
    }

    /// Stops listening and drops every open connection: connections are
    /// refused until [`Self::up`]. The behaviour is kept.
    pub async fn down(&self) {
        let serving = self.serving.lock().unwrap().take();
        if let Some(task) = serving {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens again on the same port (a no-op if up).
    pub async fn up(&self) {
        if self.is_up() {
            return;
        }
        let addr = format!("127.0.0.1:{}", self.port);
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(&addr).await {
                Ok(l) => break l,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the webhook receiver could not listen on {addr} again: {e}"),
            }
        };
        let task = tokio::spawn(serve(listener, self.shared.clone()));
        *self.serving.lock().unwrap() = Some(task);
    }

    pub fn is_up(&self) -> bool {
        self.serving.lock().unwrap().is_some()
    }

    // ---- what it got ----

    /// Every request, in arrival order.
    pub fn requests(&self) -> Vec<Delivery> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The deliveries whose 2xx answer was sent, in arrival order.
    pub fn accepted(&self) -> Vec<Delivery> {
        self.requests()
            .into_iter()
            .filter(Delivery::accepted)
            .collect()
    }

    /// The requests answered with another status (500), in arrival order.
    pub fn refused(&self) -> Vec<Delivery> {
        self.requests()
            .into_iter()
            .filter(Delivery::refused)
            .collect()
    }

    /// The requests not answered (yet: a slow answer waiting; or ever: cut
    /// by [`Self::down`] or by the sender dropping the connection), in
    /// arrival order.
    pub fn unanswered(&self) -> Vec<Delivery> {
        self.requests()
            .into_iter()
            .filter(|d| !d.answered)
            .collect()
    }

    /// `Err` lists every request that failed verification.
    pub fn all_verified(&self) -> Result<(), String> {
        let bad: Vec<String> = self
            .requests()
            .iter()
            .filter_map(|d| {
                d.verified
                    .as_ref()
                    .err()
                    .map(|e| format!("{} failed verification: {e}", d.label()))
            })
            .collect();
        match bad.is_empty() {
            true => Ok(()),
            false => Err(bad.join("\n")),
        }
    }

    /// Waits until `predicate` holds of every request so far (in arrival
    /// order), at most `timeout`; `Err` says what the receiver had got.
    pub async fn wait_for(
        &self,
        predicate: impl Fn(&[Delivery]) -> bool,
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if predicate(&self.shared.log.lock().unwrap()) {
                return Ok(());
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let log = self.requests();
                    if predicate(&log) {
                        return Ok(());
                    }
                    return Err(format!(
                        "not within {timeout:?}; the receiver got {} requests:\n{}",
                        log.len(),
                        summary(&log)
                    ));
                }
            }
        }
    }

    /// Waits until every event of `expected` (owner → `(seq, event id)`)
    /// was accepted (its 2xx sent) at least once, at most `timeout`.
    pub async fn wait_accepted(
        &self,
        expected: &HashMap<String, Vec<(i64, String)>>,
        timeout: Duration,
    ) -> Result<(), String> {
        let want: HashSet<&str> = expected
            .values()
            .flatten()
            .map(|(_, id)| id.as_str())
            .collect();
        let all_in = |log: &[Delivery]| {
            let got: HashSet<&str> = log
                .iter()
                .filter(|d| d.accepted())
                .map(|d| d.webhook_id.as_str())
                .collect();
            want.is_subset(&got)
        };
        self.wait_for(all_in, timeout).await.map_err(|e| {
            let got: HashSet<String> = self.accepted().into_iter().map(|d| d.webhook_id).collect();
            let mut missing: Vec<&&str> = want.iter().filter(|id| !got.contains(**id)).collect();
            missing.sort();
            format!("events never accepted: {missing:?}\n{e}")
        })
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        if let Some(task) = self.serving.lock().unwrap().take() {
            task.abort();
        }
    }
}

/// One line per request.
pub fn summary(log: &[Delivery]) -> String {
    let mut out = String::new();
    for d in log {
        let verified = match &d.verified {
            Ok(()) => "verified".to_owned(),
            Err(e) => format!("NOT VERIFIED: {e}"),
        };
        let _ = writeln!(out, "  {} {verified}", d.label());
    }
    out
}

/// The checks of what a receiver accepted (`accepted`, in arrival order)
/// against the events it should have got (`expected`: owner → their
/// events' `(seq, id)`, in sequence order):
/// - every expected event was accepted at least once, under its id;
/// - per owner, the first acceptance of each event comes in strictly
///   increasing sequence order (so with no gap against `expected`: an
///   event accepted after a later one of its owner is out of order);
/// - each acceptance's `webhook-id` is its body's `owner_id:seq`, and a
///   duplicate has the same `webhook-id` and an identical body;
/// - every acceptance verified.
///
/// Events accepted that `expected` does not list are allowed (a change
/// whose answer was lost may have happened); [`check_exact`] forbids them.
/// A dead letter replayed (`POST /v1/admin/events/dead/{id}/replay`) comes
/// after its owner's later events by design: leave replays out of
/// `accepted`. Requests that were refused are not looked at: see
/// [`WebhookReceiver::all_verified`] for their signatures.
pub fn check_order(
    accepted: &[Delivery],
    expected: &HashMap<String, Vec<(i64, String)>>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for d in accepted {
        if let Err(e) = &d.verified {
            problems.push(format!("{} failed verification: {e}", d.label()));
        }
        match (&d.owner_id, d.seq) {
            (Some(owner), Some(seq)) if d.webhook_id == format!("{owner}:{seq}") => {}
            (owner, seq) => problems.push(format!(
                "{}: webhook-id is not the body's owner_id:seq ({owner:?}, {seq:?})",
                d.label()
            )),
        }
    }
    // Duplicates: the same id, the same body.
    let mut first: HashMap<&str, &Delivery> = HashMap::new();
    for d in accepted {
        match first.entry(d.webhook_id.as_str()) {
            Entry::Vacant(v) => {
                v.insert(d);
            }
            Entry::Occupied(o) if o.get().body != d.body => problems.push(format!(
                "{} is a duplicate of #{} with another body:\n  {}\n  {}",
                d.label(),
                o.get().n,
                String::from_utf8_lossy(&o.get().body),
                String::from_utf8_lossy(&d.body)
            )),
            Entry::Occupied(_) => {}
        }
    }
    // Each owner's first acceptances, in arrival order.
    let mut firsts: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut seen = HashSet::new();
    for d in accepted {
        if let (Some(owner), Some(seq)) = (&d.owner_id, d.seq)
            && seen.insert(d.webhook_id.as_str())
        {
            firsts.entry(owner.as_str()).or_default().push(seq);
        }
    }
    for (owner, seqs) in &firsts {
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            problems.push(format!(
                "owner {owner}'s events were first accepted out of order: {seqs:?}"
            ));
        }
    }
    for (owner, events) in expected {
        let seqs: Vec<i64> = events.iter().map(|(s, _)| *s).collect();
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            problems.push(format!(
                "the expected events of {owner} are not in sequence order: {seqs:?}"
            ));
        }
        let got: HashSet<i64> = firsts
            .get(owner.as_str())
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let missing: Vec<&(i64, String)> =
            events.iter().filter(|(s, _)| !got.contains(s)).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "owner {owner}: never accepted {missing:?} (accepted first: {:?})",
                firsts.get(owner.as_str())
            ));
        }
        for (seq, id) in events {
            let named = accepted
                .iter()
                .find(|d| d.owner_id.as_deref() == Some(owner) && d.seq == Some(*seq));
            if let Some(d) = named
                && d.webhook_id != *id
            {
                problems.push(format!("{}: expected as webhook-id {id}", d.label()));
            }
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{}\nthe accepted deliveries:\n{}",
            problems.join("\n"),
            summary(accepted)
        )),
    }
}

/// [`check_order`], and nothing accepted that `expected` does not list.
pub fn check_exact(
    accepted: &[Delivery],
    expected: &HashMap<String, Vec<(i64, String)>>,
) -> Result<(), String> {
    check_order(accepted, expected)?;
    let listed: HashSet<&str> = expected
        .values()
        .flatten()
        .map(|(_, id)| id.as_str())
        .collect();
    let extra: Vec<String> = accepted
        .iter()
        .filter(|d| !listed.contains(d.webhook_id.as_str()))
        .map(Delivery::label)
        .collect();
    match extra.is_empty() {
        true => Ok(()),
        false => Err(format!("accepted events not expected: {extra:?}")),
    }
}

/// A `GET` of `url`: the bytes of a 200, else what it was.
async fn read_all(url: &str) -> Result<Bytes, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let res = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = res.status();
    let body = res.bytes().await.map_err(|e| e.to_string())?;
    match status.as_u16() {
        200 => Ok(body),
        other => Err(format!("{other}: {}", String::from_utf8_lossy(&body))),
    }
}

/// Accepts connections until aborted; aborting drops the listener and
/// every connection (their tasks are in the set it owns), and with a
/// connection the handler of its request: HTTP/1 only, so a request's
/// handler runs in its connection's task (HTTP/2 would spawn it apart,
/// and a handler cut off from its connection could still mark its answer
/// sent). hyper also ends a connection, dropping its handler, when the
/// sender closes it while the answer is awaited.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let router = Router::new().fallback(receive).with_state(shared);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let service = TowerToHyperService::new(router.clone().layer(Extension(peer)));
                connections.spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .http1_only()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    Extension(peer): Extension<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let verified = shared
        .verifier
        .verify(&body, &headers)
        .map_err(|e| e.to_string());
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let owner_id = json
        .as_ref()
        .and_then(|j| j["data"]["owner_id"].as_str())
        .map(str::to_owned);
    let seq = json.as_ref().and_then(|j| j["data"]["seq"].as_i64());
    let kind = json
        .as_ref()
        .and_then(|j| j["type"].as_str())
        .map(str::to_owned);
    let webhook_id = header("webhook-id");
    let behaviour = shared.behaviour.lock().unwrap().clone();
    let fails = behaviour.fail_all
        || owner_id
            .as_ref()
            .is_some_and(|o| behaviour.fail_owners.contains(o))
        || behaviour.fail_ids.contains(&webhook_id);
    let filename = json.as_ref().and_then(|j| j["data"]["filename"].as_str());
    let read_url = json
        .as_ref()
        .and_then(|j| j["data"]["read_url"].as_str())
        .filter(|_| shared.read_first.load(Ordering::SeqCst))
        .map(str::to_owned);
    let reply = match (fails, filename) {
        (false, Some(name)) => behaviour
            .replies
            .iter()
            .find(|(pattern, _)| name.contains(pattern.as_str()))
            .map(|(_, r)| r.clone()),
        _ => None,
    };
    let status = match (&reply, fails) {
        (Some(r), _) => r.status,
        (None, true) => FAILURE,
        (None, false) => behaviour.ok,
    };
    let delay = behaviour.delay
        + owner_id
            .as_ref()
            .and_then(|o| behaviour.slow_owners.get(o))
            .copied()
            .unwrap_or_default();
    let n = {
        let mut log = shared.log.lock().unwrap();
        let n = log.len();
        log.push(Delivery {
            n,
            at: Instant::now(),
            peer,
            method: method.to_string(),
            path: uri.path().to_owned(),
            webhook_id,
            webhook_timestamp: header("webhook-timestamp"),
            content_type: header("content-type"),
            owner_id,
            seq,
            kind,
            body,
            json,
            verified,
            status: status.as_u16(),
            answered: false,
        });
        n
    };
    shared.changed.notify_waiters();
    if let Some(url) = read_url {
        let read = read_all(&url).await;
        shared.reads.lock().unwrap().insert(n, read);
    }
    if !delay.is_zero() {
        // Dropped here (down, or the connection closed), the request stays
        // unanswered.
        tokio::time::sleep(delay).await;
    }
    // No await from here: the status goes straight to hyper to write.
    shared.log.lock().unwrap()[n].answered = true;
    shared.changed.notify_waiters();
    match reply {
        Some(r) => r.into_response(),
        None => status.into_response(),
    }
}
