//! Limits on an upload body as it is read, the same for every upload path:
//! the client's idle time and the body's size.

use std::time::Duration;

use futures::StreamExt;

use super::{BodyError, ByteStream};

/// `body`, failing with [`BodyError::Idle`] once the client has sent nothing
/// for `idle` (it holds a connection and perhaps a lock) and with
/// [`BodyError::TooLarge`] as soon as it passes `max` bytes.
pub fn bounded(body: ByteStream<'_>, idle: Duration, max: u64) -> ByteStream<'_> {
    let body = futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(body))),
            Ok(None) => None,
            Err(_) => Some((Err(BodyError::Idle(idle)), None)),
        }
    });
    let mut size = 0u64;
    body.map(move |chunk| {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > max {
            return Err(BodyError::TooLarge(max));
        }
        Ok(chunk)
    })
    .boxed()
}
