//! The accept loop: hyper's connection builder with
//! - a header timeout for every protocol: a connection with no request in
//!   progress for `header_timeout` (none yet, or none since the last one) is
//!   closed gracefully, and hyper's own HTTP/1 timer cuts a request head that
//!   is still arriving after it;
//! - cleartext HTTP/2 (prior knowledge) only when `h2c` is set;
//! - at most `max_connections` connections at once: past it the loop stops
//!   accepting, so new connections wait in the listen backlog until one
//!   closes (clients see a slow connect, not a refusal).

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, body::Body, http::Request};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use crate::{config::Settings, http::drain::Drain};

/// The most an HTTP/1 connection buffers of what it reads (hyper's default
/// is 400 KiB): an upload waiting for the memory budget stops reading
/// (`blob::budget`), and what its connection had read ahead sits here, so
/// many waiting connections hold this much each beside the budget. A
/// request's head must fit in it.
const HTTP1_READ_BUFFER: usize = 64 << 10;

/// Serves `router` on `listener` until `shutdown` fires; then drains
/// (`crate::http::drain`): unready at once, still accepting for
/// `drain_ready_grace`; then the listener closes, `drain` lets go of what
/// would outlive it, and in-flight requests get `settings.drain` to finish.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    settings: &Settings,
    (shutdown, drain): (CancellationToken, &Drain),
) {
    let ready_grace = settings.drain_ready_grace;
    let stop_accepting = async {
        shutdown.cancelled().await;
        drain.begin();
        tracing::info!(?ready_grace, "draining: unready, still accepting");
        tokio::time::sleep(ready_grace).await;
    };
    tokio::pin!(stop_accepting);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(HTTP1_READ_BUFFER);
    builder.http2().timer(TokioTimer::new());
    let builder = if settings.h2c {
        builder
    } else {
        builder.http1_only()
    };
    let slots = Arc::new(Semaphore::new(settings.max_connections));
    let connections = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut stop_accepting => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut stop_accepting => break,
        };
        let activity = Arc::new(Activity::new());
        let seen = activity.clone();
        let service = ServiceExt::<Request<Incoming>>::map_future(router.clone(), move |handled| {
            let busy = Busy::enter(seen.clone());
            async move {
                let response: Result<_, Infallible> = handled.await;
                // Busy until the response body has been sent.
                response.map(|r| r.map(|body| Body::new(Tracked { body, _busy: busy })))
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let (timeout, closing) = (settings.header_timeout, drain.closing().clone());
        // A connection open when the drain begins is told to close then (an
        // idle one at once, a busy one after its request, HTTP/2 by GOAWAY):
        // its client's next connection still finds the listener accepting.
        // One accepted during the drain's grace closes after each answer
        // (`Connection: close`), or at the listener's close (HTTP/2).
        let unready = (!drain.is_unready()).then(|| drain.unready().clone());
        connections.spawn(async move {
            let _slot = slot;
            tokio::pin!(conn);
            let mut shutting = false;
            // Set when the connection was told to close (idle, or the
            // drain): a client that does not take part in the close (an
            // HTTP/2 client that never answers the GOAWAY's PING) is cut
            // off then, once it has no request in progress.
            let mut cut_off: Option<Instant> = None;
            let drained = async {
                match &unready {
                    Some(unready) => unready.cancelled().await,
                    None => closing.cancelled().await,
                }
            };
            tokio::pin!(drained);
            loop {
                let wake = cut_off.unwrap_or_else(|| activity.idle_until(timeout));
                tokio::select! {
                    ended = conn.as_mut() => {
                        if let Err(e) = ended {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    () = &mut drained, if !shutting => {
                        conn.as_mut().graceful_shutdown();
                        shutting = true;
                        cut_off = Some(Instant::now() + timeout);
                    }
                    _ = tokio::time::sleep_until(wake), if !shutting || cut_off.is_some() => {
                        let idle = activity.idle_until(timeout) <= Instant::now();
                        match cut_off {
                            None if idle => {
                                conn.as_mut().graceful_shutdown();
                                shutting = true;
                                cut_off = Some(Instant::now() + timeout);
                            }
                            Some(_) if activity.is_idle() => break,
                            Some(_) => cut_off = Some(Instant::now() + timeout),
                            None => {}
                        }
                    }
                }
            }
        });
    }
    // New connections are refused from now; what would outlive the drain
    // lets go (tus PATCHes, long polls), and the other requests in flight
    // get `grace` to finish. Past it they are cut: an upload cut short
    // leaves at most an intent, which the sweeper turns into an orphan and
    // deletes.
    drop(listener);
    drain.close();
    tracing::info!("draining: the listener is closed");
    connections.close();
    let grace = settings.drain;
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "in-flight requests outlived the shutdown grace period; closing them"
        );
    }
}

/// After a failed accept, before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Requests of one connection: how many are in progress (head received,
/// response body not yet all sent) and since when none has been.
struct Activity {
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    fn is_idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
    }

    /// When the connection has been idle for `timeout`, if nothing starts
    /// before; a busy one is looked at again `timeout` from now.
    fn idle_until(&self, timeout: Duration) -> Instant {
        if !self.is_idle() {
            return Instant::now() + timeout;
        }
        *self.idle_since.lock().expect("never poisoned") + timeout
    }
}

/// One request being handled on a connection.
struct Busy(Arc<Activity>);

impl Busy {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::SeqCst);
        Self(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().expect("never poisoned") = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request [`Busy`] until it is dropped.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
