//! The server: bound, then run with its background workers (the sweeper,
//! the queue's, the event sequencer, the webhooks' dispatchers) until a
//! shutdown signal, then drained.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::serve;
use crate::{
    config::Settings,
    coord::brokers::BrokerQueue,
    domain::{sweeper::SweepWorker, webhooks},
    http::{self, AppState},
    worker::Workers,
};

/// A bound, ready-to-run server.
pub struct Application {
    listener: TcpListener,
    /// The listener of `FILEDOCK_METRICS_ADDR`, if set.
    metrics_listener: Option<TcpListener>,
    state: AppState,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::with_state(AppState::build(settings).await?).await
    }

    /// Serves an already-built state (tests wrap adapters this way).
    pub async fn with_state(state: AppState) -> anyhow::Result<Self> {
        // Connected before the first request where RabbitMQ is up (the
        // lock path while it is not, until the link connects).
        if let Some(BrokerQueue::Rabbitmq(q)) = &state.queue
            && let Err(e) = q.connect().await
        {
            tracing::warn!(error = %e, "starting with the queue's broker down");
        }
        let bind = &state.settings.bind;
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding {bind}"))?;
        let metrics_listener = match &state.settings.metrics_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding FILEDOCK_METRICS_ADDR {addr}"))?,
            ),
            None => None,
        };
        Ok(Self {
            listener,
            metrics_listener,
            state,
        })
    }

    /// Where `/metrics` is served, if apart from the API (`FILEDOCK_METRICS_ADDR`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .map(|l| l.local_addr().expect("bound listener has an address"))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` fires, then drains (`serve::serve`).
    /// Background workers run until the requests are done, then get
    /// `FILEDOCK_DRAIN_SECS` to stop,
    /// and are waited for: when this returns, they have let go of their
    /// leases and stores.
    pub async fn run_until_stopped(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let router = http::router(self.state.clone());
        // The workers (and the metrics listener) run on through the drain:
        // requests in flight may wait on the queue's workers (queue mode),
        // and the queue's buckets are given back only once they are done.
        let requests_done = CancellationToken::new();
        let mut workers = Workers::default();
        let interval = self.state.settings.sweep.interval;
        if !interval.is_zero() {
            let sweeper = SweepWorker::new(self.state.sweeper.clone(), interval);
            workers.spawn(sweeper, requests_done.child_token());
        }
        if let Some(queue) = &self.state.queue {
            workers.add("queue", queue.spawn_workers(requests_done.child_token()));
        }
        workers.spawn(self.state.events.sequencer(), requests_done.child_token());
        for dispatcher in webhooks::dispatchers(&self.state.webhooks) {
            workers.spawn(dispatcher, requests_done.child_token());
        }
        let metrics_server =
            self.metrics_addr()
                .zip(self.metrics_listener.take())
                .map(|(addr, l)| {
                    tracing::info!(%addr, "metrics listening");
                    let metrics = http::metrics_router(self.state.clone());
                    let stop = requests_done.clone().cancelled_owned();
                    tokio::spawn(async move {
                        if let Err(e) = axum::serve(l, metrics).with_graceful_shutdown(stop).await {
                            tracing::warn!(error = %e, "the metrics listener failed");
                        }
                    })
                });
        tracing::info!(addr = %self.local_addr(), "filedock listening");
        // Said by the server only: the one-shot commands print JSON on stdout.
        if self.state.links.ephemeral {
            tracing::warn!(
                "FILEDOCK_LINK_SECRET is unset: signed links use a random key made at start-up; \
                 they stop working on restart and on other instances"
            );
        }
        let drain = self.state.drain.clone();
        serve::serve(
            self.listener,
            router,
            &self.state.settings,
            (shutdown, &drain),
        )
        .await;
        requests_done.cancel();
        if let Some(server) = metrics_server {
            let _ = server.await;
        }
        let grace = self.state.settings.drain;
        workers.drain(std::time::Instant::now() + grace).await;
        Ok(())
    }
}

/// Fires on SIGINT or SIGTERM.
pub fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            if let Ok(mut s) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                s.recv().await;
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
        tracing::info!("shutdown signal received; finishing in-flight requests");
        fire.cancel();
    });
    token
}
