//! Conditional and range requests on a file (RFC 9110 §13, §14). A file's
//! bytes never change, so its `ETag` (the quoted SHA-256) is strong and a
//! check made before acting on it stays true.

use axum::http::{HeaderMap, header};

use super::error::ApiError;
use crate::blob::ByteRange;

/// The strong entity tag of a file with this SHA-256.
pub fn etag(sha256: &str) -> String {
    format!("\"{sha256}\"")
}

/// The entity tags a list-valued header names (`*` kept as is), each with
/// whether it was weak (`W/"…"`).
fn tags(headers: &HeaderMap, name: header::HeaderName) -> Vec<(bool, &str)> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| match t.strip_prefix("W/") {
            Some(opaque) => (true, opaque),
            None => (false, t),
        })
        .collect()
}

/// `If-None-Match` names `etag` or `*`: the weak comparison (§13.1.2), so
/// `W/"x"` matches `"x"`. A GET then answers 304.
pub fn none_match_hits(headers: &HeaderMap, etag: &str) -> bool {
    tags(headers, header::IF_NONE_MATCH)
        .iter()
        .any(|&(_, t)| t == "*" || t == etag)
}

/// `If-Match` is sent and names neither `etag` (strong comparison, so a weak
/// tag never matches, §13.1.1) nor `*`: the request fails with 412.
pub fn match_fails(headers: &HeaderMap, etag: &str) -> bool {
    let tags = tags(headers, header::IF_MATCH);
    !tags.is_empty()
        && !tags
            .iter()
            .any(|&(weak, t)| t == "*" || (!weak && t == etag))
}

/// Whether a `Range` is to be honoured: no `If-Range`, or one naming this
/// strong `etag` (§13.1.5). A date never matches: no `Last-Modified` is sent.
pub fn range_applies(headers: &HeaderMap, etag: &str) -> bool {
    match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) => v.to_str().is_ok_and(|v| v.trim() == etag),
    }
}

/// The one range of `raw` (a `Range` value) to send of a `size`-byte file;
/// `None` to send the whole file (a malformed or non-bytes header is
/// ignored, §14.2; several ranges are answered with the whole file), or 416
/// when no range of it is satisfiable (§14.1.2).
pub fn requested_range(raw: &str, size: u64) -> Result<Option<ByteRange>, ApiError> {
    let Some(set) = raw.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    let mut specs = Vec::new();
    for spec in set.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match parse_spec(spec) {
            Some(s) => specs.push(s),
            None => return Ok(None),
        }
    }
    let satisfiable: Vec<ByteRange> = specs.iter().filter_map(|s| s.within(size)).collect();
    match (specs.len(), satisfiable.as_slice()) {
        (_, []) => Err(ApiError::RangeNotSatisfiable { size }),
        (1, [one]) => Ok(Some(*one)),
        _ => Ok(None),
    }
}

/// One range-spec of a `Range: bytes=` set.
enum Spec {
    /// `first-` or `first-last`.
    From { first: u64, last: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix(u64),
}

/// A range-spec, or `None` if it is not one (then the header is ignored).
fn parse_spec(spec: &str) -> Option<Spec> {
    let (first, last) = spec.split_once('-')?;
    let digits = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    if first.is_empty() {
        return Some(Spec::Suffix(digits(last)?));
    }
    let first = digits(first)?;
    let last = if last.is_empty() {
        None
    } else {
        Some(digits(last)?)
    };
    if last.is_some_and(|l| l < first) {
        return None; // invalid (§14.1.1): the whole header is ignored
    }
    Some(Spec::From { first, last })
}

impl Spec {
    /// The bytes of a `size`-byte file this spec selects, if any.
    fn within(&self, size: u64) -> Option<ByteRange> {
        let end = size.checked_sub(1)?;
        match *self {
            Self::From { first, last } if first <= end => Some(ByteRange {
                start: first,
                end: last.map_or(end, |l| l.min(end)),
            }),
            Self::From { .. } | Self::Suffix(0) => None,
            // A suffix longer than the file selects all of it.
            Self::Suffix(n) => Some(ByteRange {
                start: size.saturating_sub(n),
                end,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(raw: &str, size: u64) -> Result<Option<(u64, u64)>, u64> {
        match requested_range(raw, size) {
            Ok(r) => Ok(r.map(|r| (r.start, r.end))),
            Err(ApiError::RangeNotSatisfiable { size }) => Err(size),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn ranges_per_rfc_9110() {
        assert_eq!(range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=90-500", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-500", 100), Ok(Some((0, 99))), "longer suffix");
        assert_eq!(range("bytes=-0", 100), Err(100));
        assert_eq!(range("bytes=200-300", 100), Err(100));
        assert_eq!(range("bytes=0-0", 0), Err(0));
        assert_eq!(range("bytes=-5", 0), Err(0));
        assert_eq!(range("bytes=0-1,5-6", 100), Ok(None), "several: whole file");
        assert_eq!(range("bytes=200-,-0", 100), Err(100));
        for ignored in [
            "nonsense",
            "items=0-1",
            "bytes=5-3",
            "bytes=a-",
            "bytes=+1-2",
        ] {
            assert_eq!(range(ignored, 100), Ok(None), "{ignored}");
        }
    }

    #[test]
    fn entity_tags_compare_weakly_for_none_match_and_strongly_otherwise() {
        let h = |name: header::HeaderName, v: &str| {
            let mut m = HeaderMap::new();
            m.insert(name, v.parse().unwrap());
            m
        };
        let tag = "\"abc\"";
        assert!(none_match_hits(&h(header::IF_NONE_MATCH, "W/\"abc\""), tag));
        assert!(none_match_hits(
            &h(header::IF_NONE_MATCH, "\"x\", \"abc\""),
            tag
        ));
        assert!(!none_match_hits(&h(header::IF_NONE_MATCH, "\"x\""), tag));
        assert!(!match_fails(&HeaderMap::new(), tag));
        assert!(!match_fails(&h(header::IF_MATCH, "\"abc\""), tag));
        assert!(!match_fails(&h(header::IF_MATCH, "*"), tag));
        assert!(match_fails(&h(header::IF_MATCH, "\"x\""), tag));
        assert!(match_fails(&h(header::IF_MATCH, "W/\"abc\""), tag));
        assert!(range_applies(&HeaderMap::new(), tag));
        assert!(range_applies(&h(header::IF_RANGE, "\"abc\""), tag));
        assert!(!range_applies(&h(header::IF_RANGE, "\"x\""), tag));
        assert!(!range_applies(&h(header::IF_RANGE, "W/\"abc\""), tag));
    }
}
