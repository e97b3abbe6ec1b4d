//! The rule the `shard_keys` test holds every MongoDB command to (README
//! "Scaling out: MongoDB sharded"): a command on a sharded collection names
//! the first field of the collection's shard key as an equality (a value or
//! `$eq`), so that a sharded cluster sends it to the one shard that holds
//! the owner's documents. `$in` of values is enough for the commands that
//! may touch many documents (a find, a count, an update or delete of many),
//! which go to the shards of those values; a single-document write
//! (`findAndModify`, an update or delete of one) must name one value: before
//! 7.1 MongoDB refuses a `findAndModify` without it. An insert carries the
//! field in each document it writes.

use bson::{Bson, Document};
use filedock::meta::mongo::SentCommand;

/// Each collection filedock writes, and the first field of its shard key
/// (`None`: unsharded, on the primary shard). A collection not listed here
/// fails the test: a new one must say how it is sharded.
pub const SHARD_KEYS: &[(&str, Option<&str>)] = &[
    ("users", Some("_id")),
    ("files", Some("owner_id")),
    ("sessions", Some("owner_id")),
    ("agents", Some("owner_id")),
    ("events", Some("owner_id")),
    ("upload_intents", Some("user_id")),
    ("resumable_uploads", Some("user_id")),
    ("revoked_keys", Some("user_id")),
    ("permissions", Some("user_id")),
    ("idempotency", Some("file.owner_id")),
    // Found by hash before their owner is known.
    ("api_keys", Some("hash")),
    ("api_tokens", Some("hash")),
    ("processed_ops", None),
    ("event_feed", None),
    ("txn_holders", None),
    ("orphan_minio_objects", None),
    ("webhook_marks", None),
    ("webhook_dead", None),
];

/// One filter (or inserted document) of a command, as the rule sees it.
#[derive(Debug)]
pub struct Sent<'a> {
    /// The step of the workload it was recorded in.
    pub step: &'a str,
    pub command: &'a str,
    pub collection: &'a str,
    /// The filter, or the document an insert writes.
    pub filter: Document,
    /// Whether the command may touch many documents (`$in` will do).
    pub multi: bool,
}

impl Sent<'_> {
    /// Whether the filter's (or document's) top-level fields are exactly `fields`.
    pub fn has_fields(&self, fields: &[&str]) -> bool {
        let mut mine: Vec<&str> = self.filter.keys().map(String::as_str).collect();
        mine.sort_unstable();
        let mut theirs = fields.to_vec();
        theirs.sort_unstable();
        mine == theirs
    }
}

impl std::fmt::Display for Sent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, of) = match (self.command, self.multi) {
            ("insert", _) => ("document", ""),
            ("update" | "delete", true) => ("filter", " (of many)"),
            ("update" | "delete", false) => ("filter", " (of one)"),
            _ => ("filter", ""),
        };
        write!(
            f,
            "[{}] {}{of} on {}, {what} {}",
            self.step, self.command, self.collection, self.filter
        )
    }
}

/// The filters (or inserted documents) of `command`, each with whether the
/// shard-key rule holds for it; `Err` for a collection not in [`SHARD_KEYS`].
/// Commands that name no documents (`getMore`, `commitTransaction`, …) give none.
pub fn filters<'a>(
    step: &'a str,
    command: &'a SentCommand,
) -> Result<Vec<(Sent<'a>, bool)>, String> {
    let name = command.name.as_str();
    let body = &command.body;
    let parts: Vec<(Document, bool)> = match name {
        "find" => vec![(doc_at(body, "filter"), true)],
        "count" | "distinct" => vec![(doc_at(body, "query"), true)],
        "findAndModify" => vec![(doc_at(body, "query"), false)],
        "aggregate" => vec![(first_match(body), true)],
        "update" => statements(body, "updates", |s| s.get_bool("multi").unwrap_or(false)),
        "delete" => statements(body, "deletes", |s| limit(s) == Some(0)),
        "insert" => (body.get_array("documents").map(Vec::as_slice))
            .unwrap_or_default()
            .iter()
            .filter_map(Bson::as_document)
            .map(|d| (d.clone(), false))
            .collect(),
        "bulkWrite" => return bulk_filters(step, body),
        _ => return Ok(Vec::new()),
    };
    let Some(collection) = command.collection() else {
        return Ok(Vec::new());
    };
    held(step, name, collection, parts)
}

/// A `bulkWrite`'s writes, each held to the rule as the single-collection
/// command of its kind on its own collection would be.
fn bulk_filters<'a>(step: &'a str, body: &'a Document) -> Result<Vec<(Sent<'a>, bool)>, String> {
    let spaces: Vec<&str> = (body.get_array("nsInfo").map(Vec::as_slice))
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.as_document()?.get_str("ns").ok())
        .map(|ns| ns.split_once('.').map_or(ns, |(_, c)| c))
        .collect();
    let ops = (body.get_array("ops").map(Vec::as_slice)).unwrap_or_default();
    assert!(!ops.is_empty(), "a bulkWrite with no writes seen: {body}");
    let mut out = Vec::new();
    for op in ops.iter().filter_map(Bson::as_document) {
        let multi = op.get_bool("multi").unwrap_or(false);
        let (name, part) = match () {
            _ if op.contains_key("insert") => ("insert", (doc_at(op, "document"), false)),
            _ if op.contains_key("update") => ("update", (doc_at(op, "filter"), multi)),
            _ if op.contains_key("delete") => ("delete", (doc_at(op, "filter"), multi)),
            _ => return Err(format!("a bulkWrite write of no known kind: {op}")),
        };
        let index = op
            .get(name)
            .and_then(Bson::as_i64)
            .or_else(|| op.get_i32(name).ok().map(i64::from));
        let Some(&collection) = index.and_then(|i| spaces.get(usize::try_from(i).ok()?)) else {
            return Err(format!("a bulkWrite write naming no namespace: {op}"));
        };
        out.extend(held(step, name, collection, vec![part])?);
    }
    Ok(out)
}

/// `parts` of command `name` on `collection`, each with whether the rule
/// holds for it.
fn held<'a>(
    step: &'a str,
    name: &'a str,
    collection: &'a str,
    parts: Vec<(Document, bool)>,
) -> Result<Vec<(Sent<'a>, bool)>, String> {
    let Some((_, key)) = SHARD_KEYS.iter().find(|(c, _)| *c == collection) else {
        return Err(format!(
            "{name} on {collection}: a collection the shard-key table does not list"
        ));
    };
    Ok(parts
        .into_iter()
        .map(|(filter, multi)| {
            let holds = match key {
                None => true,
                Some(field) if name == "insert" => path(&filter, field).is_some(),
                Some(field) => names_value(&filter, field, multi),
            };
            let sent = Sent {
                step,
                command: name,
                collection,
                filter,
                multi,
            };
            (sent, holds)
        })
        .collect())
}

/// Whether `filter` holds `field` to one value (or, for a command of many
/// documents, to a list of values), at its top or within a top-level `$and`.
fn names_value(filter: &Document, field: &str, multi: bool) -> bool {
    let direct = filter.get(field).is_some_and(|v| match v {
        Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => {
            d.len() == 1 && (d.contains_key("$eq") || (multi && d.get_array("$in").is_ok()))
        }
        _ => true,
    });
    direct
        || filter.get_array("$and").is_ok_and(|all| {
            all.iter()
                .filter_map(Bson::as_document)
                .any(|d| names_value(d, field, multi))
        })
}

/// The value at a dotted `path` of `doc`, if any and not null.
fn path<'d>(doc: &'d Document, path: &str) -> Option<&'d Bson> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    match (doc.get(head)?, rest) {
        (Bson::Null, _) => None,
        (v, None) => Some(v),
        (Bson::Document(inner), Some(r)) => self::path(inner, r),
        _ => None,
    }
}

/// The document at `field` of `body` (an absent filter is an empty one).
fn doc_at(body: &Document, field: &str) -> Document {
    body.get_document(field).cloned().unwrap_or_default()
}

/// An aggregate's first `$match` (none: an empty filter, every document).
fn first_match(body: &Document) -> Document {
    let first = body.get_array("pipeline").ok().and_then(|p| p.first());
    first
        .and_then(Bson::as_document)
        .and_then(|stage| stage.get_document("$match").ok())
        .cloned()
        .unwrap_or_default()
}

/// The statements of an update or a delete (`updates`, `deletes`): each
/// one's filter (`q`) and whether it may touch many documents.
fn statements(
    body: &Document,
    field: &str,
    multi: impl Fn(&Document) -> bool,
) -> Vec<(Document, bool)> {
    let listed = body.get_array(field).map(Vec::as_slice).unwrap_or_default();
    listed
        .iter()
        .filter_map(Bson::as_document)
        .map(|s| (doc_at(s, "q"), multi(s)))
        .collect()
}

/// A delete statement's `limit` (0: every match, 1: one).
fn limit(statement: &Document) -> Option<i64> {
    match statement.get("limit")? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}
