//! `multipart/form-data` uploads: the `file` part is streamed, never
//! buffered; any other part is skipped; a second `file` part is an error
//! that surfaces before the upload commits. What comes before a part's body
//! (the preamble, the boundary line, the part's headers) is capped, and the
//! body idle timeout holds from the body's first byte.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt, stream};

use crate::blob::{BodyError, ByteStream};
use crate::domain::DomainError;

/// The most a multipart body may send before a part's body starts (the
/// preamble, the boundary line and the part's headers). Browsers send a few
/// hundred bytes; multer itself buffers a part head without limit, so a
/// head that never ends would grow the process until the body does.
pub const PART_HEAD_LIMIT: usize = 8 * 1024;

/// What the `file` part says about itself.
pub struct FilePart {
    pub filename: Option<String>,
    pub content_type: Option<String>,
}

fn invalid_body(why: impl Into<String>) -> BodyError {
    BodyError::Invalid(why.into())
}

/// Finds the `file` part of `body` and returns it with a stream of its
/// bytes. The stream ends only after the rest of the body has been read and
/// found to hold no second `file` part. A body that sends nothing for `idle`,
/// in a part head or anywhere else, fails with [`BodyError::Idle`].
pub async fn file_part(
    body: Body,
    boundary: String,
    idle: Duration,
) -> Result<(FilePart, ByteStream<'static>), DomainError> {
    let head = Arc::new(HeadBudget::default());
    let mut mp = multer::Multipart::new(guarded(body, head.clone(), idle), boundary);
    let field = loop {
        match next_part(&mut mp, &head).await.map_err(multer_err)? {
            Some(f) if f.name() == Some("file") => break f,
            Some(mut other) => while other.chunk().await.map_err(multer_err)?.is_some() {},
            None => {
                return Err(DomainError::InvalidRequest(
                    "multipart body has no part named \"file\"".into(),
                ));
            }
        }
    };
    let extended = field
        .headers()
        .get(http::header::CONTENT_DISPOSITION)
        .map(|v| extended_filename(v.as_bytes()))
        .transpose()?
        .flatten();
    let part = FilePart {
        // RFC 6266 §4.3: `filename*` wins over `filename` when both are sent.
        filename: extended.or_else(|| field.file_name().map(str::to_owned)),
        content_type: field.content_type().map(ToString::to_string),
    };
    // `None` once the body has ended or failed.
    let body = stream::unfold(Some((mp, field, head)), |state| async move {
        let (mut mp, mut field, head) = state?;
        match field.chunk().await {
            Ok(Some(chunk)) => {
                return Some((Ok::<Bytes, BodyError>(chunk), Some((mp, field, head))));
            }
            Ok(None) => {}
            Err(e) => return Some((Err(multer_io(e)), None)),
        }
        // The file part is done (multer needs it dropped before the next
        // field): read the rest before the upload may commit.
        drop(field);
        loop {
            match next_part(&mut mp, &head).await {
                Ok(None) => return None,
                Ok(Some(f)) if f.name() == Some("file") => {
                    return Some((
                        Err(invalid_body(
                            "multipart body has more than one \"file\" part",
                        )),
                        None,
                    ));
                }
                Ok(Some(mut other)) => loop {
                    match other.chunk().await {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => return Some((Err(multer_io(e)), None)),
                    }
                },
                Err(e) => return Some((Err(multer_io(e)), None)),
            }
        }
    });
    Ok((part, body.boxed()))
}

/// The `filename*` parameter of a part's `Content-Disposition` (RFC 6266,
/// its value an RFC 8187 ext-value: `UTF-8''r%C3%A9sum%C3%A9.pdf`), decoded;
/// `None` if there is none, 400 if it cannot be decoded.
fn extended_filename(disposition: &[u8]) -> Result<Option<String>, DomainError> {
    let bad = |why: &str| DomainError::InvalidRequest(format!("multipart filename* {why}"));
    let Some(raw) = params(disposition)
        .find_map(|(name, value)| name.eq_ignore_ascii_case(b"filename*").then_some(value))
    else {
        return Ok(None);
    };
    let mut fields = raw.splitn(3, |&b| b == b'\'');
    let (Some(charset), Some(_language), Some(encoded)) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err(bad("must be charset'language'percent-encoded-name"));
    };
    let bytes: Vec<u8> = percent_encoding::percent_decode(encoded).collect();
    let name = if charset.eq_ignore_ascii_case(b"utf-8") {
        String::from_utf8(bytes).map_err(|_| bad("is not valid UTF-8"))?
    } else if charset.eq_ignore_ascii_case(b"iso-8859-1") {
        bytes.into_iter().map(char::from).collect()
    } else {
        return Err(bad("must be in UTF-8 or ISO-8859-1"));
    };
    Ok(Some(name))
}

/// The `name=value` parameters after a header value's first `;`, with
/// quoted strings skipped over whole (a `;` inside quotes splits nothing).
fn params(value: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in value.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b';' if !quoted => {
                pieces.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&value[start..]);
    pieces.into_iter().skip(1).filter_map(|p| {
        let eq = p.iter().position(|&b| b == b'=')?;
        Some((p[..eq].trim_ascii(), p[eq + 1..].trim_ascii()))
    })
}

/// The next part, its head read within [`PART_HEAD_LIMIT`].
async fn next_part(
    mp: &mut multer::Multipart<'static>,
    head: &HeadBudget,
) -> multer::Result<Option<multer::Field<'static>>> {
    head.start();
    let next = mp.next_field().await;
    head.end();
    next
}

/// The bytes read from the body while multer looks for the next part's body.
#[derive(Default)]
struct HeadBudget {
    reading_head: AtomicBool,
    read: AtomicUsize,
    /// The size of the last chunk read, which multer may not have scanned yet.
    last: AtomicUsize,
}

impl HeadBudget {
    fn start(&self) {
        self.read.store(0, Ordering::Relaxed);
        self.last.store(0, Ordering::Relaxed);
        self.reading_head.store(true, Ordering::Relaxed);
    }

    fn end(&self) {
        self.reading_head.store(false, Ordering::Relaxed);
    }

    fn count(&self, n: usize) {
        if self.reading_head.load(Ordering::Relaxed) {
            self.read.fetch_add(n, Ordering::Relaxed);
            self.last.store(n, Ordering::Relaxed);
        }
    }

    /// Whether multer, asking for more, has already scanned a whole budget
    /// without finding the head's end. It is fed one chunk per pull (see
    /// [`Guarded`]) and scans before it pulls again, except that it may pull
    /// once before scanning the last chunk; so everything read before that
    /// chunk belongs to the head, and a head within the limit never trips
    /// this, however large the chunk that ends it.
    fn spent(&self) -> bool {
        self.reading_head.load(Ordering::Relaxed)
            && self.read.load(Ordering::Relaxed) - self.last.load(Ordering::Relaxed)
                >= PART_HEAD_LIMIT
    }
}

/// The request body as multer reads it: a chunk must come within `idle`, and
/// a part head may not pass its budget. The errors reach the caller through
/// multer as `StreamReadFailed` (see [`multer_io`]).
fn guarded(body: Body, head: Arc<HeadBudget>, idle: Duration) -> Guarded {
    Guarded {
        body: body.into_data_stream(),
        head,
        idle,
        timer: Box::pin(tokio::time::sleep(idle)),
        waiting: false,
        handed_over: false,
        done: false,
    }
}

/// See [`guarded`]. multer pulls every chunk that is ready before it scans
/// (`StreamBuffer::poll_stream` loops until `Pending`), which would let a
/// fast client put a whole head in its buffer in one go; so after each
/// chunk this answers `Pending` once (waking the task at once), and multer
/// scans a chunk at a time.
struct Guarded {
    body: axum::body::BodyDataStream,
    head: Arc<HeadBudget>,
    idle: Duration,
    /// Set to `idle` from when the body starts waiting for the client.
    timer: Pin<Box<tokio::time::Sleep>>,
    waiting: bool,
    /// A chunk was handed over by the last poll.
    handed_over: bool,
    done: bool,
}

impl Stream for Guarded {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if std::mem::take(&mut this.handed_over) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if this.head.spent() {
            this.done = true;
            let why = format!(
                "multipart preamble and part headers must end within {PART_HEAD_LIMIT} bytes"
            );
            return Poll::Ready(Some(Err(invalid_body(why))));
        }
        match this.body.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                this.head.count(chunk.len());
                this.waiting = false;
                this.handed_over = true;
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                Poll::Ready(Some(Err(BodyError::Read(io::Error::other(e)))))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if !std::mem::replace(&mut this.waiting, true) {
                    let deadline = tokio::time::Instant::now() + this.idle;
                    this.timer.as_mut().reset(deadline);
                }
                if this.timer.as_mut().poll(cx).is_ready() {
                    this.done = true;
                    return Poll::Ready(Some(Err(BodyError::Idle(this.idle))));
                }
                Poll::Pending
            }
        }
    }
}

fn multer_err(e: multer::Error) -> DomainError {
    multer_io(e).into()
}

/// A multer error as a body error: the body stream's own errors come back
/// as they were raised (an idle body stays a 408, not a malformed body).
fn multer_io(e: multer::Error) -> BodyError {
    match e {
        multer::Error::StreamReadFailed(inner) => match inner.downcast::<BodyError>() {
            Ok(body) => *body,
            Err(inner) => BodyError::Read(io::Error::other(inner)),
        },
        e => invalid_body(format!("malformed multipart body: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_filenames_are_decoded() {
        let name = |v: &str| extended_filename(v.as_bytes());
        assert_eq!(
            name(
                r#"form-data; name="file"; filename="a.txt"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt"#
            )
            .unwrap()
            .as_deref(),
            Some("résumé.txt")
        );
        assert_eq!(
            name("form-data; filename*=iso-8859-1'en'%E9t%E9.txt")
                .unwrap()
                .as_deref(),
            Some("été.txt")
        );
        assert_eq!(
            name(r#"form-data; name="file"; filename="x; filename*=UTF-8''no.txt""#).unwrap(),
            None,
            "inside a quoted string it is not a parameter"
        );
        assert!(name("form-data; filename*=UTF-8''%FF.txt").is_err());
        assert!(name("form-data; filename*=koi8-r''x.txt").is_err());
        assert!(name("form-data; filename*=plain.txt").is_err());
    }
}
