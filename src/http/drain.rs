//! A drain (SIGTERM) in two stages. First the instance turns unready:
//! `/readyz` answers 503 and every response closes its connection, while
//! the listener still accepts (a balancer's probe notices and stops sending
//! here; no client is refused meanwhile). Then the listener closes and the
//! instance lets go of what would outlive the drain: a tus PATCH in flight
//! stores what arrived and answers 503 `draining` (its client resumes from
//! `HEAD`'s offset, on another instance), a long poll answers with what it
//! has. Plain requests in flight are let finish.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::blob::{BodyError, ByteStream};

/// The two stages, each fired once.
#[derive(Clone, Default)]
pub struct Drain {
    unready: CancellationToken,
    closing: CancellationToken,
}

impl Drain {
    /// The first stage: unready, still accepting.
    pub fn begin(&self) {
        self.unready.cancel();
    }

    /// The second: the listener closed; what would outlive the drain lets go.
    pub fn close(&self) {
        self.unready.cancel();
        self.closing.cancel();
    }

    pub fn is_unready(&self) -> bool {
        self.unready.is_cancelled()
    }

    /// Fires at the second stage.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }
}

/// `body`, cut at the drain's second stage (`cut` then says so): a PATCH's
/// domain stores what arrived, as for a client gone.
pub fn cut_when_closing(
    body: ByteStream<'static>,
    drain: &Drain,
    cut: Arc<AtomicBool>,
) -> ByteStream<'static> {
    let closing = drain.closing.clone();
    futures::stream::unfold((body, false), move |(mut body, ended)| {
        let (closing, cut) = (closing.clone(), cut.clone());
        async move {
            if ended {
                return None;
            }
            tokio::select! {
                // Checked first: a body that flows fast is cut too.
                biased;
                () = closing.cancelled() => {
                    cut.store(true, Ordering::SeqCst);
                    let why = std::io::Error::other("this instance is shutting down");
                    Some((Err(BodyError::Read(why)), (body, true)))
                }
                chunk = body.next() => chunk.map(|c| (c, (body, false))),
            }
        }
    })
    .boxed()
}
