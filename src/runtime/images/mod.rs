//! Air-gapped images: imports image tarballs (OCI image layouts and `docker save` archives; plain,
//! gzip or zstd) into containerd's content store and image records through containerd's own gRPC API,
//! as `ctr images import` does, and watches `<data-dir>/agent/images/` the way k3s does.
//!
//! An import runs under a lease (so containerd's GC never collects half-imported blobs), streams every
//! blob into the content service without holding a layer in memory, skips blobs containerd already
//! has, verifies digests, sets the `containerd.io/gc.ref.content.*` labels that keep layers alive
//! once the lease is gone, and creates or updates one image record per name. Unpacking is left to the
//! CRI plugin, which unpacks an image the first time a container uses it.
//!
//! The tar is read on a blocking thread (the `tar` crate is synchronous); that thread makes its
//! containerd calls through the runtime's handle.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail};
use containerd_client::services::v1 as api;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::types::Descriptor;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::runtime::Handle;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::oci_image::{self, normalize_reference, sha256_digest};

mod content;
mod dir;
mod tarball;
#[cfg(test)]
mod tests;

use content::*;
pub use dir::{ImageDir, imported_references};
use tarball::*;
pub use tarball::{progress_logger, progress_logger_named};

/// The CRI plugin's namespace: images imported here are the ones kubelet-style clients see.
pub const NAMESPACE: &str = "k8s.io";
/// Bytes per content write message (containerd accepts up to 16 MiB).
const CHUNK: usize = 1 << 20;
/// Files up to this size are read into memory (JSON, small layers); larger ones are streamed.
const SMALL: u64 = 1 << 20;
/// At most this much of a tarball is held in memory at once.
const MEMORY_BUDGET: u64 = 64 << 20;
/// Largest manifest, index or config accepted.
const JSON_LIMIT: u64 = 16 << 20;
/// Unary calls to containerd.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Files over this size get progress lines in the log.
const PROGRESS_MIN_SIZE: u64 = 16 << 20;
/// A file modified this recently may still be being written.
const SETTLE_TIME: Duration = Duration::from_secs(2);

const LABEL_GC_EXPIRE: &str = "containerd.io/gc.expire";
const LABEL_GC_CONFIG: &str = "containerd.io/gc.ref.content.config";

/// Connects to containerd's gRPC socket (a Unix socket path).
pub async fn connect(socket: &Path) -> Result<Channel> {
    super::cri::connect(socket).await.with_context(|| format!("connecting to containerd at {}", socket.display()))
}

/// What happened to an image record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageChange {
    Created,
    Updated,
    Unchanged,
}

/// An image record the import created, updated or found already pointing at the same target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Normalized reference, e.g. `docker.io/library/busybox:latest`.
    pub reference: String,
    /// Digest of the image's target (manifest or index).
    pub digest: String,
    pub change: ImageChange,
}

/// Totals since the importer was created (shared by its clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Blobs committed to the content store.
    pub blobs_written: u64,
    /// Bytes sent to the content store (including writes that turned out to be duplicates).
    pub bytes_written: u64,
    /// Blobs the content store already had.
    pub blobs_skipped: u64,
    /// Blobs whose GC labels were set or changed.
    pub labels_updated: u64,
    pub images_created: u64,
    pub images_updated: u64,
}

#[derive(Default)]
struct Counters {
    blobs_written: AtomicU64,
    bytes_written: AtomicU64,
    blobs_skipped: AtomicU64,
    labels_updated: AtomicU64,
    images_created: AtomicU64,
    images_updated: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Imports tarballs into containerd (namespace `k8s.io`). Cheap to clone.
#[derive(Clone)]
pub struct Importer {
    channel: Channel,
    namespace: String,
    counters: Arc<Counters>,
}

impl Importer {
    pub fn new(channel: Channel) -> Self {
        Importer { channel, namespace: NAMESPACE.into(), counters: Arc::default() }
    }

    /// Another containerd namespace than `k8s.io`.
    #[cfg(test)]
    #[allow(dead_code, reason = "used by tests/containerd_images.rs")]
    pub fn with_namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    pub fn stats(&self) -> ImportStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ImportStats {
            blobs_written: get(&c.blobs_written),
            bytes_written: get(&c.bytes_written),
            blobs_skipped: get(&c.blobs_skipped),
            labels_updated: get(&c.labels_updated),
            images_created: get(&c.images_created),
            images_updated: get(&c.images_updated),
        }
    }

    /// Imports one tarball: an OCI image layout or a `docker save` archive, plain, gzip or zstd
    /// (recognized by their magic bytes). Streams; calls `progress(done, total)` with the file bytes
    /// read so far a few times a second. Errors name the file and what is wrong with it.
    pub async fn import_file(&self, path: &Path, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Vec<Imported>> {
        self.import_path(path, progress).await.with_context(|| path.display().to_string())
    }

    async fn import_path(&self, path: &Path, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Vec<Imported>> {
        let file = std::fs::File::open(path).context("opening the file")?;
        let total = file.metadata().context("reading the file's size")?.len();
        self.import_source(Box::new(file), total, progress).await
    }

    /// Imports an in-memory tarball (the built-in sandbox image).
    pub async fn import_bytes(&self, tar: &[u8]) -> Result<Vec<Imported>> {
        let total = tar.len() as u64;
        self.import_source(Box::new(io::Cursor::new(tar.to_vec())), total, &|_, _| {})
            .await
            .context("importing an in-memory image tarball")
    }

    async fn import_source(
        &self,
        source: Box<dyn ReadSeek>,
        total: u64,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Vec<Imported>> {
        let lease = self.create_lease().await?;
        let cancel = Arc::new(AtomicBool::new(false));
        let mut guard = LeaseGuard { importer: self.clone(), lease: Some(lease.clone()), cancel: cancel.clone() };
        let store = GrpcStore {
            importer: self.clone(),
            lease: lease.clone(),
            handle: Handle::current(),
            cancel,
            seq: 0.into(),
        };
        let done = Arc::new(AtomicU64::new(0));
        let reader_done = done.clone();
        let mut job = tokio::task::spawn_blocking(move || import_sync(&store, source, &reader_done));
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        // Every tick, moved or not, so a caller can print a line a second even while containerd
        // verifies a big blob.
        let result = loop {
            tokio::select! {
                res = &mut job => break res.unwrap_or_else(|e| Err(anyhow::Error::new(Unavailable(format!("the import thread failed: {e}"))))),
                _ = tick.tick() => progress(done.load(Ordering::Relaxed).min(total), total),
            }
        };
        if result.is_ok() {
            progress(total, total);
        }
        guard.lease = None;
        self.delete_lease(&lease).await;
        result
    }

    fn request<T>(&self, msg: T, lease: Option<&str>) -> Request<T> {
        let mut req = Request::new(msg);
        let md = req.metadata_mut();
        md.insert("containerd-namespace", self.namespace.parse().expect("namespace is ASCII"));
        if let Some(lease) = lease {
            md.insert("containerd-lease", lease.parse().expect("lease id is ASCII"));
        }
        req
    }

    fn unary<T>(&self, msg: T, lease: Option<&str>) -> Request<T> {
        let mut req = self.request(msg, lease);
        req.set_timeout(CALL_TIMEOUT);
        req
    }

    async fn create_lease(&self) -> Result<String> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let id = format!("cairn-import-{nanos:x}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        // Should cairn die mid-import, the lease (and what it holds) goes away by itself.
        let expire =
            (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let req = api::CreateRequest { id: id.clone(), labels: HashMap::from([(LABEL_GC_EXPIRE.to_string(), expire)]) };
        LeasesClient::new(self.channel.clone())
            .create(self.unary(req, None))
            .await
            .map_err(|s| status_error("creating a lease for the import", s))?;
        Ok(id)
    }

    async fn delete_lease(&self, id: &str) {
        let req = api::DeleteRequest { id: id.to_string(), sync: false };
        if let Err(s) = LeasesClient::new(self.channel.clone()).delete(self.unary(req, None)).await {
            tracing::warn!("deleting import lease {id}: {} (it expires within an hour)", s.message());
        }
    }
}

/// Cancels the import thread and drops the lease when an import future is dropped midway.
struct LeaseGuard {
    importer: Importer,
    lease: Option<String>,
    cancel: Arc<AtomicBool>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.cancel.store(true, Ordering::Relaxed);
            if let Ok(handle) = Handle::try_current() {
                let importer = self.importer.clone();
                handle.spawn(async move { importer.delete_lease(&lease).await });
            }
        }
    }
}

/// A failure that may pass by itself: containerd down, restarting or overloaded.
#[derive(Debug)]
struct Unavailable(String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// Whether an import failed for a passing reason (containerd unreachable) rather than because of
/// the tarball: worth trying again without the file changing.
pub fn is_transient(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<Unavailable>())
}

/// containerd's answer as an error. Only answers about the content itself (invalid, missing,
/// conflicting) blame the tarball; anything else, including a connection dropped mid-stream (which
/// tonic reports as Unknown or Internal), is worth trying again.
fn status_error(op: &str, s: Status) -> anyhow::Error {
    let msg = format!("{op}: containerd: {} ({:?})", s.message(), s.code());
    match s.code() {
        Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::FailedPrecondition | Code::OutOfRange => {
            anyhow!(msg)
        }
        _ => anyhow::Error::new(Unavailable(msg)),
    }
}
