//! `Ports`: one adapter per port, bundled. `startup` connects them (see
//! `Ports::connect`) and builds the services on them; tests wrap an adapter
//! in between.

use std::sync::Arc;

use crate::{
    blob::{BlobStore, resumable::ResumableBlobs},
    lock::Locks,
    meta::MetadataStore,
    metrics::Metrics,
};

/// One adapter per port, as the settings chose them. Built first, so that
/// tests can wrap an adapter before the services are built on it.
#[derive(Clone)]
pub struct Ports {
    pub meta: Arc<dyn MetadataStore>,
    pub blobs: Arc<dyn BlobStore>,
    /// The same blob store's resumable writes (tus).
    pub resumable: Arc<dyn ResumableBlobs>,
    pub locks: Arc<Locks>,
    pub metrics: Arc<Metrics>,
}
