//! A TCP proxy that injects network faults between filedock and a backend:
//! it cuts every open connection and refuses new ones for a while, and it
//! can do so right after a chosen command has been forwarded (so the server
//! acts on it but the client never reads the answer).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

/// How long the proxy waits, after forwarding a trigger, before it cuts:
/// enough for a loopback server to act on the command.
const ACT_BEFORE_CUT: Duration = Duration::from_millis(150);

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
}

/// Cut once, for `down`, right after a client sends bytes containing
/// `pattern` (passing over its first `skip` occurrences).
struct Trigger {
    pattern: Vec<u8>,
    skip: usize,
    down: Duration,
}

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
    /// `pattern` (e.g. `commitTransaction`) and the server has had it.
    pub fn cut_after(&self, pattern: &[u8], down: Duration) {
        self.cut_after_nth(pattern, 0, down);
    }

    /// As [`Self::cut_after`], at the `skip + 1`-th time `pattern` is sent.
    pub fn cut_after_nth(&self, pattern: &[u8], skip: usize, down: Duration) {
        *self.shared.trigger.lock().unwrap() = Some(Trigger {
            pattern: pattern.to_vec(),
            skip,
            down,
        });
    }

    /// Ends every fault: new connections are let through and no trigger is armed.
    pub fn heal(&self) {
        *self.shared.refuse_until.lock().unwrap() = None;
        self.shared.trigger.lock().unwrap().take();
    }

    /// Whether an armed trigger has fired.
    pub fn triggered(&self) -> bool {
        self.shared.trigger.lock().unwrap().is_none()
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

    /// The cut a chunk from the client triggers, disarming it.
    fn fired_by(&self, chunk: &[u8]) -> Option<Duration> {
        let mut trigger = self.trigger.lock().unwrap();
        let t = trigger.as_mut()?;
        if !chunk.windows(t.pattern.len()).any(|w| w == t.pattern) {
            return None;
        }
        if t.skip > 0 {
            t.skip -= 1;
            return None;
        }
        trigger.take().map(|t| t.down)
    }
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
    let upstream_pump = {
        let (open, quiet) = (open.clone(), quiet.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = tokio::select! {
                    _ = open.cancelled() => return,
                    r = client_rx.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
                };
                let fired = shared.fired_by(&buf[..n]);
                if let Some(down) = fired {
                    // From this moment no answer reaches any client (the
                    // link is cut just after the command left), and no new
                    // connection gets through to retry.
                    shared.refuse_for(ACT_BEFORE_CUT + down);
                    quiet.cancel();
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                if let Some(down) = fired {
                    tokio::time::sleep(ACT_BEFORE_CUT).await;
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
                // Hold the connection open, silent, until the cut closes it.
                _ = quiet.cancelled() => return open.cancelled().await,
                r = server_rx.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            };
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(upstream_pump, downstream_pump);
}
