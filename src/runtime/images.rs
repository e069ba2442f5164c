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

// ---------------------------------------------------------------------------------------------
// The content store as the import thread sees it.

/// An image record's target.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    media_type: String,
    digest: String,
    size: i64,
    annotations: BTreeMap<String, String>,
}

/// The synchronous view of containerd that the import thread uses (a fake one in unit tests).
trait Store {
    /// The labels of a blob, or `None` when the store lacks it.
    fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>>;
    /// Starts writing a blob; `None` when `expected` is already there.
    fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>>;
    fn read(&self, digest: &str, limit: u64) -> Result<Vec<u8>>;
    /// Sets (only) the given labels on a blob.
    fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()>;
    fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange>;
    fn cancelled(&self) -> bool;
    fn count_skipped(&self) {}
}

trait BlobWriter {
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Commits what was written as `digest`; `Ok(false)` when the store had it already.
    fn commit(self: Box<Self>, digest: &str, size: u64) -> Result<bool>;
    fn abort(self: Box<Self>);
}

struct GrpcStore {
    importer: Importer,
    lease: String,
    handle: Handle,
    cancel: Arc<AtomicBool>,
    seq: AtomicU64,
}

type DrainResult = std::result::Result<Option<api::WriteContentResponse>, Status>;

/// One content `Write` stream: requests go through a channel, responses are drained by a task.
struct GrpcWriter<'a> {
    store: &'a GrpcStore,
    reference: String,
    tx: Option<tokio::sync::mpsc::Sender<api::WriteContentRequest>>,
    drain: Option<tokio::task::JoinHandle<DrainResult>>,
    offset: i64,
    finished: bool,
}

impl GrpcStore {
    fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.importer.channel.clone()).max_decoding_message_size(JSON_LIMIT as usize + (1 << 20))
    }
    fn req<T>(&self, msg: T) -> Request<T> {
        self.importer.unary(msg, Some(&self.lease))
    }
}

impl Store for GrpcStore {
    /// A blob found here is also added to the import's lease: it may be unreferenced (left by an
    /// earlier failed import), and garbage collection must not take it before the image points at it.
    fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>> {
        let req = self.req(api::InfoRequest { digest: digest.to_string() });
        let labels = match self.handle.block_on(self.content().info(req)) {
            Ok(resp) => resp.into_inner().info.map(|i| i.labels).unwrap_or_default(),
            Err(s) if s.code() == Code::NotFound => return Ok(None),
            Err(s) => return Err(status_error(&format!("looking up {digest}"), s)),
        };
        let hold = api::AddResourceRequest {
            id: self.lease.clone(),
            resource: Some(api::Resource { id: digest.to_string(), r#type: "content".into() }),
        };
        self.handle
            .block_on(LeasesClient::new(self.importer.channel.clone()).add_resource(self.importer.unary(hold, None)))
            .map_err(|s| status_error(&format!("holding {digest} in the import's lease"), s))?;
        Ok(Some(labels))
    }

    fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>> {
        let reference = format!("{}-{}", self.lease, self.seq.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let first = api::WriteContentRequest {
            action: api::WriteAction::Write as i32,
            r#ref: reference.clone(),
            total: expected.map_or(0, |(_, size)| size as i64),
            expected: expected.map(|(d, _)| d.to_string()).unwrap_or_default(),
            ..Default::default()
        };
        tx.try_send(first).expect("fresh channel has room");
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let req = self.importer.request(stream, Some(&self.lease));
        let mut client = self.content();
        let resp = match self.handle.block_on(client.write(req)) {
            Ok(resp) => resp,
            Err(s) if s.code() == Code::AlreadyExists => return Ok(None),
            Err(s) => return Err(status_error("starting a content write", s)),
        };
        let drain = self.handle.spawn(async move {
            let mut stream = resp.into_inner();
            let mut last = None;
            while let Some(msg) = stream.message().await? {
                last = Some(msg);
            }
            Ok(last)
        });
        Ok(Some(Box::new(GrpcWriter {
            store: self,
            reference,
            tx: Some(tx),
            drain: Some(drain),
            offset: 0,
            finished: false,
        })))
    }

    fn read(&self, digest: &str, limit: u64) -> Result<Vec<u8>> {
        let req = self.req(api::ReadContentRequest { digest: digest.to_string(), offset: 0, size: 0 });
        let mut client = self.content();
        self.handle.block_on(async {
            let mut stream =
                client.read(req).await.map_err(|s| status_error(&format!("reading {digest}"), s))?.into_inner();
            let mut out = Vec::new();
            while let Some(msg) = stream.message().await.map_err(|s| status_error(&format!("reading {digest}"), s))? {
                out.extend_from_slice(&msg.data);
                if out.len() as u64 > limit {
                    bail!("{digest} is larger than {limit} bytes");
                }
            }
            Ok(out)
        })
    }

    fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let req = self.req(api::UpdateRequest {
            info: Some(api::Info {
                digest: digest.to_string(),
                labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths: labels.keys().map(|k| format!("labels.{k}")).collect() }),
        });
        self.handle
            .block_on(self.content().update(req))
            .map_err(|s| status_error(&format!("labelling {digest}"), s))?;
        bump(&self.importer.counters.labels_updated, 1);
        Ok(())
    }

    fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange> {
        let desc = Descriptor {
            media_type: target.media_type.clone(),
            digest: target.digest.clone(),
            size: target.size,
            annotations: target.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let mut client = ImagesClient::new(self.importer.channel.clone());
        let counters = &self.importer.counters;
        for _ in 0..3 {
            match self.handle.block_on(client.get(self.req(api::GetImageRequest { name: name.to_string() }))) {
                Ok(resp) => {
                    let Some(existing) = resp.into_inner().image else {
                        bail!("containerd returned no image for {name}")
                    };
                    if existing.target.as_ref() == Some(&desc) {
                        return Ok(ImageChange::Unchanged);
                    }
                    let image = api::Image { target: Some(desc.clone()), ..existing };
                    let req = api::UpdateImageRequest {
                        image: Some(image),
                        update_mask: Some(prost_types::FieldMask { paths: vec!["target".into()] }),
                        source_date_epoch: None,
                    };
                    self.handle
                        .block_on(client.update(self.req(req)))
                        .map_err(|s| status_error(&format!("updating image {name}"), s))?;
                    bump(&counters.images_updated, 1);
                    return Ok(ImageChange::Updated);
                }
                Err(s) if s.code() == Code::NotFound => {
                    let image = api::Image { name: name.to_string(), target: Some(desc.clone()), ..Default::default() };
                    let req = api::CreateImageRequest { image: Some(image), source_date_epoch: None };
                    match self.handle.block_on(client.create(self.req(req))) {
                        Ok(_) => {
                            bump(&counters.images_created, 1);
                            return Ok(ImageChange::Created);
                        }
                        // Created meanwhile by someone else: look again.
                        Err(s) if s.code() == Code::AlreadyExists => continue,
                        Err(s) => return Err(status_error(&format!("creating image {name}"), s)),
                    }
                }
                Err(s) => return Err(status_error(&format!("looking up image {name}"), s)),
            }
        }
        bail!("image {name} keeps changing under the import")
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn count_skipped(&self) {
        bump(&self.importer.counters.blobs_skipped, 1);
    }
}

impl GrpcWriter<'_> {
    fn send(&mut self, msg: api::WriteContentRequest) -> Result<()> {
        let tx = self.tx.as_ref().ok_or_else(|| anyhow!("content write already closed"))?;
        let drain = self.drain.as_mut().ok_or_else(|| anyhow!("content write already closed"))?;
        // Send, unless containerd ended the stream meanwhile (then say why).
        let early = self.store.handle.block_on(async {
            tokio::select! {
                biased;
                sent = tx.send(msg) => sent.err().map(|_| None),
                ended = drain => Some(Some(ended)),
            }
        });
        match early {
            None => Ok(()),
            Some(ended) => {
                self.tx = None;
                let ended = match ended {
                    Some(e) => {
                        self.drain = None;
                        e
                    }
                    None => self.store.handle.block_on(self.drain.take().expect("drain present")),
                };
                match ended {
                    Ok(Err(s)) => Err(status_error("writing content", s)),
                    Ok(Ok(_)) => {
                        Err(anyhow::Error::new(Unavailable("writing content: containerd ended the write early".into())))
                    }
                    Err(e) => Err(anyhow!("writing content: {e}")),
                }
            }
        }
    }

    fn close(&mut self) -> Option<std::result::Result<DrainResult, tokio::task::JoinError>> {
        self.tx = None;
        let drain = self.drain.take()?;
        Some(self.store.handle.block_on(async {
            match tokio::time::timeout(Duration::from_secs(30), drain).await {
                Ok(r) => r,
                Err(_) => Ok(Err(Status::deadline_exceeded("no answer to the commit"))),
            }
        }))
    }

    fn abort_inner(&mut self) {
        self.finished = true;
        let _ = self.close();
        let req = self.store.req(api::AbortRequest { r#ref: self.reference.clone() });
        if let Err(s) = self.store.handle.block_on(self.store.content().abort(req))
            && s.code() != Code::NotFound
        {
            tracing::debug!("aborting content write {}: {}", self.reference, s.message());
        }
    }
}

impl BlobWriter for GrpcWriter<'_> {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let msg = api::WriteContentRequest {
            action: api::WriteAction::Write as i32,
            offset: self.offset,
            data: data.to_vec(),
            ..Default::default()
        };
        self.send(msg)?;
        self.offset += data.len() as i64;
        bump(&self.store.importer.counters.bytes_written, data.len() as u64);
        Ok(())
    }

    fn commit(mut self: Box<Self>, digest: &str, size: u64) -> Result<bool> {
        self.finished = true;
        let msg = api::WriteContentRequest {
            action: api::WriteAction::Commit as i32,
            offset: self.offset,
            total: size as i64,
            expected: digest.to_string(),
            ..Default::default()
        };
        let sent = self.send(msg);
        let ended = self.close();
        sent?;
        match ended {
            Some(Ok(Ok(_))) => {
                bump(&self.store.importer.counters.blobs_written, 1);
                Ok(true)
            }
            Some(Ok(Err(s))) if s.code() == Code::AlreadyExists => Ok(false),
            Some(Ok(Err(s))) => Err(status_error(&format!("committing {digest}"), s)),
            Some(Err(e)) => Err(anyhow!("committing {digest}: {e}")),
            None => Err(anyhow!("committing {digest}: the write was already closed")),
        }
    }

    fn abort(mut self: Box<Self>) {
        self.abort_inner();
    }
}

impl Drop for GrpcWriter<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.abort_inner();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading tarballs.

trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

/// How a tarball (or a layer inside one) is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// By magic bytes.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
    fn name(self) -> &'static str {
        match self {
            Compression::None => "tar",
            Compression::Gzip => "gzip-compressed tar",
            Compression::Zstd => "zstd-compressed tar",
        }
    }
}

/// Whether `block` (the first 512 bytes of a stream) is a tar header.
pub fn is_tar_header(block: &[u8]) -> bool {
    if block.len() < 512 {
        return false;
    }
    if &block[257..262] == b"ustar" {
        return true;
    }
    // Old v7 archives have no magic: check the header checksum.
    let stored = std::str::from_utf8(&block[148..156]).ok().map(|s| s.trim_matches(|c: char| c == '\0' || c == ' '));
    let Some(stored) = stored.and_then(|s| u32::from_str_radix(s, 8).ok()) else { return false };
    let sum: u32 = block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { b as u32 }).sum();
    sum == stored && block[0] != 0
}

/// What a file holds, from its first bytes: a (compressed) tarball or something else.
pub fn sniff_tarball(head: &[u8]) -> Option<Compression> {
    match Compression::sniff(head) {
        Compression::None if is_tar_header(head) => Some(Compression::None),
        Compression::None => None,
        c => Some(c),
    }
}

/// Reads up to `buf.len()` bytes (fewer only at the end of the stream).
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Counts what has been read (the import's progress).
struct Counted {
    inner: Box<dyn ReadSeek>,
    pos: u64,
    report: Option<Arc<AtomicU64>>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        if let Some(r) = &self.report {
            r.store(self.pos, Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl Seek for Counted {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        if let Some(r) = &self.report {
            r.store(self.pos, Ordering::Relaxed);
        }
        Ok(self.pos)
    }
}

/// Explains an I/O error while reading a tarball.
fn io_context(e: io::Error, what: &str) -> anyhow::Error {
    // The tar crate's word for a header cut short.
    if e.kind() == io::ErrorKind::UnexpectedEof || e.to_string().contains("failed to read entire block") {
        anyhow!("{what}: the file is truncated (unexpected end of data)")
    } else {
        anyhow!("{what}: {e}")
    }
}

/// A tar path as a clean relative path: no `./`, no leading or trailing `/`, `..` resolved.
fn clean_path(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out.join("/")
}

/// The digest named by a `blobs/<alg>/<hex>` path.
fn blob_path_digest(path: &str) -> Result<Option<String>> {
    let mut parts = path.split('/');
    let (Some("blobs"), Some(alg), Some(hex), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Ok(None);
    };
    if alg != "sha256" {
        bail!("{path}: unsupported digest algorithm {alg}");
    }
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(None);
    }
    Ok(Some(format!("sha256:{hex}")))
}

fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[derive(Debug, Clone, Deserialize)]
struct JsonDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct JsonIndex {
    #[serde(default)]
    manifests: Option<Vec<JsonDescriptor>>,
}

#[derive(Debug, Deserialize)]
struct JsonManifest {
    config: Option<JsonDescriptor>,
    #[serde(default)]
    layers: Vec<JsonDescriptor>,
}

/// One entry of a `docker save` manifest.json.
#[derive(Debug, Clone, Deserialize)]
struct DockerSaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

fn parse_docker_manifest(bytes: &[u8]) -> Result<Vec<DockerSaveEntry>> {
    serde_json::from_slice(bytes).context("manifest.json is not a docker save manifest")
}

/// The image name an index.json entry gives: `io.containerd.image.name`, else
/// `org.opencontainers.image.ref.name` when it is a whole reference rather than just a tag.
fn image_name(annotations: &BTreeMap<String, String>) -> Result<Option<String>> {
    if let Some(name) = annotations.get(oci_image::ANNOTATION_IMAGE_NAME).filter(|n| !n.is_empty()) {
        return normalize_reference(name).map(Some).map_err(|e| anyhow!(e));
    }
    match annotations.get(oci_image::ANNOTATION_REF_NAME) {
        Some(r) if r.contains(['/', ':', '@']) => Ok(normalize_reference(r).ok()),
        _ => Ok(None),
    }
}

/// A regular file met in the tarball.
struct FileEntry {
    digest: String,
    size: u64,
    compression: Compression,
    /// Kept for files not (yet) in the store and for JSON blobs.
    data: Option<Vec<u8>>,
}

/// Walks the tar, moving blobs into the store as they come, and remembers the rest.
struct Collector<'a> {
    store: &'a dyn Store,
    /// Digests the prescan expects at these paths (uncompressed docker save layers).
    hints: HashMap<String, String>,
    files: HashMap<String, FileEntry>,
    /// Digest → path of `blobs/sha256/...` files.
    blobs: HashMap<String, String>,
    links: HashMap<String, String>,
    /// Digests known to be in the store.
    stored: HashSet<String>,
    memory: u64,
    index_json: Option<Vec<u8>>,
    manifest_json: Option<Vec<u8>>,
    entries: usize,
}

impl<'a> Collector<'a> {
    fn new(store: &'a dyn Store, hints: HashMap<String, String>) -> Self {
        Collector {
            store,
            hints,
            files: HashMap::new(),
            blobs: HashMap::new(),
            links: HashMap::new(),
            stored: HashSet::new(),
            memory: 0,
            index_json: None,
            manifest_json: None,
            entries: 0,
        }
    }

    fn run<R: Read>(&mut self, entries: tar::Entries<'_, R>) -> Result<()> {
        for entry in entries {
            if self.store.cancelled() {
                bail!("import cancelled");
            }
            let entry = entry.map_err(|e| io_context(e, "reading the tar stream"))?;
            self.entries += 1;
            self.entry(entry)?;
        }
        Ok(())
    }

    fn present(&mut self, digest: &str) -> Result<bool> {
        if self.stored.contains(digest) {
            return Ok(true);
        }
        if self.store.info(digest)?.is_some() {
            self.stored.insert(digest.to_string());
            return Ok(true);
        }
        Ok(false)
    }

    fn entry<R: Read>(&mut self, mut e: tar::Entry<'_, R>) -> Result<()> {
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let path = clean_path(&raw);
        match e.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink => {
                if let Some(target) = e.link_name_bytes() {
                    let target = String::from_utf8_lossy(&target).into_owned();
                    let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                    let resolved = if target.starts_with('/') {
                        clean_path(&target)
                    } else {
                        clean_path(&format!("{parent}/{target}"))
                    };
                    self.links.insert(path, resolved);
                }
                return Ok(());
            }
            tar::EntryType::Link => {
                if let Some(target) = e.link_name_bytes() {
                    self.links.insert(path, clean_path(&String::from_utf8_lossy(&target)));
                }
                return Ok(());
            }
            _ => return Ok(()),
        }
        let size = e.size();
        if path == "index.json" || path == "manifest.json" {
            if size > JSON_LIMIT {
                bail!("{path} is too large ({size} bytes)");
            }
            let data = read_entry(&mut e, size, &path)?;
            if path == "index.json" {
                self.index_json = Some(data);
            } else {
                self.manifest_json = Some(data);
            }
            return Ok(());
        }
        let named = blob_path_digest(&path)?;
        let mut head = vec![0u8; size.min(512) as usize];
        e.read_exact(&mut head).map_err(|err| io_context(err, &path))?;
        let compression = Compression::sniff(&head);

        if size <= SMALL && self.memory + size <= MEMORY_BUDGET {
            let mut data = head;
            data.reserve_exact((size as usize).saturating_sub(data.len()));
            e.read_to_end(&mut data).map_err(|err| io_context(err, &path))?;
            if data.len() as u64 != size {
                bail!("{path}: the file is truncated (unexpected end of data)");
            }
            let digest = sha256_digest(&data);
            if let Some(named) = &named {
                if *named != digest {
                    bail!("{path}: content does not match its digest (it hashes to {digest}): the tarball is corrupt");
                }
                if !self.present(&digest)? {
                    write_all(self.store, &digest, &data)?;
                    self.stored.insert(digest.clone());
                } else {
                    self.store.count_skipped();
                }
                self.blobs.insert(digest.clone(), path.clone());
                // Only JSON (manifests, indexes, configs) is needed again.
                if !data.starts_with(b"{") {
                    self.files.insert(path, FileEntry { digest, size, compression, data: None });
                    return Ok(());
                }
            }
            self.memory += size;
            self.files.insert(path, FileEntry { digest, size, compression, data: Some(data) });
            return Ok(());
        }

        // Large: skip it when the store has it, stream it into the store otherwise.
        let known =
            named.clone().or_else(|| self.hints.get(&path).cloned().filter(|_| compression == Compression::None));
        if let Some(digest) = known
            && self.present(&digest)?
        {
            self.store.count_skipped();
            if named.is_some() {
                self.blobs.insert(digest.clone(), path.clone());
            }
            self.files.insert(path, FileEntry { digest, size, compression, data: None });
            return Ok(());
        }
        let Some(mut writer) = self.store.begin(named.as_deref().map(|d| (d, size)))? else {
            // Someone else wrote it meanwhile.
            let digest = named.expect("only named writes find their blob present");
            self.stored.insert(digest.clone());
            self.blobs.insert(digest.clone(), path.clone());
            self.files.insert(path, FileEntry { digest, size, compression, data: None });
            return Ok(());
        };
        let mut hasher = Sha256::new();
        hasher.update(&head);
        writer.write(&head)?;
        let mut written = head.len() as u64;
        let mut buf = vec![0u8; CHUNK];
        loop {
            if self.store.cancelled() {
                writer.abort();
                bail!("import cancelled");
            }
            let n = match read_up_to(&mut e, &mut buf) {
                Ok(n) => n,
                Err(err) => {
                    writer.abort();
                    return Err(io_context(err, &path));
                }
            };
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            writer.write(&buf[..n])?;
            written += n as u64;
        }
        if written != size {
            writer.abort();
            bail!("{path}: the file is truncated (unexpected end of data)");
        }
        let digest = format!("sha256:{}", oci_image::hex(&hasher.finalize()));
        if let Some(named) = &named
            && *named != digest
        {
            writer.abort();
            bail!("{path}: content does not match its digest (it hashes to {digest}): the tarball is corrupt");
        }
        if named.is_none() && self.present(&digest)? {
            writer.abort();
            self.store.count_skipped();
        } else if !writer.commit(&digest, size)? {
            self.store.count_skipped();
        }
        self.stored.insert(digest.clone());
        if named.is_some() {
            self.blobs.insert(digest.clone(), path.clone());
        }
        self.files.insert(path, FileEntry { digest, size, compression, data: None });
        Ok(())
    }

    /// After the last entry: the images the tarball names, with their content in the store and labelled.
    fn finish(mut self) -> Result<Vec<(String, Target)>> {
        if let Some(index) = self.index_json.take() {
            let images = self.images_from_index(&index).context("index.json")?;
            if !images.is_empty() {
                return Ok(images);
            }
            if self.manifest_json.is_none() {
                bail!(
                    "index.json names no image (no {} annotation, nor an {} that is a full reference)",
                    oci_image::ANNOTATION_IMAGE_NAME,
                    oci_image::ANNOTATION_REF_NAME
                );
            }
        }
        if let Some(manifest) = self.manifest_json.take() {
            return self.images_from_docker_save(&manifest).context("manifest.json");
        }
        if self.entries == 0 {
            bail!("the tar archive is empty");
        }
        bail!("no index.json or manifest.json in the archive: neither an OCI image layout nor a docker save tarball")
    }

    fn images_from_index(&mut self, bytes: &[u8]) -> Result<Vec<(String, Target)>> {
        let index: JsonIndex = serde_json::from_slice(bytes).context("invalid JSON")?;
        let Some(manifests) = index.manifests else { bail!("not an image index (no \"manifests\")") };
        let mut images = Vec::new();
        for (i, desc) in manifests.iter().enumerate() {
            let Some(name) = image_name(&desc.annotations).with_context(|| format!("manifests[{i}]"))? else {
                continue;
            };
            self.walk(desc, 0, true).with_context(|| format!("image {name} ({})", desc.digest))?;
            let target = Target {
                media_type: desc.media_type.clone(),
                digest: desc.digest.clone(),
                size: desc.size,
                annotations: desc.annotations.clone(),
            };
            images.push((name, target));
        }
        Ok(images)
    }

    /// The bytes of a manifest or index: from the tarball, else from the store.
    fn json_blob(&mut self, desc: &JsonDescriptor, required: bool) -> Result<Option<Vec<u8>>> {
        let in_tar = self.blobs.get(&desc.digest).and_then(|p| self.files.get(p)).and_then(|f| f.data.clone());
        let bytes = match in_tar {
            Some(b) => b,
            None if self.present(&desc.digest)? => self.store.read(&desc.digest, JSON_LIMIT)?,
            None if required => bail!("{} is missing from the tarball", desc.digest),
            None => return Ok(None),
        };
        if bytes.len() as i64 != desc.size {
            bail!("{} is {} bytes, its descriptor says {}", desc.digest, bytes.len(), desc.size);
        }
        Ok(Some(bytes))
    }

    /// Checks that a manifest (or an index and what it lists) is complete, and labels it so GC keeps
    /// its children. `required`: missing content is an error rather than a platform left out.
    fn walk(&mut self, desc: &JsonDescriptor, depth: usize, required: bool) -> Result<bool> {
        if depth > 8 {
            bail!("indexes nested too deeply");
        }
        if !valid_digest(&desc.digest) {
            bail!("malformed digest {:?}", desc.digest);
        }
        let Some(bytes) = self.json_blob(desc, required)? else {
            tracing::debug!("{} ({}) is not in the tarball; skipped", desc.digest, desc.media_type);
            return Ok(false);
        };
        let media_type =
            if desc.media_type.is_empty() { sniff_json_media_type(&bytes) } else { desc.media_type.clone() };
        match media_type.as_str() {
            oci_image::MEDIA_OCI_INDEX | oci_image::MEDIA_DOCKER_MANIFEST_LIST => {
                let index: JsonIndex =
                    serde_json::from_slice(&bytes).with_context(|| format!("index {}", desc.digest))?;
                let children = index.manifests.unwrap_or_default();
                let mut labels = BTreeMap::new();
                let mut present = 0;
                for (i, child) in children.iter().enumerate() {
                    labels.insert(format!("containerd.io/gc.ref.content.m.{i}"), child.digest.clone());
                    if self.walk(child, depth + 1, false).with_context(|| format!("index {}", desc.digest))? {
                        present += 1;
                    }
                }
                if present == 0 && !children.is_empty() {
                    bail!("none of the {} manifests of index {} is in the tarball", children.len(), desc.digest);
                }
                self.label(&desc.digest, labels)?;
                Ok(true)
            }
            oci_image::MEDIA_OCI_MANIFEST | oci_image::MEDIA_DOCKER_MANIFEST => {
                let manifest: JsonManifest =
                    serde_json::from_slice(&bytes).with_context(|| format!("manifest {}", desc.digest))?;
                let Some(config) = &manifest.config else { bail!("manifest {} has no config", desc.digest) };
                let mut labels = BTreeMap::from([(LABEL_GC_CONFIG.to_string(), config.digest.clone())]);
                let mut missing = Vec::new();
                if !valid_digest(&config.digest) || !self.present(&config.digest)? {
                    missing.push(format!("config {}", config.digest));
                }
                for (i, layer) in manifest.layers.iter().enumerate() {
                    labels.insert(format!("containerd.io/gc.ref.content.l.{i}"), layer.digest.clone());
                    if !valid_digest(&layer.digest) || !self.present(&layer.digest)? {
                        missing.push(format!("layer {} ({} of {})", layer.digest, i + 1, manifest.layers.len()));
                    }
                }
                self.label(&desc.digest, labels)?;
                if !missing.is_empty() {
                    if required {
                        bail!("manifest {}: {} missing from the tarball", desc.digest, missing.join(", "));
                    }
                    tracing::debug!("manifest {} is incomplete in the tarball; skipped", desc.digest);
                    return Ok(false);
                }
                Ok(true)
            }
            other if required => bail!("{}: unsupported media type {other:?}", desc.digest),
            _ => Ok(false),
        }
    }

    /// Sets the GC labels a blob lacks (nothing when they are all there already).
    fn label(&mut self, digest: &str, wanted: BTreeMap<String, String>) -> Result<()> {
        let have = self.store.info(digest)?.ok_or_else(|| anyhow!("{digest} vanished from the content store"))?;
        let missing: BTreeMap<String, String> = wanted.into_iter().filter(|(k, v)| have.get(k) != Some(v)).collect();
        if !missing.is_empty() {
            self.store.set_labels(digest, &missing)?;
        }
        Ok(())
    }

    fn resolve(&self, listed: &str) -> Result<&FileEntry> {
        let mut path = clean_path(listed);
        for _ in 0..16 {
            if let Some(f) = self.files.get(&path) {
                return Ok(f);
            }
            match self.links.get(&path) {
                Some(next) => path = next.clone(),
                None => break,
            }
        }
        bail!("{listed} is missing from the tarball")
    }

    /// Makes sure a file met in the tarball is in the store.
    fn store_file(&mut self, listed: &str) -> Result<(String, u64, Compression)> {
        let f = self.resolve(listed)?;
        let (digest, size, compression, data) = (f.digest.clone(), f.size, f.compression, f.data.clone());
        if !self.present(&digest)? {
            let Some(data) = data else { bail!("{listed} ({digest}) was not stored") };
            write_all(self.store, &digest, &data)?;
            self.stored.insert(digest.clone());
        }
        Ok((digest, size, compression))
    }

    fn images_from_docker_save(&mut self, bytes: &[u8]) -> Result<Vec<(String, Target)>> {
        let entries = parse_docker_manifest(bytes)?;
        let mut images = Vec::new();
        for (n, entry) in entries.iter().enumerate() {
            let (config_digest, config_size, _) =
                self.store_file(&entry.config).with_context(|| format!("[{n}].Config"))?;
            let mut labels = BTreeMap::from([(LABEL_GC_CONFIG.to_string(), config_digest.clone())]);
            let mut layers = Vec::new();
            for (i, layer) in entry.layers.iter().enumerate() {
                let (digest, size, compression) =
                    self.store_file(layer).with_context(|| format!("[{n}].Layers[{i}]"))?;
                let media_type = match compression {
                    Compression::None => oci_image::MEDIA_DOCKER_LAYER,
                    Compression::Gzip => oci_image::MEDIA_DOCKER_LAYER_GZIP,
                    Compression::Zstd => oci_image::MEDIA_OCI_LAYER_ZSTD,
                };
                labels.insert(format!("containerd.io/gc.ref.content.l.{i}"), digest.clone());
                layers.push(go_descriptor(media_type, &digest, size));
            }
            // Byte for byte what containerd's importer writes (Go's json.Marshal of its struct), so
            // the manifest digest is the one `ctr images import` gives the same archive.
            let manifest = format!(
                r#"{{"schemaVersion":2,"mediaType":"{}","config":{},"layers":[{}]}}"#,
                oci_image::MEDIA_DOCKER_MANIFEST,
                go_descriptor(oci_image::MEDIA_DOCKER_CONFIG, &config_digest, config_size),
                layers.join(",")
            )
            .into_bytes();
            let digest = sha256_digest(&manifest);
            if !self.present(&digest)? {
                write_all(self.store, &digest, &manifest)?;
                self.stored.insert(digest.clone());
            }
            self.label(&digest, labels)?;
            for tag in entry.repo_tags.iter().flatten() {
                let name =
                    normalize_reference(tag).map_err(|e| anyhow!(e)).with_context(|| format!("[{n}].RepoTags"))?;
                // The annotations containerd's importer puts on the target.
                let annotations = BTreeMap::from([
                    (oci_image::ANNOTATION_IMAGE_NAME.to_string(), name.clone()),
                    (oci_image::ANNOTATION_REF_NAME.to_string(), oci_ref_name(&name).to_string()),
                ]);
                let target = Target {
                    media_type: oci_image::MEDIA_DOCKER_MANIFEST.into(),
                    digest: digest.clone(),
                    size: manifest.len() as i64,
                    annotations,
                };
                images.push((name, target));
            }
        }
        if images.is_empty() {
            bail!("no RepoTags: the images have no names");
        }
        Ok(images)
    }
}

/// A descriptor as Go's encoding/json writes an OCI descriptor (field order mediaType, digest, size).
fn go_descriptor(media_type: &str, digest: &str, size: u64) -> String {
    format!(r#"{{"mediaType":"{media_type}","digest":"{digest}","size":{size}}}"#)
}

/// What follows the repository in a normalized reference (`latest`, `1.0@sha256:...`): containerd's
/// `org.opencontainers.image.ref.name` for an image from a docker save.
fn oci_ref_name(normalized: &str) -> &str {
    let name_end = normalized.find('@').unwrap_or(normalized.len());
    let last_slash = normalized[..name_end].rfind('/').map_or(0, |i| i + 1);
    match normalized[last_slash..name_end].find(':') {
        Some(i) => &normalized[last_slash + i + 1..],
        None => &normalized[name_end..],
    }
}

fn sniff_json_media_type(bytes: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) else { return String::new() };
    if let Some(m) = v.get("mediaType").and_then(|m| m.as_str()) {
        return m.to_string();
    }
    if v.get("manifests").is_some() {
        oci_image::MEDIA_OCI_INDEX.into()
    } else if v.get("config").is_some() {
        oci_image::MEDIA_OCI_MANIFEST.into()
    } else {
        String::new()
    }
}

fn read_entry(r: &mut impl Read, size: u64, path: &str) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(size as usize);
    r.read_to_end(&mut data).map_err(|e| io_context(e, path))?;
    if data.len() as u64 != size {
        bail!("{path}: the file is truncated (unexpected end of data)");
    }
    Ok(data)
}

/// Writes a small blob in one message.
fn write_all(store: &dyn Store, digest: &str, data: &[u8]) -> Result<()> {
    match store.begin(Some((digest, data.len() as u64)))? {
        None => {
            store.count_skipped();
            Ok(())
        }
        Some(mut w) => {
            w.write(data)?;
            if !w.commit(digest, data.len() as u64)? {
                store.count_skipped();
            }
            Ok(())
        }
    }
}

/// Where each docker save layer is expected to land, from manifest.json and the configs'
/// `rootfs.diff_ids` (an uncompressed layer's digest is its diff ID). Needs a seekable plain tar: it
/// reads the headers and the few JSON files only. Lets a re-import skip layers without rewriting them.
fn prescan(src: &mut (impl Read + Seek)) -> Result<HashMap<String, String>> {
    let mut regular: HashMap<String, (u64, u64)> = HashMap::new();
    let mut links: HashMap<String, String> = HashMap::new();
    {
        let mut ar = tar::Archive::new(&mut *src);
        for e in ar.entries_with_seek()? {
            let e = e?;
            let path = clean_path(&String::from_utf8_lossy(&e.path_bytes()));
            match e.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    regular.insert(path, (e.raw_file_position(), e.size()));
                }
                tar::EntryType::Symlink => {
                    if let Some(t) = e.link_name_bytes() {
                        let t = String::from_utf8_lossy(&t).into_owned();
                        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                        let r = if t.starts_with('/') { clean_path(&t) } else { clean_path(&format!("{parent}/{t}")) };
                        links.insert(path, r);
                    }
                }
                tar::EntryType::Link => {
                    if let Some(t) = e.link_name_bytes() {
                        links.insert(path, clean_path(&String::from_utf8_lossy(&t)));
                    }
                }
                _ => {}
            }
        }
    }
    let mut hints = HashMap::new();
    if regular.contains_key("index.json") {
        return Ok(hints);
    }
    let resolve = |p: &str| {
        let mut p = clean_path(p);
        for _ in 0..16 {
            if regular.contains_key(&p) {
                return Some(p);
            }
            p = links.get(&p)?.clone();
        }
        None
    };
    fn read_at(src: &mut (impl Read + Seek), at: (u64, u64), limit: u64) -> Result<Vec<u8>> {
        src.seek(SeekFrom::Start(at.0))?;
        let mut buf = vec![0u8; at.1.min(limit) as usize];
        src.read_exact(&mut buf)?;
        Ok(buf)
    }
    let Some(&manifest_at) = regular.get("manifest.json") else { return Ok(hints) };
    if manifest_at.1 > JSON_LIMIT {
        return Ok(hints);
    }
    let entries = parse_docker_manifest(&read_at(src, manifest_at, JSON_LIMIT)?)?;
    for entry in entries {
        let Some(config_at) = resolve(&entry.config).and_then(|p| regular.get(&p).copied()) else { continue };
        if config_at.1 > JSON_LIMIT {
            continue;
        }
        #[derive(Deserialize)]
        struct RootFs {
            #[serde(default)]
            diff_ids: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Config {
            rootfs: Option<RootFs>,
        }
        let Ok(config) = serde_json::from_slice::<Config>(&read_at(src, config_at, JSON_LIMIT)?) else { continue };
        let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
        if diff_ids.len() != entry.layers.len() {
            continue;
        }
        for (layer, diff_id) in entry.layers.iter().zip(diff_ids) {
            let Some(path) = resolve(layer) else { continue };
            let at = regular[&path];
            let head = read_at(src, at, 8)?;
            if Compression::sniff(&head) == Compression::None && valid_digest(&diff_id) {
                hints.insert(path, diff_id);
            }
        }
    }
    Ok(hints)
}

/// The whole import, on a blocking thread: returns the image records written.
fn import_sync(store: &dyn Store, source: Box<dyn ReadSeek>, done: &Arc<AtomicU64>) -> Result<Vec<Imported>> {
    let mut src = Counted { inner: source, pos: 0, report: None };
    let mut head = [0u8; 512];
    let n = read_up_to(&mut src, &mut head).context("reading the file")?;
    if n == 0 {
        bail!("the file is empty");
    }
    if n == 512 && head.iter().all(|&b| b == 0) {
        bail!("the tar archive is empty (it starts with an end-of-archive block)");
    }
    let Some(compression) = sniff_tarball(&head[..n]) else {
        bail!("not a tar archive, nor gzip or zstd (it starts with {})", oci_image::hex(&head[..n.min(8)]));
    };
    src.seek(SeekFrom::Start(0))?;
    let hints = if compression == Compression::None {
        let hints = prescan(&mut src).unwrap_or_else(|e| {
            tracing::debug!("tar prescan: {e:#}");
            HashMap::new()
        });
        src.seek(SeekFrom::Start(0))?;
        hints
    } else {
        HashMap::new()
    };
    src.report = Some(done.clone());
    let mut collector = Collector::new(store, hints);
    let what = compression.name();
    match compression {
        Compression::None => {
            let mut ar = tar::Archive::new(io::BufReader::with_capacity(CHUNK, src));
            collector
                .run(ar.entries_with_seek().map_err(|e| io_context(e, what))?)
                .with_context(|| format!("reading the {what}"))?;
        }
        Compression::Gzip => {
            let decoder = flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(CHUNK, src));
            decompressed(&mut collector, decoder, what)?;
        }
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(src).context("starting zstd decompression")?;
            decompressed(&mut collector, decoder, what)?;
        }
    }
    let images = collector.finish()?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (name, target) in images {
        if !seen.insert(name.clone()) {
            continue;
        }
        let change = store.put_image(&name, &target)?;
        out.push(Imported { reference: name, digest: target.digest, change });
    }
    Ok(out)
}

fn decompressed(collector: &mut Collector<'_>, mut decoder: impl Read, what: &str) -> Result<()> {
    let mut head = [0u8; 512];
    let n = read_up_to(&mut decoder, &mut head).map_err(|e| io_context(e, what))?;
    if n == 0 {
        bail!("the {what} is empty");
    }
    if n == 512 && head.iter().all(|&b| b == 0) {
        bail!("the {what} is an empty tar archive");
    }
    if !is_tar_header(&head[..n]) {
        bail!("the {what} does not hold a tar archive");
    }
    let mut ar = tar::Archive::new(io::Cursor::new(head[..n].to_vec()).chain(decoder));
    collector.run(ar.entries().map_err(|e| io_context(e, what))?).with_context(|| format!("reading the {what}"))?;
    // Read to the end so the compressed stream's own checks (gzip CRC, zstd frame) run too.
    io::copy(&mut ar.into_inner(), &mut io::sink()).map_err(|e| io_context(e, &format!("reading the {what}")))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Progress.

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// A progress callback that logs `importing <name>: 40% (41.9 MiB of 104.9 MiB)` at most once a
/// second, for files over 16 MiB (small ones finish before a line would be worth it).
pub fn progress_logger_named(name: String) -> impl Fn(u64, u64) + Sync {
    let last = Mutex::new(Instant::now());
    move |done, total| {
        if total < PROGRESS_MIN_SIZE || done >= total {
            return;
        }
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= Duration::from_secs(1) {
            *last = Instant::now();
            tracing::info!(
                "importing {name}: {}% ({:.1} MiB of {:.1} MiB)",
                done * 100 / total.max(1),
                mib(done),
                mib(total)
            );
        }
    }
}

/// [`progress_logger_named`] for a file.
pub fn progress_logger(path: &Path) -> impl Fn(u64, u64) + Sync {
    progress_logger_named(path.display().to_string())
}

// ---------------------------------------------------------------------------------------------
// The images directory.

/// What the directory watcher remembers about a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileRecord {
    size: u64,
    mtime_ns: i64,
    kind: FileKind,
    ok: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    images: Vec<ImageRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ImageRecord {
    reference: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum FileKind {
    Tarball,
    PullList,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct DirState {
    #[serde(default)]
    files: BTreeMap<String, FileRecord>,
}

/// Watches a directory of image tarballs and pull lists the k3s way (`<data-dir>/agent/images/`):
/// every new or changed `*.tar`, `*.tar.gz`, `*.tgz`, `*.tar.zst`, `*.tar.zstd` (or any file that
/// sniffs as one) is imported, every `*.txt` is read as image references to pull. What was done is
/// remembered in a small state file, so an unchanged file is not imported again, even after a restart.
pub struct ImageDir {
    dir: PathBuf,
    state_file: PathBuf,
    /// How files are named in the log, e.g. `images/x.tar`.
    label: String,
    state: DirState,
    /// Size and mtime of each file at the previous pass.
    seen: HashMap<String, (u64, i64)>,
    /// Files that turned out to be neither tarballs nor pull lists (not persisted).
    ignored: HashMap<String, (u64, i64)>,
    /// Files whose import failed for a passing reason, with the reason last logged.
    retrying: HashMap<String, String>,
    /// When the last pass left a file to settle: how soon it will have.
    settles_in: Option<Duration>,
}

/// The note [`ImageDir::prepare`] leaves in the folder, so that a newcomer finds what it is for.
const README_NAME: &str = "README.txt";
const README: &str = "\
Images dropped here are imported into the node's containerd (namespace k8s.io) at start and whenever
a file appears or changes, so pods can run them without a registry (air-gapped, as k3s's agent/images).

  *.tar *.tar.gz *.tgz *.tar.zst   an OCI layout or `docker save` tarball, e.g.
                                   docker save nginx:1.27 -o nginx.tar   (on a machine with a registry)
  *.txt                            image references to pull, one per line (# starts a comment)

A file is imported once: images.imported.json beside this folder remembers what was done. A file that
cannot be imported is logged and skipped until it changes. By hand: cairn images import FILE...
";

impl ImageDir {
    /// Creates the folder with its README (left alone once there, so an edited one survives).
    pub fn prepare(dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let readme = dir.join(README_NAME);
        if !readme.exists() {
            std::fs::write(readme, README)?;
        }
        Ok(())
    }

    pub fn new(dir: PathBuf, state_file: PathBuf) -> Self {
        let label = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut state = match std::fs::read(&state_file) {
            Ok(bytes) => serde_json::from_slice::<DirState>(&bytes).unwrap_or_else(|e| {
                tracing::warn!("ignoring unreadable image import state {}: {e}", state_file.display());
                DirState::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => DirState::default(),
            Err(e) => {
                tracing::warn!("ignoring unreadable image import state {}: {e}", state_file.display());
                DirState::default()
            }
        };
        // Pulls fail for passing reasons (no network yet): a failed pull list is tried again once per start.
        state.files.retain(|_, r| r.ok || r.kind != FileKind::PullList);
        ImageDir {
            dir,
            state_file,
            label,
            state,
            seen: HashMap::new(),
            ignored: HashMap::new(),
            retrying: HashMap::new(),
            settles_in: None,
        }
    }

    /// One pass: imports new or changed tarballs and pulls what new or changed pull lists name.
    /// Returns how many files were processed (successfully or not). One bad file does not stop the
    /// others: it is logged once and not tried again until it changes.
    pub async fn scan(
        &mut self,
        importer: &Importer,
        pull: &(dyn Fn(String) -> BoxFuture<'static, Result<()>> + Sync),
    ) -> usize {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return 0,
            Err(e) => {
                tracing::debug!("reading {}: {e}", self.dir.display());
                return 0;
            }
        };
        let mut files = Vec::new();
        for entry in listing.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if name.starts_with('.') || name.ends_with(".tmp") || name.ends_with(".part") {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: a link to a tarball elsewhere counts.
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            files.push((name, path, file_stamp(&meta), meta.modified().ok()));
        }
        files.sort();
        let present: HashSet<String> = files.iter().map(|f| f.0.clone()).collect();
        let mut dirty = false;
        let before = self.state.files.len();
        self.state.files.retain(|name, _| present.contains(name));
        dirty |= self.state.files.len() != before;
        self.ignored.retain(|name, _| present.contains(name));
        self.retrying.retain(|name, _| present.contains(name));
        let previous = std::mem::take(&mut self.seen);
        self.seen = files.iter().map(|f| (f.0.clone(), f.2)).collect();

        let mut processed = 0;
        self.settles_in = None;
        for (name, path, stamp, modified) in files {
            let (size, mtime_ns) = stamp;
            if self.state.files.get(&name).is_some_and(|r| (r.size, r.mtime_ns) == stamp)
                || self.ignored.get(&name) == Some(&stamp)
            {
                continue;
            }
            let settling = modified.and_then(|m| match SystemTime::now().duration_since(m) {
                Ok(age) => SETTLE_TIME.checked_sub(age),
                Err(ahead) => (ahead.duration() < SETTLE_TIME).then_some(SETTLE_TIME + ahead.duration()),
            });
            if let Some(left) = settling {
                let left = left + Duration::from_millis(100);
                self.settles_in = Some(self.settles_in.map_or(left, |d| d.min(left)));
            }
            let growing = previous.get(&name).is_some_and(|&(s, _)| s != size);
            if settling.is_some() || growing {
                tracing::debug!("{}/{name} may still be being written; next pass", self.label);
                continue;
            }
            let Some(kind) = classify(&name, &path) else {
                tracing::debug!("{}/{name} is neither an image tarball nor a pull list; ignored", self.label);
                self.ignored.insert(name, stamp);
                continue;
            };
            processed += 1;
            let shown = format!("{}/{name}", self.label);
            let record = match kind {
                FileKind::Tarball => match self.import_one(importer, &path, &shown, size, mtime_ns).await {
                    Ok(record) => record,
                    Err(e) => {
                        // containerd is away: not the file's fault, so not remembered; one line per reason.
                        let reason = format!("{e:#}");
                        if self.retrying.get(&name) != Some(&reason) {
                            tracing::warn!("could not import {shown}: {reason} (trying again)");
                            self.retrying.insert(name, reason);
                        }
                        continue;
                    }
                },
                FileKind::PullList => self.pull_list(pull, &path, &shown, size, mtime_ns).await,
            };
            self.retrying.remove(&name);
            // Changed while it was being read: look at it again next pass.
            let now = std::fs::metadata(&path).ok().map(|m| file_stamp(&m));
            if now != Some(stamp) {
                tracing::debug!("{shown} changed while it was being read; next pass");
                continue;
            }
            self.state.files.insert(name, record);
            dirty = true;
        }
        if dirty && let Err(e) = self.save() {
            tracing::warn!("saving image import state {}: {e:#}", self.state_file.display());
        }
        processed
    }

    /// The record to keep, or the error when it was containerd's (then the file is tried again).
    async fn import_one(
        &self,
        importer: &Importer,
        path: &Path,
        shown: &str,
        size: u64,
        mtime_ns: i64,
    ) -> Result<FileRecord> {
        let started = Instant::now();
        let progress = progress_logger_named(shown.to_string());
        match importer.import_path(path, &progress).await {
            Ok(images) => {
                let secs = started.elapsed().as_secs_f64();
                for i in &images {
                    match i.change {
                        ImageChange::Unchanged => {
                            tracing::info!("{} ({}) from {shown} was already imported", i.reference, i.digest)
                        }
                        _ => tracing::info!("imported {} ({}) from {shown} in {secs:.1}s", i.reference, i.digest),
                    }
                }
                let images =
                    images.into_iter().map(|i| ImageRecord { reference: i.reference, digest: i.digest }).collect();
                Ok(FileRecord { size, mtime_ns, kind: FileKind::Tarball, ok: true, images, error: None })
            }
            Err(e) if is_transient(&e) => Err(e),
            Err(e) => {
                tracing::warn!("could not import {shown}: {e:#} (it is tried again when the file changes)");
                Ok(FileRecord {
                    size,
                    mtime_ns,
                    kind: FileKind::Tarball,
                    ok: false,
                    images: vec![],
                    error: Some(format!("{e:#}")),
                })
            }
        }
    }

    async fn pull_list(
        &self,
        pull: &(dyn Fn(String) -> BoxFuture<'static, Result<()>> + Sync),
        path: &Path,
        shown: &str,
        size: u64,
        mtime_ns: i64,
    ) -> FileRecord {
        let failed = |error: String| {
            tracing::warn!("could not pull the images listed in {shown}: {error}");
            FileRecord { size, mtime_ns, kind: FileKind::PullList, ok: false, images: vec![], error: Some(error) }
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return failed(format!("reading it: {e}")),
        };
        let mut pulled = Vec::new();
        let mut errors = Vec::new();
        for reference in parse_pull_list(&text) {
            if let Err(e) = normalize_reference(&reference) {
                errors.push(e);
                continue;
            }
            let started = Instant::now();
            match pull(reference.clone()).await {
                Ok(()) => {
                    tracing::info!("pulled {reference} (listed in {shown}) in {:.1}s", started.elapsed().as_secs_f64());
                    pulled.push(ImageRecord { reference, digest: String::new() });
                }
                Err(e) => errors.push(format!("{reference}: {e:#}")),
            }
        }
        if !errors.is_empty() {
            let total = errors.len() + pulled.len();
            let mut rec = failed(format!("{} of {total} failed: {}", errors.len(), errors.join("; ")));
            rec.images = pulled;
            return rec;
        }
        FileRecord { size, mtime_ns, kind: FileKind::PullList, ok: true, images: pulled, error: None }
    }

    /// Writes the state file atomically (temporary file, fsync, rename).
    fn save(&self) -> Result<()> {
        use std::io::Write as _;
        if let Some(parent) = self.state_file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut tmp = self.state_file.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&self.state)?)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.state_file)?;
        Ok(())
    }

    /// Runs [`scan`](Self::scan) now and then every `interval` until `shutdown` resolves (an import
    /// in progress is abandoned; it is redone at the next start). A file left alone because it was
    /// modified in the last 2 s is looked at again as soon as it has settled, not a whole interval later.
    pub async fn watch<P>(mut self, importer: Importer, pull: P, interval: Duration, shutdown: impl Future<Output = ()>)
    where
        P: Fn(String) -> BoxFuture<'static, Result<()>> + Sync,
    {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = self.scan(&importer, &pull) => {}
            }
            // A file that was too fresh is looked at again as soon as it has settled.
            let wait = self.settles_in.map_or(interval, |d| d.min(interval));
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

fn file_stamp(meta: &std::fs::Metadata) -> (u64, i64) {
    use std::os::unix::fs::MetadataExt as _;
    (meta.len(), meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()))
}

/// By name first, then by content. The folder's own [`README`] is neither.
fn classify(name: &str, path: &Path) -> Option<FileKind> {
    if name == README_NAME {
        return None;
    }
    if name.ends_with(".txt") {
        return Some(FileKind::PullList);
    }
    const TARBALLS: [&str; 6] = [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst"];
    if TARBALLS.iter().any(|ext| name.ends_with(ext)) {
        return Some(FileKind::Tarball);
    }
    let mut head = [0u8; 512];
    let n = std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut head)).ok()?;
    sniff_tarball(&head[..n]).map(|_| FileKind::Tarball)
}

/// Image references, one per line; `#` starts a comment.
fn parse_pull_list(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_image::{ImageBuilder, canonical_json};
    use serde_json::json;
    use std::io::Write as _;

    /// A blob's bytes and labels.
    type Blob = (Vec<u8>, HashMap<String, String>);

    /// containerd's content store and image records, in memory.
    #[derive(Default)]
    struct MemStore {
        blobs: Mutex<HashMap<String, Blob>>,
        images: Mutex<HashMap<String, Target>>,
        bytes_written: AtomicU64,
        commits: AtomicU64,
        label_updates: AtomicU64,
    }

    struct MemWriter<'a> {
        store: &'a MemStore,
        buf: Vec<u8>,
    }

    impl Store for MemStore {
        fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>> {
            Ok(self.blobs.lock().unwrap().get(digest).map(|b| b.1.clone()))
        }
        fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>> {
            if let Some((d, _)) = expected
                && self.blobs.lock().unwrap().contains_key(d)
            {
                return Ok(None);
            }
            Ok(Some(Box::new(MemWriter { store: self, buf: Vec::new() })))
        }
        fn read(&self, digest: &str, _limit: u64) -> Result<Vec<u8>> {
            self.blobs.lock().unwrap().get(digest).map(|b| b.0.clone()).ok_or_else(|| anyhow!("{digest} not found"))
        }
        fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()> {
            let mut blobs = self.blobs.lock().unwrap();
            let blob = blobs.get_mut(digest).ok_or_else(|| anyhow!("{digest} not found"))?;
            blob.1.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            self.label_updates.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange> {
            let mut images = self.images.lock().unwrap();
            Ok(match images.insert(name.to_string(), target.clone()) {
                None => ImageChange::Created,
                Some(old) if old == *target => ImageChange::Unchanged,
                Some(_) => ImageChange::Updated,
            })
        }
        fn cancelled(&self) -> bool {
            false
        }
    }

    impl BlobWriter for MemWriter<'_> {
        fn write(&mut self, data: &[u8]) -> Result<()> {
            self.buf.extend_from_slice(data);
            self.store.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
            Ok(())
        }
        fn commit(self: Box<Self>, digest: &str, size: u64) -> Result<bool> {
            if sha256_digest(&self.buf) != digest || self.buf.len() as u64 != size {
                bail!("unexpected commit digest");
            }
            let mut blobs = self.store.blobs.lock().unwrap();
            if blobs.contains_key(digest) {
                return Ok(false);
            }
            blobs.insert(digest.to_string(), (self.buf, HashMap::new()));
            self.store.commits.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        fn abort(self: Box<Self>) {}
    }

    impl MemStore {
        fn labels(&self, digest: &str) -> HashMap<String, String> {
            self.blobs.lock().unwrap()[digest].1.clone()
        }
        fn has(&self, digest: &str) -> bool {
            self.blobs.lock().unwrap().contains_key(digest)
        }
        fn written(&self) -> (u64, u64) {
            (self.bytes_written.load(Ordering::Relaxed), self.commits.load(Ordering::Relaxed))
        }
    }

    fn import(store: &MemStore, tar: &[u8]) -> Result<Vec<Imported>> {
        import_sync(store, Box::new(io::Cursor::new(tar.to_vec())), &Arc::default())
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::stream::encode_all(data, 1).unwrap()
    }

    /// Deterministic incompressible bytes.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(len);
        out
    }

    fn image(tag: &str, big: usize) -> ImageBuilder {
        ImageBuilder::new(&format!("busybox:{tag}"))
            .file("/bin/busybox", b"binary", 0o755)
            .symlink("/bin/sh", "busybox")
            .file("/data", &noise(big, 7), 0o644)
            .cmd(&["/bin/sh"])
    }

    /// A tar from (path, contents) pairs, plus symlinks as (path, "->target").
    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            if let Some(target) = std::str::from_utf8(data).ok().and_then(|s| s.strip_prefix("->")) {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, path, target).unwrap();
            } else {
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, *data).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    /// A legacy `docker save` archive of `img` (manifest.json last, layer under a v1 id directory).
    fn docker_save(img: &oci_image::BuiltImage, tags: &[&str], layer: &[u8]) -> Vec<u8> {
        let config_name = format!("{}.json", img.config_digest.trim_start_matches("sha256:"));
        let manifest =
            serde_json::to_vec(&json!([{"Config": config_name, "RepoTags": tags, "Layers": ["0123abcd/layer.tar"]}]))
                .unwrap();
        tar_of(&[
            ("0123abcd/VERSION", b"1.0"),
            ("0123abcd/json", b"{}"),
            ("0123abcd/layer.tar", layer),
            (&config_name, &img.config),
            ("repositories", b"{}"),
            ("manifest.json", &manifest),
        ])
    }

    #[test]
    fn sniffs_formats_by_magic() {
        let tar = image("x", 10).oci_layout_tar();
        assert_eq!(sniff_tarball(&tar[..512]), Some(Compression::None));
        assert_eq!(sniff_tarball(&gzip(&tar)[..16]), Some(Compression::Gzip));
        assert_eq!(sniff_tarball(&zstd(&tar)[..16]), Some(Compression::Zstd));
        assert_eq!(sniff_tarball(b""), None);
        assert_eq!(sniff_tarball(b"hello world"), None);
        assert_eq!(sniff_tarball(&[b'x'; 512]), None);
        // An old v7 header has no magic, only a checksum.
        let mut h = tar::Header::new_old();
        h.set_path("a").unwrap();
        h.set_size(0);
        h.set_cksum();
        assert!(is_tar_header(h.as_bytes()));
        assert!(!is_tar_header(&[0u8; 512]));
    }

    #[test]
    fn imports_an_oci_layout_and_reimports_for_free() {
        let store = MemStore::default();
        let builder = image("test", 100);
        let built = builder.build();
        let imported = import(&store, &builder.oci_layout_tar()).unwrap();
        assert_eq!(
            imported,
            [Imported {
                reference: "docker.io/library/busybox:test".into(),
                digest: built.manifest_digest.clone(),
                change: ImageChange::Created
            }]
        );
        for d in [&built.manifest_digest, &built.config_digest, &built.layer_digest] {
            assert!(store.has(d), "{d} stored");
        }
        let labels = store.labels(&built.manifest_digest);
        assert_eq!(labels[LABEL_GC_CONFIG], built.config_digest);
        assert_eq!(labels["containerd.io/gc.ref.content.l.0"], built.layer_digest);
        let target = store.images.lock().unwrap()["docker.io/library/busybox:test"].clone();
        assert_eq!(target.media_type, oci_image::MEDIA_OCI_MANIFEST);
        assert_eq!(target.size, built.manifest.len() as i64);

        let before = store.written();
        let labels_before = store.label_updates.load(Ordering::Relaxed);
        let again = import(&store, &builder.oci_layout_tar()).unwrap();
        assert_eq!(again[0].change, ImageChange::Unchanged);
        assert_eq!(store.written(), before, "nothing written on re-import");
        assert_eq!(store.label_updates.load(Ordering::Relaxed), labels_before, "labels not rewritten");
    }

    #[test]
    fn compressed_layouts_and_streamed_blobs() {
        // 3 MiB of noise: streamed (not held in memory), in a gzip'd layer too.
        for gz_layer in [false, true] {
            let builder = image("big", 3 << 20).gzip(gz_layer);
            let built = builder.build();
            let tar = builder.oci_layout_tar();
            for (what, bytes) in [("plain", tar.clone()), ("gzip", gzip(&tar)), ("zstd", zstd(&tar))] {
                let store = MemStore::default();
                let imported = import(&store, &bytes).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                assert_eq!(imported[0].digest, built.manifest_digest, "{what}");
                assert_eq!(store.read(&built.layer_digest, u64::MAX).unwrap(), built.layer, "{what}");
                let before = store.written();
                assert_eq!(import(&store, &bytes).unwrap()[0].change, ImageChange::Unchanged);
                assert_eq!(store.written(), before, "{what}: re-import writes nothing");
            }
        }
    }

    #[test]
    fn changed_image_updates_the_record() {
        let store = MemStore::default();
        import(&store, &image("t", 10).oci_layout_tar()).unwrap();
        let imported = import(&store, &image("t", 11).oci_layout_tar()).unwrap();
        assert_eq!(imported[0].change, ImageChange::Updated);
        assert_eq!(
            store.images.lock().unwrap()["docker.io/library/busybox:t"].digest,
            image("t", 11).manifest_digest()
        );
    }

    #[test]
    fn imports_docker_save() {
        for big in [100, 3 << 20] {
            let built = image("x", big).build();
            let save = docker_save(&built, &["busybox:saved", "registry:5000/team/app"], &built.layer);
            for (what, bytes) in [("plain", save.clone()), ("gzip", gzip(&save))] {
                let store = MemStore::default();
                let imported = import(&store, &bytes).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                let names: Vec<&str> = imported.iter().map(|i| i.reference.as_str()).collect();
                assert_eq!(names, ["docker.io/library/busybox:saved", "registry:5000/team/app:latest"]);
                assert_eq!(imported[0].digest, imported[1].digest);
                let manifest: serde_json::Value =
                    serde_json::from_slice(&store.read(&imported[0].digest, u64::MAX).unwrap()).unwrap();
                assert_eq!(manifest["mediaType"], oci_image::MEDIA_DOCKER_MANIFEST);
                assert_eq!(manifest["config"]["mediaType"], oci_image::MEDIA_DOCKER_CONFIG);
                assert_eq!(manifest["config"]["digest"], built.config_digest);
                assert_eq!(manifest["layers"][0]["mediaType"], oci_image::MEDIA_DOCKER_LAYER);
                assert_eq!(manifest["layers"][0]["digest"], built.layer_digest);
                assert_eq!(manifest["layers"][0]["size"], built.layer.len());
                let labels = store.labels(&imported[0].digest);
                assert_eq!(labels[LABEL_GC_CONFIG], built.config_digest);
                assert_eq!(labels["containerd.io/gc.ref.content.l.0"], built.layer_digest);
                assert!(store.has(&built.layer_digest));
                let target = store.images.lock().unwrap()["docker.io/library/busybox:saved"].clone();
                assert_eq!(target.media_type, oci_image::MEDIA_DOCKER_MANIFEST);
                // Junk files of the archive (VERSION, json, repositories) are not stored.
                assert_eq!(store.blobs.lock().unwrap().len(), 3, "{what}");
                let before = store.written();
                let again = import(&store, &bytes).unwrap();
                assert!(again.iter().all(|i| i.change == ImageChange::Unchanged));
                if what == "plain" || big <= SMALL as usize {
                    assert_eq!(store.written(), before, "{what}/{big}: a plain docker save re-imports without writes");
                } else {
                    // Compressed, large and unknown until hashed: streamed again, but nothing committed.
                    assert_eq!(store.written().1, before.1, "{what}/{big}: no new blob");
                }
            }
        }
    }

    #[test]
    fn docker_save_variants() {
        let built = image("x", 10).build();
        // A gzip-compressed layer gets the gzip media type.
        let save = docker_save(&built, &["gz:1"], &gzip(&built.layer));
        let store = MemStore::default();
        let imported = import(&store, &save).unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&store.read(&imported[0].digest, u64::MAX).unwrap()).unwrap();
        assert_eq!(manifest["layers"][0]["mediaType"], oci_image::MEDIA_DOCKER_LAYER_GZIP);

        // Layers behind symlinks (docker save de-duplicates that way), manifest.json first.
        let config_name = format!("{}.json", built.config_digest.trim_start_matches("sha256:"));
        let manifest = serde_json::to_vec(&json!([
            {"Config": config_name, "RepoTags": ["a:1"], "Layers": ["aaa/layer.tar"]},
            {"Config": config_name, "RepoTags": ["b:1"], "Layers": ["./bbb/layer.tar"]},
        ]))
        .unwrap();
        let save = tar_of(&[
            ("manifest.json", &manifest),
            ("bbb/layer.tar", b"->../aaa/layer.tar"),
            ("aaa/layer.tar", &built.layer),
            (&config_name, &built.config),
        ]);
        let store = MemStore::default();
        let imported = import(&store, &save).unwrap();
        assert_eq!(imported.len(), 2);
        assert_eq!(imported[0].digest, imported[1].digest);

        // Untagged images cannot be named.
        let untagged =
            serde_json::to_vec(&json!([{"Config": config_name, "RepoTags": null, "Layers": ["aaa/layer.tar"]}]))
                .unwrap();
        let save =
            tar_of(&[("manifest.json", &untagged), ("aaa/layer.tar", &built.layer), (&config_name, &built.config)]);
        let err = format!("{:#}", import(&MemStore::default(), &save).unwrap_err());
        assert!(err.contains("no RepoTags"), "{err}");

        // A layer listed but absent.
        let save = tar_of(&[("manifest.json", &manifest), (&config_name, &built.config)]);
        let err = format!("{:#}", import(&MemStore::default(), &save).unwrap_err());
        assert!(err.contains("aaa/layer.tar is missing from the tarball"), "{err}");
    }

    #[test]
    fn newer_docker_save_prefers_index_json() {
        // docker 25+: an OCI layout plus manifest.json pointing into blobs/.
        let built = image("new", 10).build();
        let hexname = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
        let manifest_json = serde_json::to_vec(&json!([{
            "Config": hexname(&built.config_digest), "RepoTags": ["busybox:from-manifest-json"],
            "Layers": [hexname(&built.layer_digest)]
        }]))
        .unwrap();
        let files = [
            (hexname(&built.layer_digest), built.layer.clone()),
            (hexname(&built.config_digest), built.config.clone()),
            (hexname(&built.manifest_digest), built.manifest.clone()),
            ("index.json".to_string(), built.index.clone()),
            ("manifest.json".to_string(), manifest_json),
        ];
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        let store = MemStore::default();
        let imported = import(&store, &tar_of(&refs)).unwrap();
        assert_eq!(imported.len(), 1);
        assert_eq!(imported[0].reference, "docker.io/library/busybox:new");
        assert_eq!(imported[0].digest, built.manifest_digest);
    }

    #[test]
    fn names_from_annotations() {
        let a = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            image_name(&a(&[(oci_image::ANNOTATION_IMAGE_NAME, "busybox:1")])).unwrap().as_deref(),
            Some("docker.io/library/busybox:1")
        );
        assert_eq!(image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "latest")])).unwrap(), None);
        assert_eq!(image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "3.10")])).unwrap(), None);
        assert_eq!(
            image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "foo/bar:1")])).unwrap().as_deref(),
            Some("docker.io/foo/bar:1")
        );
        assert_eq!(
            image_name(&a(&[
                (oci_image::ANNOTATION_IMAGE_NAME, "quay.io/x/y:2"),
                (oci_image::ANNOTATION_REF_NAME, "2")
            ]))
            .unwrap()
            .as_deref(),
            Some("quay.io/x/y:2")
        );
        assert!(image_name(&a(&[(oci_image::ANNOTATION_IMAGE_NAME, "Not Valid")])).is_err());
    }

    /// Rebuilds a layout tar with index.json replaced.
    fn with_index(tar: &[u8], index: &serde_json::Value, extra: &[(&str, &[u8])]) -> Vec<u8> {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut ar = tar::Archive::new(tar);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            if e.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            if path != "index.json" {
                files.push((path, data));
            }
        }
        for (p, d) in extra {
            files.push((p.to_string(), d.to_vec()));
        }
        files.push(("index.json".into(), serde_json::to_vec(index).unwrap()));
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        tar_of(&refs)
    }

    #[test]
    fn multi_platform_index_is_the_target() {
        let built = image("multi", 10).build();
        let other = format!("sha256:{}", "e".repeat(64));
        let inner = canonical_json(&json!({
            "schemaVersion": 2, "mediaType": oci_image::MEDIA_OCI_INDEX,
            "manifests": [
                {"mediaType": oci_image::MEDIA_OCI_MANIFEST, "digest": built.manifest_digest, "size": built.manifest.len(),
                 "platform": {"os": "linux", "architecture": "amd64"}},
                // Another platform, left out of the tarball.
                {"mediaType": oci_image::MEDIA_OCI_MANIFEST, "digest": other, "size": 100,
                 "platform": {"os": "linux", "architecture": "arm64"}},
            ]
        }));
        let inner_digest = sha256_digest(&inner);
        let index = json!({"schemaVersion": 2, "manifests": [{
            "mediaType": oci_image::MEDIA_OCI_INDEX, "digest": inner_digest, "size": inner.len(),
            "annotations": {oci_image::ANNOTATION_REF_NAME: "docker.io/library/multi:1"}
        }]});
        let path = format!("blobs/sha256/{}", inner_digest.trim_start_matches("sha256:"));
        let tar = with_index(&image("multi", 10).oci_layout_tar(), &index, &[(&path, &inner)]);
        let store = MemStore::default();
        let imported = import(&store, &tar).unwrap();
        assert_eq!(imported[0].reference, "docker.io/library/multi:1");
        assert_eq!(imported[0].digest, inner_digest);
        let labels = store.labels(&inner_digest);
        assert_eq!(labels["containerd.io/gc.ref.content.m.0"], built.manifest_digest);
        assert_eq!(labels["containerd.io/gc.ref.content.m.1"], other);
        assert_eq!(store.images.lock().unwrap()["docker.io/library/multi:1"].media_type, oci_image::MEDIA_OCI_INDEX);
    }

    fn err_of(tar: &[u8]) -> String {
        let store = MemStore::default();
        let err = format!("{:#}", import(&store, tar).unwrap_err());
        eprintln!("error: {err}");
        assert!(store.images.lock().unwrap().is_empty(), "no image record after: {err}");
        err
    }

    #[test]
    fn corrupt_inputs_give_clear_errors() {
        let builder = image("bad", 3 << 20);
        let built = builder.build();
        let good = builder.oci_layout_tar();

        assert!(err_of(b"").contains("the file is empty"));
        let e = err_of(b"this is not an image at all, just some text");
        assert!(e.contains("not a tar archive, nor gzip or zstd"), "{e}");
        let e = err_of(&gzip(b"plain text, gzipped"));
        assert!(e.contains("gzip-compressed tar does not hold a tar archive"), "{e}");
        let e = err_of(&[0u8; 10240]);
        assert!(e.contains("the tar archive is empty"), "{e}");
        let e = err_of(&tar_of(&[]));
        assert!(e.contains("the tar archive is empty"), "{e}");
        let e = err_of(&zstd(&tar_of(&[])));
        assert!(e.contains("the zstd-compressed tar is an empty tar archive"), "{e}");
        let e = err_of(&[0x1f, 0x8b, 8, 0, 0]);
        assert!(e.contains("truncated"), "{e}");
        let e = err_of(&tar_of(&[("hello.txt", b"hi")]));
        assert!(e.contains("no index.json or manifest.json"), "{e}");

        // Truncated: plain, gzip and zstd, in the big layer.
        let cut = good.len() / 2;
        let e = err_of(&good[..cut]);
        assert!(e.contains("truncated"), "{e}");
        let gz = gzip(&good);
        let e = err_of(&gz[..gz.len() - 100]);
        assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
        let e = err_of(&gz[..gz.len() / 2]);
        assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
        let zs = zstd(&good);
        let e = err_of(&zs[..zs.len() / 2]);
        assert!(e.contains("truncated") || e.contains("corrupt") || e.contains("zstd"), "{e}");

        // A blob whose bytes do not match its name: a big one (streamed) and a small one (config).
        for digest in [&built.layer_digest, &built.config_digest] {
            let hexname = digest.trim_start_matches("sha256:");
            let mut bad = good.clone();
            let at = find(&bad, format!("blobs/sha256/{hexname}").as_bytes()) + 512 + 100;
            bad[at] ^= 0xff;
            let e = err_of(&bad);
            assert!(e.contains(&format!("blobs/sha256/{hexname}: content does not match its digest")), "{e}");
        }

        // index.json names a manifest that is not there.
        let index = json!({"schemaVersion": 2, "manifests": [{
            "mediaType": oci_image::MEDIA_OCI_MANIFEST, "digest": format!("sha256:{}", "a".repeat(64)), "size": 10,
            "annotations": {oci_image::ANNOTATION_IMAGE_NAME: "x:1"}}]});
        let e = err_of(&with_index(&good, &index, &[]));
        assert!(e.contains("is missing from the tarball"), "{e}");
        // Broken index.json.
        let mut files = vec![];
        let mut ar = tar::Archive::new(good.as_slice());
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().to_string_lossy().into_owned();
            let mut d = vec![];
            e.read_to_end(&mut d).unwrap();
            if p == "index.json" {
                d = b"{not json".to_vec();
            }
            if e.header().entry_type() == tar::EntryType::Regular {
                files.push((p, d));
            }
        }
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        let e = err_of(&tar_of(&refs));
        assert!(e.contains("index.json: invalid JSON"), "{e}");
        // No name anywhere.
        let index = json!({"schemaVersion": 2, "manifests": [{
            "mediaType": oci_image::MEDIA_OCI_MANIFEST, "digest": built.manifest_digest, "size": built.manifest.len(),
            "annotations": {oci_image::ANNOTATION_REF_NAME: "latest"}}]});
        let e = err_of(&with_index(&good, &index, &[]));
        assert!(e.contains("index.json names no image"), "{e}");
        // A layer missing from the layout.
        let layer_path = format!("blobs/sha256/{}", built.layer_digest.trim_start_matches("sha256:"));
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .filter(|(p, _)| *p != layer_path && p != "index.json")
            .map(|(p, d)| (p.as_str(), d.as_slice()))
            .chain([("index.json", built.index.as_slice())])
            .collect();
        let e = err_of(&tar_of(&refs));
        assert!(
            e.contains(&format!("layer {} (1 of 1)", built.layer_digest)) && e.contains("missing from the tarball"),
            "{e}"
        );
    }

    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).position(|w| w == needle).expect("present")
    }

    #[test]
    fn oci_ref_names() {
        assert_eq!(oci_ref_name("docker.io/library/busybox:latest"), "latest");
        assert_eq!(oci_ref_name("registry:5000/x:y"), "y");
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(oci_ref_name(&format!("registry:5000/x:1@{d}")), format!("1@{d}"));
        assert_eq!(oci_ref_name(&format!("registry:5000/x@{d}")), format!("@{d}"));
    }

    #[test]
    fn paths_and_pull_lists() {
        assert_eq!(clean_path("./a/b/"), "a/b");
        assert_eq!(clean_path("/a/../b/./c"), "b/c");
        assert_eq!(
            blob_path_digest(&format!("blobs/sha256/{}", "a".repeat(64))).unwrap(),
            Some(format!("sha256:{}", "a".repeat(64)))
        );
        assert_eq!(blob_path_digest("blobs/sha256/short").unwrap(), None);
        assert!(blob_path_digest(&format!("blobs/sha512/{}", "a".repeat(128))).is_err());
        assert_eq!(
            parse_pull_list("# images\nbusybox:1.36\n\n  quay.io/x/y:2  # inline\n#nothing\n"),
            ["busybox:1.36", "quay.io/x/y:2"]
        );
        let dir = std::env::temp_dir().join(format!("images-classify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = |name: &str, data: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, data).unwrap();
            p
        };
        assert_eq!(classify("a.txt", &w("a.txt", b"x")), Some(FileKind::PullList));
        assert_eq!(classify(README_NAME, &w(README_NAME, README.as_bytes())), None);
        assert_eq!(classify("a.tar.zst", &w("a.tar.zst", b"x")), Some(FileKind::Tarball));
        assert_eq!(classify("a.tgz", &w("a.tgz", b"x")), Some(FileKind::Tarball));
        assert_eq!(classify("noext", &w("noext", &gzip(b"x"))), Some(FileKind::Tarball));
        assert_eq!(classify("image.oci", &w("image.oci", &tar_of(&[("a", b"1")]))), Some(FileKind::Tarball));
        assert_eq!(classify("README", &w("README", b"hello")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
