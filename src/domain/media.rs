//! Content types: detected from the first bytes when the client names none
//! (or only a placeholder), checked against the optional allow-list, and
//! judged safe or not to show inline.

use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, stream};

use super::DomainError;
pub use crate::config::media::{AllowedTypes, essence};
use crate::{
    blob::{BlobStore, BodyError, ByteRange, ByteStream},
    vocab::BlobKey,
};

/// How many leading bytes are read to detect a type: more than any of
/// `infer`'s signatures needs (the deepest, tar's, ends at byte 262; the
/// zip-based office formats look a few KiB in).
pub const SNIFF_BYTES: usize = 8 * 1024;

/// What a client sends when it does not know the type: none, the generic
/// one, or the one curl puts on `--data-binary`.
const PLACEHOLDERS: [&str; 2] = [
    "application/octet-stream",
    "application/x-www-form-urlencoded",
];

/// The generic type, when detection finds nothing.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Whether a type is safe for a browser to show inline (under the download's
/// `nosniff` and `sandbox`): images except SVG (which runs script), PDF and
/// plain text. Anything else is an attachment.
pub fn shows_inline(media_type: &str) -> bool {
    let e = essence(media_type);
    (e.starts_with("image/") && e != "image/svg+xml") || e == "application/pdf" || e == "text/plain"
}

/// The type to store for a body declared as `declared`, and the body to
/// store (its sniffed head put back in front). Detection is `infer`'s
/// signatures, then UTF-8 text (`text/plain`), else `application/octet-stream`. The bytes are looked at when
/// the declared type is a placeholder (to detect the real one) or an
/// allow-list is set (a type detected from the bytes must be allowed too,
/// so a claimed `image/png` cannot carry an executable past it).
pub async fn resolve<'a>(
    declared: &str,
    body: ByteStream<'a>,
    allowed: &AllowedTypes,
    idle: Duration,
) -> Result<(String, ByteStream<'a>), DomainError> {
    let placeholder = PLACEHOLDERS.contains(&essence(declared).as_str());
    if !placeholder && allowed.is_empty() {
        return Ok((declared.to_owned(), body));
    }
    let (head, body) = sniff(body, idle).await?;
    let head = head.concat();
    let detected = infer::get(&head)
        .map(|t| t.mime_type().to_owned())
        .or_else(|| looks_like_text(&head).then(|| TEXT.to_owned()));
    let stored = match (&detected, placeholder) {
        (Some(t), true) => t.clone(),
        (None, true) => OCTET_STREAM.to_owned(),
        (_, false) => declared.to_owned(),
    };
    for t in std::iter::once(&stored).chain(&detected) {
        if !allowed.allows(t) {
            return Err(DomainError::UnsupportedMediaType(format!(
                "content type {} is not accepted here; nothing was stored",
                essence(t)
            )));
        }
    }
    Ok((stored, body))
}

/// What UTF-8 text without a signature is stored as.
const TEXT: &str = "text/plain; charset=utf-8";

/// Whether `head` reads as UTF-8 text: no control characters but
/// whitespace (a sequence cut at the end of the head counts as text).
fn looks_like_text(head: &[u8]) -> bool {
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default()
        }
        Err(_) => return false,
    };
    !text.is_empty()
        && text
            .chars()
            .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r' | '\x0c'))
}

/// Reads up to [`SNIFF_BYTES`] of `body` (each read within `idle`); returns
/// them and the whole body, those chunks first.
async fn sniff(
    body: ByteStream<'_>,
    idle: Duration,
) -> Result<(Vec<Bytes>, ByteStream<'_>), DomainError> {
    // Fused: a body that ended within the head is not polled again (the
    // multipart stream must not be).
    let mut body = body.fuse();
    let mut head = Vec::new();
    let mut len = 0;
    while len < SNIFF_BYTES {
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(chunk)) => {
                let chunk = chunk?;
                len += chunk.len();
                head.push(chunk);
            }
            Ok(None) => break,
            Err(_) => return Err(BodyError::Idle(idle).into()),
        }
    }
    let replay = stream::iter(head.clone().into_iter().map(Ok));
    Ok((head, replay.chain(body).boxed()))
}

/// The type to store for a blob already stored at `key` (`len` bytes) whose
/// client declared `declared` (a resumable upload's): decided from its first
/// bytes as a plain upload's is ([`resolve`]). They are read from the store
/// only when needed (a placeholder declared, or an allow-list set) and not
/// at hand: `head`, the first bytes (up to [`SNIFF_BYTES`]) of a PATCH that
/// began at offset 0. Nothing is undone here, whatever the answer.
pub async fn stored_type(
    blobs: &dyn BlobStore,
    key: &BlobKey,
    declared: &str,
    len: u64,
    allowed: &AllowedTypes,
    idle: Duration,
    head: Option<Bytes>,
) -> Result<String, DomainError> {
    let placeholder = PLACEHOLDERS.contains(&essence(declared).as_str());
    let head: ByteStream<'_> = match (len, head) {
        (0, _) => Box::pin(stream::empty()),
        (_, _) if !placeholder && allowed.is_empty() => Box::pin(stream::empty()),
        (_, Some(head)) => Box::pin(stream::once(async move { Ok(head) })),
        _ => {
            let end = len.min(SNIFF_BYTES as u64) - 1;
            let range = ByteRange { start: 0, end };
            blobs.get(key, Some(range)).await?
        }
    };
    // The body is the store's here: a read that fails is the store's
    // failure, not a client's bad request.
    let (stored, _) = resolve(declared, head, allowed, idle)
        .await
        .map_err(|e| match e {
            DomainError::InvalidRequest(_) | DomainError::RequestTimeout(_) => {
                DomainError::DependencyUnavailable("blob store")
            }
            e => e,
        })?;
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_utf8_without_control_characters() {
        assert!(looks_like_text("héllo\r\n\tworld".as_bytes()));
        assert!(
            looks_like_text(&"aé".as_bytes()[..2]),
            "cut at the end of the head"
        );
        assert!(
            !looks_like_text(b"") && !looks_like_text(b"a\0b") && !looks_like_text(b"\xff\xfe")
        );
    }

    #[test]
    fn only_safe_types_show_inline() {
        for t in ["image/png", "application/pdf", "text/plain; charset=utf-8"] {
            assert!(shows_inline(t), "{t}");
        }
        for t in ["image/svg+xml", "text/html", "application/octet-stream"] {
            assert!(!shows_inline(t), "{t}");
        }
    }
}
