//! A round-robin TCP proxy on 127.0.0.1, as a balancer in front of
//! instances: each new connection goes to the next backend whose port
//! accepts (a closed one is skipped); the bytes are copied both ways.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct RoundRobin {
    pub base: String,
    stop: CancellationToken,
}

impl RoundRobin {
    pub async fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let (next, backends) = (Arc::new(AtomicUsize::new(0)), Arc::new(backends));
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let inbound = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((inbound, _)) => inbound,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    () = stopped.cancelled() => return,
                };
                let (next, backends) = (next.clone(), backends.clone());
                tokio::spawn(async move {
                    let start = next.fetch_add(1, Ordering::SeqCst);
                    for i in 0..backends.len() {
                        let to = backends[(start + i) % backends.len()];
                        let connect = TcpStream::connect(to);
                        if let Ok(Ok(mut outbound)) =
                            tokio::time::timeout(Duration::from_secs(1), connect).await
                        {
                            let mut inbound = inbound;
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                    // No backend accepts: the client's connection closes.
                });
            }
        });
        Self { base, stop }
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
