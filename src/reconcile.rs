//! `filedock reconcile`: audits the bucket against the metadata. Objects with
//! no file record and no upload in flight are strays; file records whose
//! object is missing are reported. Strays are deleted only when asked.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::{meta::FileRecord, startup::AppState};

#[derive(Debug, Default, Serialize)]
pub struct ReconcileReport {
    pub objects: usize,
    pub files: usize,
    /// Objects with neither a file record nor an upload intent.
    pub strays: Vec<String>,
    /// File ids whose object is missing.
    pub missing: Vec<String>,
    pub deleted: usize,
}

pub async fn reconcile(state: &AppState, delete_strays: bool) -> anyhow::Result<ReconcileReport> {
    // Intents first: an upload that commits during the audit had an intent.
    let far = crate::meta::now() + chrono::Duration::days(3650);
    let in_flight: HashSet<String> = state
        .meta
        .intents(far, usize::MAX)
        .await?
        .into_iter()
        .map(|i| i.key)
        .collect();
    let mut files: HashMap<String, FileRecord> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = state.meta.all_files(after.as_deref(), 1000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        files.extend(page.into_iter().map(|f| (f.key.clone(), f)));
    }
    let objects: HashSet<String> = state.blobs.list_keys("files/").await?.into_iter().collect();
    let mut report = ReconcileReport {
        objects: objects.len(),
        files: files.len(),
        ..Default::default()
    };
    for key in &objects {
        if !files.contains_key(key) && !in_flight.contains(key) {
            report.strays.push(key.clone());
        }
    }
    for (key, f) in &files {
        if !objects.contains(key) {
            report.missing.push(f.id.clone());
        }
    }
    report.strays.sort();
    report.missing.sort();
    if delete_strays {
        for key in &report.strays {
            // A stray may have gained a record since it was listed.
            if is_still_stray(state, key).await? {
                state.blobs.delete(key).await?;
                report.deleted += 1;
            }
        }
    }
    Ok(report)
}

async fn is_still_stray(state: &AppState, key: &str) -> anyhow::Result<bool> {
    // Keys are `files/{user}/{file}`.
    let mut parts = key.split('/').skip(1);
    let (Some(user), Some(file)) = (parts.next(), parts.next()) else {
        return Ok(true);
    };
    Ok(state.meta.file(user, file).await?.is_none())
}
