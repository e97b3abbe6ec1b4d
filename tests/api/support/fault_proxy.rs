//! A TCP proxy that injects network faults between a client and a server:
//! it cuts every open connection and refuses new ones for a while, and it
//! can do so right after a chosen command has been forwarded and the server
//! has answered it (so the server acted on it but the client never reads the
//! answer). It can also record what follows a pattern in the client's bytes
//! (say, each request's `Upload-Offset`), to check what a client sent.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Notify,
};
use tokio_util::sync::CancellationToken;

/// After forwarding a trigger, the proxy cuts once the server's answer
/// starts to arrive (it acted on the command), and no sooner than this:
/// a pipelining client (Redis) may be reading answers to earlier commands.
const ACT_BEFORE_CUT: Duration = Duration::from_millis(150);
/// The longest wait for that answer before cutting anyway.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// How many bytes after a watched pattern are kept.
const WATCH_BYTES: usize = 160;

pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Shared {
    /// Cancelled to cut every open connection; replaced after each cut.
    open: Mutex<CancellationToken>,
    /// Cancelled to stop every answer (server to client) until the cut.
    quiet: Mutex<CancellationToken>,
    refuse_until: Mutex<Option<Instant>>,
    trigger: Mutex<Option<Trigger>>,
    /// Triggers that fired since the proxy started.
    fired: AtomicUsize,
    /// What followed the watched pattern, each time a client sent it.
    watched: Mutex<Watched>,
}

/// Cut once, for `down`, right after clients have sent bytes containing
/// one of each stage's `patterns` in turn (passing over the first `skip` times the
/// sequence completes). The sequence is followed across connections: a
/// MongoDB driver may send a transaction's commands on different ones.
struct Trigger {
    patterns: Vec<Vec<Vec<u8>>>,
    /// How many stages of `patterns` have been seen.
    stage: usize,
    skip: usize,
    down: Duration,
    /// When to cut: once the server has answered (it acted on the
    /// command), or instead of forwarding it (the server never gets it).
    when: CutWhen,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CutWhen {
    Answered,
    Instead,
}

/// The watched pattern, and what followed it each time.
type Watched = Option<(Vec<u8>, Vec<Vec<u8>>)>;

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            shared.clone(),
            stop.clone(),
        ));
        Self { addr, shared, stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every open connection now and refuses new ones for `down`.
    pub fn cut(&self, down: Duration) {
        self.shared.cut(down);
    }

    /// Arms a one-shot cut of `down` that fires once a client has sent
    /// `pattern` (e.g. `commitTransaction`) and the server has answered it.
    pub fn cut_after(&self, pattern: &[u8], down: Duration) {
        self.cut_after_nth(pattern, 0, down);
    }

    /// As [`Self::cut_after`], at the `skip + 1`-th time `pattern` is sent.
    pub fn cut_after_nth(&self, pattern: &[u8], skip: usize, down: Duration) {
        self.cut_after_sequence(&[pattern], skip, down);
    }

    /// As [`Self::cut_after`], once one connection has carried each of
    /// `patterns` in turn (say, an insert into `files`, then the commit of
    /// its transaction).
    pub fn cut_after_sequence(&self, patterns: &[&[u8]], skip: usize, down: Duration) {
        let stages: Vec<&[&[u8]]> = patterns.iter().map(std::slice::from_ref).collect();
        self.cut_after_stages(&stages, skip, down);
    }

    /// As [`Self::cut_after_sequence`], each stage met by any one of its
    /// patterns (say, a commit's writes sent as one command or another).
    pub fn cut_after_stages(&self, stages: &[&[&[u8]]], skip: usize, down: Duration) {
        *self.shared.trigger.lock().unwrap() = Some(Trigger {
            patterns: (stages.iter())
                .map(|s| s.iter().map(|p| p.to_vec()).collect())
                .collect(),
            stage: 0,
            skip,
            down,
            when: CutWhen::Answered,
        });
    }

    /// Arms a one-shot cut of `down` in place of forwarding the bytes that
    /// contain `pattern`: the server never gets that command.
    pub fn cut_instead_of(&self, pattern: &[u8], down: Duration) {
        self.arm_once(pattern, down, CutWhen::Instead);
    }

    fn arm_once(&self, pattern: &[u8], down: Duration, when: CutWhen) {
        *self.shared.trigger.lock().unwrap() = Some(Trigger {
            patterns: vec![vec![pattern.to_vec()]],
            stage: 0,
            skip: 0,
            down,
            when,
        });
    }

    /// Ends every fault: new connections are let through and no trigger is
    /// armed (a trigger disarmed this way has not fired).
    pub fn heal(&self) {
        *self.shared.refuse_until.lock().unwrap() = None;
        self.shared.trigger.lock().unwrap().take();
    }

    /// Whether a trigger has fired since the proxy started.
    pub fn triggered(&self) -> bool {
        self.fired() > 0
    }

    /// How many triggers have fired since the proxy started.
    pub fn fired(&self) -> usize {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// From now on, records the bytes that follow `pattern` (compared
    /// without regard to ASCII case) each time a client sends it.
    pub fn watch(&self, pattern: &[u8]) {
        *self.shared.watched.lock().unwrap() = Some((pattern.to_ascii_lowercase(), Vec::new()));
    }

    /// What followed the watched pattern each time, up to a line end.
    pub fn watched(&self) -> Vec<String> {
        let watched = self.shared.watched.lock().unwrap();
        let Some((_, seen)) = watched.as_ref() else {
            return Vec::new();
        };
        seen.iter()
            .map(|b| {
                let line = b.split(|&c| c == b'\r' || c == b'\n').next().unwrap_or(b);
                String::from_utf8_lossy(line).into_owned()
            })
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.open.lock().unwrap().cancel();
    }
}

impl Shared {
    fn refuse_for(&self, down: Duration) {
        *self.refuse_until.lock().unwrap() = Some(Instant::now() + down);
    }

    fn cut(&self, down: Duration) {
        self.refuse_for(down);
        let old = std::mem::take(&mut *self.open.lock().unwrap());
        old.cancel();
        std::mem::take(&mut *self.quiet.lock().unwrap()).cancel();
    }

    fn refusing(&self) -> bool {
        self.refuse_until
            .lock()
            .unwrap()
            .is_some_and(|t| Instant::now() < t)
    }

    /// The cut a chunk from a client triggers (how long, and whether after
    /// the server's answer), disarming it.
    fn fired_by(&self, chunk: &[u8]) -> Option<(Duration, CutWhen)> {
        let mut trigger = self.trigger.lock().unwrap();
        let t = trigger.as_mut()?;
        if !t.patterns[t.stage].iter().any(|p| contains(chunk, p)) {
            return None;
        }
        if t.stage + 1 < t.patterns.len() {
            t.stage += 1;
            return None;
        }
        t.stage = 0;
        if t.skip > 0 {
            t.skip -= 1;
            return None;
        }
        self.fired.fetch_add(1, Ordering::SeqCst);
        trigger.take().map(|t| (t.down, t.when))
    }

    /// Records what follows the watched pattern in `window` (the tail of
    /// the connection's previous chunk, then this chunk), for occurrences
    /// that end after `old` bytes (not recorded before).
    fn watch(&self, window: &[u8], old: usize) {
        let mut watched = self.watched.lock().unwrap();
        let Some((pattern, seen)) = watched.as_mut() else {
            return;
        };
        let lower = window.to_ascii_lowercase();
        let mut at = 0;
        while let Some(i) = find(&lower[at..], pattern) {
            let start = at + i;
            let end = start + pattern.len();
            if end > old {
                seen.push(window[end..(end + WATCH_BYTES).min(window.len())].to_vec());
            }
            at = end;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((c, _)) => c,
                Err(_) => continue,
            },
        };
        if shared.refusing() {
            drop(client); // the link is down: the client sees its connection close
            continue;
        }
        let open = shared.open.lock().unwrap().clone();
        let quiet = shared.quiet.lock().unwrap().clone();
        tokio::spawn(relay(client, upstream, shared.clone(), open, quiet));
    }
}

/// Forwards one connection both ways until either side closes or a cut.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    open: CancellationToken,
    quiet: CancellationToken,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // Told when the server answers on this connection while answers are held.
    let answered = Arc::new(Notify::new());
    let upstream_pump = {
        let (open, quiet, answered) = (open.clone(), quiet.clone(), answered.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            loop {
                let n = tokio::select! {
                    _ = open.cancelled() => return,
                    r = client_rx.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
                };
                let chunk = &buf[..n];
                tail.extend_from_slice(chunk);
                shared.watch(&tail, tail.len() - n);
                tail.drain(..tail.len().saturating_sub(WATCH_BYTES * 2));
                let fired = shared.fired_by(chunk);
                let sent_at = Instant::now();
                if let Some((down, _)) = fired {
                    // From this moment no answer reaches any client (the
                    // link is cut just after the command left), and no new
                    // connection gets through to retry.
                    shared.refuse_for(ANSWER_WAIT + down);
                    quiet.cancel();
                }
                if let Some((down, CutWhen::Instead)) = fired {
                    shared.cut(down);
                    return;
                }
                if server_tx.write_all(chunk).await.is_err() {
                    return;
                }
                if let Some((down, when)) = fired {
                    if when == CutWhen::Answered {
                        let _ = tokio::time::timeout(ANSWER_WAIT, answered.notified()).await;
                        tokio::time::sleep(ACT_BEFORE_CUT.saturating_sub(sent_at.elapsed())).await;
                    }
                    shared.cut(down);
                    return;
                }
            }
        }
    };
    let downstream_pump = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                _ = open.cancelled() => return,
                // Answers are held: read and drop them (noting that the
                // server answered) until the cut closes the connection.
                _ = quiet.cancelled() => loop {
                    tokio::select! {
                        _ = open.cancelled() => return,
                        r = server_rx.read(&mut buf) => match r {
                            Ok(0) | Err(_) => return open.cancelled().await,
                            Ok(_) => answered.notify_one(),
                        },
                    }
                },
                r = server_rx.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            };
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(upstream_pump, downstream_pump);
}
