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

use futures::{FutureExt, StreamExt};
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

    /// Fires at the first stage.
    pub fn unready(&self) -> &CancellationToken {
        &self.unready
    }

    /// Fires at the second stage.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }
}

/// What a cut PATCH still reads once the drain closes, of what has arrived
/// already (without waiting): a body whose end is in the buffers is read
/// whole, never cut; one still flowing is cut past this.
const READ_AT_CLOSE: usize = 4 << 20;

/// `body`, cut at the drain's second stage (`cut` then says so): a PATCH's
/// domain stores what arrived, as for a client gone.
pub fn cut_when_closing(
    body: ByteStream<'static>,
    drain: &Drain,
    cut: Arc<AtomicBool>,
) -> ByteStream<'static> {
    let closing = drain.closing.clone();
    // `None` while open; then how much more may be read without waiting.
    let start: (ByteStream<'static>, Option<usize>, bool) = (body, None, false);
    futures::stream::unfold(start, move |(mut body, left, ended)| {
        let (closing, cut) = (closing.clone(), cut.clone());
        async move {
            if ended {
                return None;
            }
            let left = match left {
                Some(left) => left,
                None => tokio::select! {
                    // Checked first: a body that flows fast is cut too.
                    biased;
                    () = closing.cancelled() => READ_AT_CLOSE,
                    chunk = body.next() => return chunk.map(|c| (c, (body, None, false))),
                },
            };
            match body.next().now_or_never() {
                // The end, arrived: the body is whole.
                Some(None) => None,
                Some(Some(Ok(chunk))) if chunk.len() <= left => {
                    let left = left - chunk.len();
                    Some((Ok(chunk), (body, Some(left), false)))
                }
                Some(Some(Err(e))) => Some((Err(e), (body, Some(left), true))),
                // Still flowing, or past what may be read now: cut.
                _ => {
                    cut.store(true, Ordering::SeqCst);
                    let why = std::io::Error::other("this instance is shutting down");
                    Some((Err(BodyError::Read(why)), (body, Some(0), true)))
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn collect(body: ByteStream<'static>) -> Vec<Result<usize, String>> {
        futures::executor::block_on(
            body.map(|c| c.map(|b| b.len()).map_err(|e| e.to_string()))
                .collect(),
        )
    }

    #[test]
    fn a_body_whose_end_has_arrived_is_read_whole_after_the_close() {
        let drain = Drain::default();
        drain.close();
        let chunks = (0..3).map(|_| Ok(Bytes::from(vec![0u8; 1000])));
        let cut = Arc::new(AtomicBool::new(false));
        let read = collect(cut_when_closing(
            futures::stream::iter(chunks).boxed(),
            &drain,
            cut.clone(),
        ));
        assert_eq!(read, [Ok(1000), Ok(1000), Ok(1000)]);
        assert!(!cut.load(Ordering::SeqCst));
    }

    #[test]
    fn a_body_still_flowing_is_cut_after_what_has_arrived() {
        let drain = Drain::default();
        let arrived = futures::stream::iter([Ok(Bytes::from_static(b"abc"))]);
        // The rest never comes (a client still sending, slowly).
        let body = arrived.chain(futures::stream::pending()).boxed();
        let cut = Arc::new(AtomicBool::new(false));
        let mut body = cut_when_closing(body, &drain, cut.clone());
        let first = futures::executor::block_on(body.next()).unwrap().unwrap();
        assert_eq!(first, Bytes::from_static(b"abc"));
        drain.close();
        let read = collect(body);
        assert_eq!(read.len(), 1, "{read:?}");
        assert!(read[0].as_ref().is_err_and(|e| e.contains("shutting down")));
        assert!(cut.load(Ordering::SeqCst));
    }
}
