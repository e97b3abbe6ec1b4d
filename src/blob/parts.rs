//! The one part writer: every upload body that goes to a blob store in
//! parts (a plain upload's S3 multipart upload, a tus PATCH) is cut here,
//! and every part buffer is allocated here, so that what an upload holds in
//! memory is `part size × (parts in flight + 1)` whatever the file size or
//! the chunks the client sends (garage's `read_and_put_blocks`, which its
//! multipart upload reuses).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::task::JoinSet;

use super::{BlobError, BodyError, ByteStream};

/// Where whole parts go: an S3 multipart upload, a resumable write.
#[async_trait]
pub trait PartSink: Send + Sync {
    /// Stores part `number` (1-based), which begins at byte `offset` of the
    /// blob; its tag (the S3 ETag).
    async fn put_part(&self, number: i32, offset: u64, part: Bytes) -> Result<String, BlobError>;
}

/// Cuts a body (after `carried`, bytes kept from before) into parts of
/// exactly `size` bytes; the last may be shorter. A part is one allocation
/// of its own size, or a slice of one chunk when a chunk holds it whole.
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
}

impl<'a> Parts<'a> {
    pub fn new(carried: Bytes, body: ByteStream<'a>, size: usize) -> Self {
        Self {
            body,
            carry: (!carried.is_empty()).then_some(carried),
            size: size.max(1),
            ended: false,
            cut: None,
            read: 0,
        }
    }

    /// The next part, or `None` when the body is done. A body that fails
    /// ends it: what arrived before is still handed out (the last part,
    /// short), and [`Self::cut`] says why.
    pub async fn next(&mut self) -> Option<Bytes> {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0;
        while len < self.size {
            let chunk = match self.carry.take() {
                Some(c) => c,
                None if self.ended => break,
                None => match self.body.next().await {
                    Some(Ok(c)) => {
                        self.read += c.len() as u64;
                        c
                    }
                    Some(Err(e)) => {
                        self.cut = Some(e);
                        self.ended = true;
                        break;
                    }
                    None => {
                        self.ended = true;
                        break;
                    }
                },
            };
            let room = self.size - len;
            if chunk.len() > room {
                self.carry = Some(chunk.slice(room..));
                chunks.push(chunk.slice(..room));
                len += room;
            } else {
                len += chunk.len();
                chunks.push(chunk);
            }
        }
        match chunks.len() {
            0 => None,
            1 => chunks.pop().filter(|c| !c.is_empty()),
            _ => {
                let mut part = BytesMut::with_capacity(len);
                for c in &chunks {
                    part.extend_from_slice(c);
                }
                Some(part.freeze())
            }
        }
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
    /// the caller asked for that: a resumable upload's new tail.
    pub rest: Bytes,
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
/// memory). Waits for every part sent before it answers, so none lands
/// later. A failed part stops the reading and fails the write (the parts
/// already stored stay: the caller aborts the write or overwrites them).
pub async fn send(
    parts: &mut Parts<'_>,
    first: Option<Bytes>,
    sink: Arc<dyn PartSink>,
    from: PartsFrom,
    concurrency: usize,
    short: Short,
) -> Result<Sent, BlobError> {
    let size = parts.size;
    let mut in_flight: JoinSet<PartDone> = JoinSet::new();
    let mut tags: Vec<String> = Vec::new();
    let mut failed: Option<BlobError> = None;
    let mut rest = Bytes::new();
    let mut offset = from.offset;
    let mut next = first;
    if next.is_none() {
        next = parts.next().await;
    }
    while let Some(part) = next.take() {
        if part.len() < size && short == Short::Keep {
            rest = part;
            break;
        }
        let index = tags.len();
        let number = from.number + index as i32;
        let start = offset;
        offset += part.len() as u64;
        tags.push(String::new());
        let sink = sink.clone();
        in_flight.spawn(async move { (index, sink.put_part(number, start, part).await) });
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
            let mut reader = Parts::new(Bytes::new(), body, size);
            let mut parts = Vec::new();
            while let Some(p) = reader.next().await {
                parts.push(p);
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
        let mut parts = Parts::new(carried.clone(), body, size);
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
        assert_eq!(sent.rest, whole[20..], "the rest kept back");
        assert_eq!(parts.read(), 24);
    }

    #[tokio::test]
    async fn a_cut_body_hands_out_what_arrived_and_says_why() {
        let chunks: Vec<Result<Bytes, BodyError>> = vec![
            Ok(Bytes::from_static(b"12345")),
            Err(BodyError::Invalid("gone".into())),
        ];
        let mut parts = Parts::new(Bytes::new(), futures::stream::iter(chunks).boxed(), 10);
        assert_eq!(parts.next().await.as_deref(), Some(&b"12345"[..]));
        assert!(parts.next().await.is_none());
        assert!(matches!(parts.cut(), Some(BodyError::Invalid(_))));
    }
}
