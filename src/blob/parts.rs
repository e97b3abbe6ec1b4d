//! The one part writer: every upload body that goes to a blob store in
//! parts (a plain upload's S3 multipart upload, a tus PATCH) is cut here,
//! and every part buffer is allocated here, so that what an upload holds in
//! memory is `part size × (parts in flight + 1)` whatever the file size or
//! the chunks the client sends (garage's `read_and_put_blocks`, which its
//! multipart upload reuses), and what all uploads hold together stays
//! within the one budget (`super::budget`), each part reserved before it
//! is read.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::task::JoinSet;

use super::{
    BlobError, BodyError, ByteStream,
    budget::{Claim, Reservation},
};

/// Where whole parts go: an S3 multipart upload, a resumable write.
#[async_trait]
pub trait PartSink: Send + Sync {
    /// Stores part `number` (1-based), which begins at byte `offset` of the
    /// blob; its tag (the S3 ETag).
    async fn put_part(&self, number: i32, offset: u64, part: Bytes) -> Result<String, BlobError>;
}

/// One part's bytes and the budget they hold until dropped.
pub struct Part {
    pub bytes: Bytes,
    pub held: Reservation,
}

impl Part {
    /// No bytes, holding nothing.
    pub fn empty() -> Self {
        Self {
            bytes: Bytes::new(),
            held: Reservation::none(),
        }
    }
}

/// Cuts a body (after `carried`, bytes kept from before) into parts of
/// exactly `size` bytes; the last may be shorter. A part is one allocation
/// of its own size, or a slice of one chunk when a chunk holds it whole.
/// Each part's memory is reserved from the budget once its first bytes
/// have arrived (a client that sends nothing holds none) and before any
/// more is read: while it waits, nothing is read from the client. A
/// refused reservation ends the body (cut, [`BodyError::MemoryBusy`] or
/// [`BodyError::LetGo`]): the bytes already read are handed out, holding
/// nothing, and nothing more is read.
pub struct Parts<'a> {
    body: ByteStream<'a>,
    /// The tail of a chunk that crossed the previous part's end (or the
    /// carried bytes, first).
    carry: Option<Bytes>,
    size: usize,
    ended: bool,
    /// Why the body stopped early, once it has.
    cut: Option<BodyError>,
    /// Bytes read from the body (the carried ones not counted).
    read: u64,
    claim: Claim,
    /// A reservation was refused: what is left is handed out unreserved.
    refused: bool,
    /// At most this many bytes are still to come (carried ones included),
    /// when known: a part never reserves more.
    left: Option<u64>,
    /// Reserved by the caller for the first part.
    ahead: Option<Reservation>,
}

impl<'a> Parts<'a> {
    pub fn new(carried: Bytes, body: ByteStream<'a>, size: usize, claim: Claim) -> Self {
        Self {
            body,
            carry: (!carried.is_empty()).then_some(carried),
            size: size.max(1),
            ended: false,
            cut: None,
            read: 0,
            claim,
            refused: false,
            left: None,
            ahead: None,
        }
    }

    /// At most `left` bytes are to come, carried ones included.
    pub fn at_most(mut self, left: Option<u64>) -> Self {
        self.left = left;
        self
    }

    /// The first part takes `held` (reserved before the carried bytes
    /// were loaded) instead of reserving.
    pub fn reserved(mut self, held: Reservation) -> Self {
        self.ahead = Some(held);
        self
    }

    /// The next chunk (the carried bytes first), or `None` when the body
    /// is done or failed.
    async fn pull(&mut self) -> Option<Bytes> {
        if let Some(c) = self.carry.take() {
            return Some(c);
        }
        while !self.ended {
            match self.body.next().await {
                Some(Ok(c)) if c.is_empty() => {}
                Some(Ok(c)) => {
                    self.read += c.len() as u64;
                    return Some(c);
                }
                Some(Err(e)) => {
                    self.cut = Some(e);
                    self.ended = true;
                }
                None => self.ended = true,
            }
        }
        None
    }

    /// The next part, or `None` when the body is done. A body that fails
    /// ends it: what arrived before is still handed out (the last part,
    /// short), and [`Self::cut`] says why.
    pub async fn next(&mut self) -> Option<Part> {
        let first = self.pull().await?;
        let want = self
            .left
            .map_or(self.size as u64, |l| l.min(self.size as u64));
        let mut held = match self.ahead.take() {
            Some(held) => held,
            None if self.refused => Reservation::none(),
            None => match self.claim.reserve(want).await {
                Ok(held) => held,
                Err(refused) => {
                    // What was read (this chunk, a carried tail) is in
                    // memory already: it goes out; no more is read.
                    self.refused = true;
                    self.ended = true;
                    self.cut = Some(refused.into());
                    Reservation::none()
                }
            },
        };
        let mut buf: Option<BytesMut> = None;
        let mut whole: Option<Bytes> = None;
        let mut len = 0;
        let mut chunk = Some(first);
        while len < self.size {
            let Some(c) = chunk.take() else {
                match self.pull().await {
                    Some(c) => chunk = Some(c),
                    None => break,
                }
                continue;
            };
            let room = self.size - len;
            let c = match c.len() > room {
                true => {
                    self.carry = Some(c.slice(room..));
                    c.slice(..room)
                }
                false => c,
            };
            len += c.len();
            match (buf.as_mut(), whole.take()) {
                (Some(b), _) => b.extend_from_slice(&c),
                (None, None) => whole = Some(c),
                (None, Some(w)) => {
                    // One allocation of the part's size: the chunks are
                    // copied in as they come and dropped.
                    let mut b = BytesMut::with_capacity(want.max(len as u64) as usize);
                    b.extend_from_slice(&w);
                    b.extend_from_slice(&c);
                    buf = Some(b);
                }
            }
        }
        let bytes = match buf {
            Some(b) => b.freeze(),
            None => whole.unwrap_or_default(),
        };
        held.shrink_to(len as u64);
        if let Some(l) = self.left.as_mut() {
            *l = l.saturating_sub(len as u64);
        }
        Some(Part { bytes, held })
    }

    /// Whether the whole body has been read.
    pub fn done(&self) -> bool {
        self.ended && self.carry.is_none()
    }

    /// Why the body stopped early, if it did (taken: asked once).
    pub fn cut(&mut self) -> Option<BodyError> {
        self.cut.take()
    }

    /// Bytes read from the body so far.
    pub fn read(&self) -> u64 {
        self.read
    }
}

/// Where a write starts: the number of its first part and that part's
/// offset in the blob.
#[derive(Clone, Copy, Debug)]
pub struct PartsFrom {
    pub number: i32,
    pub offset: u64,
}

/// What [`send`] stored.
pub struct Sent {
    /// The tags of the parts sent, in order.
    pub tags: Vec<String>,
    /// A last part shorter than the part size, kept back (not sent) when
    /// the caller asked for that: a resumable upload's new tail, holding
    /// its budget until dropped.
    pub rest: Part,
}

/// Whether a part shorter than the part size (the last one) is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Short {
    /// Sent as the blob's last part.
    Send,
    /// Kept back: more of the blob comes later.
    Keep,
}

/// Sends the parts `parts` yields, `first` (already read) first, to `sink`
/// as tasks, so that reading the next part from the client overlaps with
/// sending the previous ones; at most `concurrency` are in flight (and in
/// memory, each holding its reservation until stored). Waits for every part sent before it answers, so none lands
/// later. A failed part stops the reading and fails the write (the parts
/// already stored stay: the caller aborts the write or overwrites them).
pub async fn send(
    parts: &mut Parts<'_>,
    first: Option<Part>,
    sink: Arc<dyn PartSink>,
    from: PartsFrom,
    concurrency: usize,
    short: Short,
) -> Result<Sent, BlobError> {
    let size = parts.size;
    let mut in_flight: JoinSet<PartDone> = JoinSet::new();
    let mut tags: Vec<String> = Vec::new();
    let mut failed: Option<BlobError> = None;
    let mut rest = Part::empty();
    let mut offset = from.offset;
    let mut next = first;
    if next.is_none() {
        next = parts.next().await;
    }
    while let Some(part) = next.take() {
        if part.bytes.len() < size && short == Short::Keep {
            rest = part;
            break;
        }
        let index = tags.len();
        let number = from.number + index as i32;
        let start = offset;
        offset += part.bytes.len() as u64;
        tags.push(String::new());
        let sink = sink.clone();
        in_flight.spawn(async move {
            let Part { bytes, held } = part;
            let tag = sink.put_part(number, start, bytes).await;
            // The part's memory is free once it is stored.
            drop(held);
            (index, tag)
        });
        while in_flight.len() >= concurrency.max(1) {
            joined(in_flight.join_next().await, &mut tags, &mut failed);
        }
        if failed.is_some() {
            break;
        }
        next = parts.next().await;
    }
    while let Some(r) = in_flight.join_next().await {
        joined(Some(r), &mut tags, &mut failed);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Sent { tags, rest }),
    }
}

/// A part task's answer: its index among the parts sent, and its tag.
type PartDone = (usize, Result<String, BlobError>);

fn joined(
    r: Option<Result<PartDone, tokio::task::JoinError>>,
    tags: &mut [String],
    failed: &mut Option<BlobError>,
) {
    let e = match r {
        Some(Ok((index, Ok(tag)))) => {
            tags[index] = tag;
            return;
        }
        Some(Ok((_, Err(e)))) => e,
        Some(Err(e)) => BlobError::Other(format!("part upload task failed: {e}")),
        None => return,
    };
    failed.get_or_insert(e);
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::blob::budget::MemoryBudget;

    /// The bytes of chunks of these lengths, and the body that sends them.
    fn body_of(chunks: &[usize]) -> (Vec<u8>, ByteStream<'static>) {
        let mut all = Vec::new();
        let body: Vec<Result<Bytes, BodyError>> = chunks
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let c: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
                all.extend_from_slice(&c);
                Ok(Bytes::from(c))
            })
            .collect();
        (all, futures::stream::iter(body).boxed())
    }

    #[tokio::test]
    async fn parts_are_exactly_the_part_size_whatever_the_chunks() {
        let size = 200 << 10;
        let cases: [&[usize]; 6] = [
            &[],
            &[10],
            &[1000, 3000, 5],
            &[size],
            &[size * 2 + 7],
            &[70_000, 1, 130_000, 300_000, 64 << 10, 3, size, 9],
        ];
        for chunks in cases {
            let (all, body) = body_of(chunks);
            let mut reader = Parts::new(
                Bytes::new(),
                body,
                size,
                MemoryBudget::unbounded().claim(None),
            );
            let mut parts = Vec::new();
            while let Some(p) = reader.next().await {
                parts.push(p.bytes);
            }
            assert!(reader.done());
            let (last, full) = parts
                .split_last()
                .map_or((None, &[][..]), |(l, f)| (Some(l), f));
            assert!(full.iter().all(|p| p.len() == size), "{chunks:?}");
            assert!(
                last.is_none_or(|l| !l.is_empty() && l.len() <= size),
                "{chunks:?}"
            );
            assert_eq!(parts.concat(), all, "{chunks:?}: the bytes, in order");
            assert_eq!(reader.read(), all.len() as u64);
        }
    }

    /// Keeps what it is sent, by part number.
    #[derive(Default)]
    struct Kept(Mutex<Vec<(i32, u64, Bytes)>>);

    #[async_trait]
    impl PartSink for Kept {
        async fn put_part(
            &self,
            number: i32,
            offset: u64,
            part: Bytes,
        ) -> Result<String, BlobError> {
            self.0.lock().unwrap().push((number, offset, part));
            Ok(format!("tag{number}"))
        }
    }

    #[tokio::test]
    async fn carried_bytes_lead_and_a_short_last_part_is_kept_back_when_asked() {
        let size = 10;
        let (all, body) = body_of(&[7, 9, 8]); // 24 bytes after 4 carried
        let carried = Bytes::from_static(b"abcd");
        let mut parts = Parts::new(
            carried.clone(),
            body,
            size,
            MemoryBudget::unbounded().claim(None),
        );
        let sink = Arc::new(Kept::default());
        let from = PartsFrom {
            number: 3,
            offset: 20,
        };
        let sent = send(&mut parts, None, sink.clone(), from, 2, Short::Keep)
            .await
            .unwrap();
        assert_eq!(sent.tags, ["tag3", "tag4"]);
        let mut kept = sink.0.lock().unwrap().clone();
        kept.sort_by_key(|k| k.0);
        assert_eq!(
            kept.iter().map(|k| (k.0, k.1)).collect::<Vec<_>>(),
            [(3, 20), (4, 30)]
        );
        let mut whole = carried.to_vec();
        whole.extend_from_slice(&all);
        let stored: Vec<u8> = kept.iter().flat_map(|k| k.2.to_vec()).collect();
        assert_eq!(stored, whole[..20], "whole parts, in order");
        assert_eq!(sent.rest.bytes, whole[20..], "the rest kept back");
        assert_eq!(parts.read(), 24);
    }

    /// Stores nothing, slowly (a store that takes its time).
    struct Slow;

    #[async_trait]
    impl PartSink for Slow {
        async fn put_part(&self, n: i32, _: u64, _: Bytes) -> Result<String, BlobError> {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            Ok(format!("tag{n}"))
        }
    }

    #[tokio::test]
    async fn many_writers_on_a_budget_of_two_parts_all_finish_within_it() {
        let size = 1000;
        let metrics = crate::metrics::Metrics::default();
        let limits = crate::blob::budget::BudgetLimits::total(2 * size as u64);
        let budget = crate::blob::budget::MemoryBudget::new(limits, &metrics);
        let writers = (0..16).map(|w| {
            let budget = budget.clone();
            tokio::spawn(async move {
                let (all, body) = body_of(&[700, 900, 2500, 1, 3000]);
                let mut parts = Parts::new(Bytes::new(), body, size, budget.claim(None));
                let from = PartsFrom {
                    number: 1,
                    offset: 0,
                };
                // Every other writer keeps its short last part back, holding it.
                let short = if w % 2 == 0 { Short::Send } else { Short::Keep };
                let sent = send(&mut parts, None, Arc::new(Slow), from, 4, short).await;
                (sent.unwrap().tags.len(), all.len())
            })
        });
        let done = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            futures::future::join_all(writers),
        )
        .await
        .expect("no writer waits forever");
        for (w, r) in done.into_iter().enumerate() {
            let (tags, len) = r.unwrap();
            assert_eq!(tags, len.div_ceil(size) - w % 2, "writer {w}");
        }
        assert!(budget.peak() <= 2 * size as u64, "peak {}", budget.peak());
        assert!(metrics.upload_memory_waits.get() > 0, "the writers waited");
        assert_eq!(budget.used(), 0, "all given back");
    }

    #[tokio::test]
    async fn a_refused_reservation_hands_out_what_was_read_and_reads_no_more() {
        let size = 1000;
        let limits = crate::blob::budget::BudgetLimits {
            bytes: size as u64,
            per_user: 0,
            wait: Some(std::time::Duration::from_millis(50)),
        };
        let budget = MemoryBudget::new(limits, &crate::metrics::Metrics::default());
        let (all, body) = body_of(&[size, 300, 400]);
        let mut parts = Parts::new(Bytes::new(), body, size, budget.claim(None));
        let first = parts.next().await.unwrap();
        // The first part holds the whole budget: the second's wait is refused.
        let second = parts.next().await.unwrap();
        assert_eq!(
            (second.bytes.as_ref(), second.held.bytes()),
            (&all[size..size + 300], 0)
        );
        assert!(parts.next().await.is_none(), "no more is read");
        assert!(matches!(parts.cut(), Some(BodyError::MemoryBusy(_))));
        assert_eq!(parts.read(), size as u64 + 300);
        drop(first);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_cut_body_hands_out_what_arrived_and_says_why() {
        let chunks: Vec<Result<Bytes, BodyError>> = vec![
            Ok(Bytes::from_static(b"12345")),
            Err(BodyError::Invalid("gone".into())),
        ];
        let body = futures::stream::iter(chunks).boxed();
        let mut parts = Parts::new(
            Bytes::new(),
            body,
            10,
            MemoryBudget::unbounded().claim(None),
        );
        let first = parts.next().await.map(|p| p.bytes);
        assert_eq!(first.as_deref(), Some(&b"12345"[..]));
        assert!(parts.next().await.is_none());
        assert!(matches!(parts.cut(), Some(BodyError::Invalid(_))));
    }
}
