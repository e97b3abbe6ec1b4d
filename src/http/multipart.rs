//! `multipart/form-data` uploads: the `file` part is streamed, never
//! buffered; any other part is skipped; a second `file` part is an error
//! that surfaces before the upload commits.

use std::io;

use bytes::Bytes;
use futures::{StreamExt, stream};

use super::error::ApiError;
use crate::blob::{BodyError, ByteStream};

/// What the `file` part says about itself.
pub struct FilePart {
    pub filename: Option<String>,
    pub content_type: Option<String>,
}

fn invalid(e: multer::Error) -> ApiError {
    ApiError::invalid(format!("malformed multipart body: {e}"))
}

fn invalid_body(why: impl Into<String>) -> BodyError {
    BodyError::Invalid(why.into())
}

/// Finds the `file` part and returns it with a stream of its bytes. The
/// stream ends only after the rest of the body has been read and found to
/// hold no second `file` part.
pub async fn file_part(
    mut mp: multer::Multipart<'static>,
) -> Result<(FilePart, ByteStream<'static>), ApiError> {
    let field = loop {
        match mp.next_field().await.map_err(invalid)? {
            Some(f) if f.name() == Some("file") => break f,
            Some(mut other) => while other.chunk().await.map_err(invalid)?.is_some() {},
            None => {
                return Err(ApiError::invalid(
                    "multipart body has no part named \"file\"",
                ));
            }
        }
    };
    let part = FilePart {
        filename: field.file_name().map(str::to_owned),
        content_type: field.content_type().map(ToString::to_string),
    };
    // `None` once the body has ended or failed.
    let body = stream::unfold(Some((mp, field)), |state| async move {
        let (mut mp, mut field) = state?;
        match field.chunk().await {
            Ok(Some(chunk)) => return Some((Ok::<Bytes, BodyError>(chunk), Some((mp, field)))),
            Ok(None) => {}
            Err(e) => return Some((Err(multer_io(e)), None)),
        }
        // The file part is done (multer needs it dropped before the next
        // field): read the rest before the upload may commit.
        drop(field);
        loop {
            match mp.next_field().await {
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

fn multer_io(e: multer::Error) -> BodyError {
    match e {
        multer::Error::StreamReadFailed(inner) => BodyError::Read(io::Error::other(inner)),
        e => invalid_body(format!("malformed multipart body: {e}")),
    }
}
