//! The only owner of the datastore: durable objects, one cluster-wide resourceVersion, and the watch
//! hub. Two backends keep the objects: sled in the data directory (`sled_store.rs`, the default) and
//! etcd v3 (`etcd.rs`, `--datastore-endpoint`). Above them, the same in-memory index serves every read
//! and the same hub every watch (kube-apiserver's watch cache): sled's writer updates it after each
//! flush, etcd's watch after each commit, this server's or another's.
//!
//! # Guarantees
//! - Every object is stored as its JSON bytes, with `metadata.resourceVersion` set to the revision of
//!   the write that produced it. Revisions come from one counter that only ever increases, also across
//!   restarts (it is persisted in the same atomic batch as the objects).
//! - A write is acknowledged only after sled has flushed it to disk. Writes arriving while a flush is in
//!   progress are committed together with one flush (group commit): one writer thread takes every
//!   pending write, applies them as one atomic batch, flushes once, then answers them all. The one
//!   exception is an update under a prefix in [`Options::deferred`] (the local node's Lease): it
//!   reaches the disk with the next flush, and a crash may lose it, never a revision it was given
//!   (the counter on disk is kept ahead of such revisions).
//! - Readers never see a write before it is durable: the in-memory index that serves reads and watches
//!   is updated after the flush.
//!
//! - With etcd, revisions are etcd's revisions, a write is acknowledged once etcd committed it and the
//!   index shows it (so a reader of this server sees its own writes), and writes of other servers
//!   appear as etcd's watch delivers them.
//!
//! # Caveats
//! - Reads are served from an in-memory index of the current objects (like kube-apiserver's watch
//!   cache); the backend is read in full once, at start-up.
//! - Watch history is a bounded window; resuming from a revision older than the window (or from before
//!   a restart) fails with [`Error::TooOld`], and the caller must re-list, as clients do on 410 Gone.

pub mod etcd;
mod sled_store;
mod watch;

pub use watch::{Event, EventType, Subscription};

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, mpsc};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::oneshot;

use watch::Hub;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening the store at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("the stored object {key} is not valid JSON: {source}")]
    Corrupt { key: String, source: serde_json::Error },
    #[error("writing to the store: {0}")]
    Write(#[from] sled::Error),
    #[error("the object already exists")]
    AlreadyExists,
    #[error("the object does not exist")]
    NotFound,
    #[error("the object has been modified (stored resourceVersion {current})")]
    Conflict { current: u64 },
    #[error("too old resource version: {requested} ({oldest})")]
    TooOld { requested: u64, oldest: u64 },
    #[error("the store is shutting down")]
    Closed,
    /// The datastore did not answer (etcd unreachable, or no quorum).
    #[error("the datastore {endpoint} cannot be reached: {why}")]
    Unavailable { endpoint: String, why: String },
    /// The datastore did not answer in time.
    #[error("the datastore {endpoint} did not answer in time")]
    Timeout { endpoint: String },
    /// A migration found the target datastore already in use.
    #[error("the datastore {endpoint} {why}")]
    NotEmpty { endpoint: String, why: String },
    #[error("encoding the object: {0}")]
    Encode(#[from] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One stored object: its revision and its JSON bytes.
#[derive(Debug)]
pub struct Object {
    pub rv: u64,
    pub data: Bytes,
}

/// What the stored object must look like for a write to proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// The key must not exist (create).
    Absent,
    /// The key must exist at exactly this revision (compare-and-swap).
    Revision(u64),
}

/// One mutation of one key.
#[derive(Debug)]
pub enum Op {
    /// Store this object; the store sets `metadata.resourceVersion`.
    Put(Value),
    /// Remove the key; the watch event carries this final state of the object.
    Delete(Value),
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Arc<Object>>,
    revision: u64,
    /// The revision of the latest write under each key's first segment (its resource), since start.
    last_writes: std::collections::HashMap<String, u64>,
}

struct Inner {
    state: RwLock<State>,
    hub: Arc<Hub>,
    backend: Backend,
    flushes: AtomicU64,
    committed: AtomicU64,
    deferred: AtomicU64,
}

/// Where writes go.
enum Backend {
    /// sled's writer thread: it assigns revisions, commits in groups and updates the index.
    Sled(mpsc::Sender<sled_store::Message>),
    /// etcd: revisions are its own; its watch updates the index.
    Etcd(Box<etcd::Etcd>),
}

/// Counters of the writer, for benchmarks and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Flushes to disk (one per committed batch).
    pub flushes: u64,
    /// Writes committed.
    pub writes: u64,
    /// Writes committed without a flush of their own (see [`Options::deferred`]).
    pub deferred: u64,
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// Tuning for small devices.
#[derive(Debug, Clone)]
pub struct Options {
    /// sled's page cache bound, in bytes.
    pub cache_bytes: u64,
    /// How many events the watch history keeps at most.
    pub history: usize,
    /// How many bytes of objects the watch history keeps at most.
    pub history_bytes: usize,
    /// Keys under these prefixes that etcd removes by itself this long after their last write
    /// (kube-apiserver's `--event-ttl` through etcd leases). The embedded store ignores it: there
    /// the event TTL controller deletes them.
    pub expiring: Vec<(String, std::time::Duration)>,
    /// Keys under these prefixes whose updates the embedded store answers from memory and takes to
    /// disk with the next flushed write (or a clean stop) instead of flushing each: records that
    /// only this process reads before it writes them again, so that a crash loses nothing but one
    /// renewal (the local node's Lease). Creates and deletes under them are flushed as always; etcd
    /// ignores the option (other servers read what is there).
    pub deferred: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cache_bytes: 16 << 20,
            history: 10_000,
            history_bytes: 32 << 20,
            expiring: Vec::new(),
            deferred: Vec::new(),
        }
    }
}

impl Store {
    /// Opens (or creates) the sled store at `path` and loads the current objects.
    pub fn open(path: &Path, options: Options) -> Result<Self> {
        sled_store::open(path, options)
    }

    /// Connects to etcd (retrying until it answers) and loads the current objects.
    pub async fn open_etcd(config: etcd::Config, options: Options) -> Result<Self> {
        etcd::open(config, options).await
    }

    fn with(state: State, options: &Options, backend: Backend) -> Self {
        let revision = state.revision;
        Store {
            inner: Arc::new(Inner {
                state: RwLock::new(state),
                hub: Arc::new(Hub::new(revision, options.history, options.history_bytes)),
                backend,
                flushes: AtomicU64::new(0),
                committed: AtomicU64::new(0),
                deferred: AtomicU64::new(0),
            }),
        }
    }

    /// How many flushes and writes the writer has done.
    pub fn stats(&self) -> Stats {
        Stats {
            flushes: self.inner.flushes.load(Ordering::Relaxed),
            writes: self.inner.committed.load(Ordering::Relaxed),
            deferred: self.inner.deferred.load(Ordering::Relaxed),
        }
    }

    /// The newest committed revision.
    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// The revision of the latest write to a key starting with `resource/` since the store was
    /// opened (0 if none): a cheap test of whether anything of one resource changed.
    pub fn last_write(&self, resource: &str) -> u64 {
        self.read().last_writes.get(resource).copied().unwrap_or(0)
    }

    /// The object at `key`, if any.
    pub fn get(&self, key: &str) -> Option<Arc<Object>> {
        self.read().objects.get(key).cloned()
    }

    /// Every object whose key starts with `prefix` and sorts after `after` (exclusive), in key order,
    /// with the revision the snapshot was taken at.
    pub fn list(&self, prefix: &str, after: Option<&str>) -> Listing {
        let state = self.read();
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Included(prefix.to_string()),
        };
        let items = state
            .objects
            .range((lower, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, obj)| (key.clone(), obj.clone()))
            .collect();
        Listing { items, revision: state.revision }
    }

    /// Waits up to `limit` for the store to reach revision `rv` (one another server on the same
    /// datastore may have answered already); whether it did. Upstream's `waitUntilFreshAndBlock`.
    pub async fn wait_for(&self, rv: u64, limit: std::time::Duration) -> bool {
        if self.revision() >= rv {
            return true;
        }
        // Subscribed before looking again, so a write in between is not missed.
        let mut sub = self.inner.hub.subscribe_now();
        if self.revision() >= rv {
            return true;
        }
        let reached = async {
            loop {
                match sub.next().await {
                    Ok(e) if e.rv >= rv => return true,
                    Ok(_) => {}
                    Err(_) => return self.revision() >= rv,
                }
            }
        };
        tokio::time::timeout(limit, reached).await.unwrap_or(false)
    }

    /// Subscribes to every event after revision `from`.
    pub fn watch(&self, from: u64) -> Result<Subscription> {
        self.inner.hub.subscribe(from)
    }

    /// Subscribes first, then takes a snapshot, so that together they miss nothing: the subscription
    /// yields only events newer than the snapshot.
    pub fn list_and_watch(&self, prefix: &str) -> (Listing, Subscription) {
        let mut sub = self.inner.hub.subscribe_now();
        let listing = self.list(prefix, None);
        sub.skip_through(listing.revision);
        (listing, sub)
    }

    /// Whether the datastore answers: always for the embedded store; for etcd, a quorum read (the
    /// check kube-apiserver's `/readyz/etcd` makes).
    pub async fn healthy(&self) -> Result<()> {
        match &self.inner.backend {
            Backend::Sled(..) => Ok(()),
            Backend::Etcd(etcd) => etcd.health().await,
        }
    }

    /// Takes deferred writes ([`Options::deferred`]) to disk: for a clean stop.
    pub async fn sync(&self) -> Result<()> {
        match &self.inner.backend {
            Backend::Sled(writes) => {
                let (reply, rx) = oneshot::channel();
                writes.send(sled_store::Message::Sync(reply)).map_err(|_| Error::Closed)?;
                rx.await.map_err(|_| Error::Closed)?
            }
            Backend::Etcd(_) => Ok(()),
        }
    }

    /// Commits one write durably and returns the stored object (for a delete, its final state).
    pub async fn write(&self, key: String, pre: Precondition, op: Op) -> Result<Arc<Object>> {
        match &self.inner.backend {
            Backend::Sled(writes) => {
                let (reply, rx) = oneshot::channel();
                let request = sled_store::WriteRequest { key, pre, op, reply };
                writes.send(sled_store::Message::Write(request)).map_err(|_| Error::Closed)?;
                rx.await.map_err(|_| Error::Closed)?
            }
            Backend::Etcd(etcd) => etcd.write(&self.inner, key, pre, op).await,
        }
    }

    /// Bytes every server of one datastore shares outside the API (k3s's bootstrap data), at `key`
    /// beside the objects' prefix. `None` on the embedded store, which one server has to itself.
    pub async fn shared(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match &self.inner.backend {
            Backend::Sled(..) => Ok(None),
            Backend::Etcd(etcd) => etcd.get_shared(key).await,
        }
    }

    /// Stores `value` at `key` unless another server stored something first; returns what the
    /// datastore holds afterwards (`value` itself on the embedded store).
    pub async fn share(&self, key: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        match &self.inner.backend {
            Backend::Sled(..) => Ok(value),
            Backend::Etcd(etcd) => etcd.create_shared(key, value).await,
        }
    }

    /// Whether other servers may share this store (etcd): they then elect who runs the
    /// scheduler and the controllers.
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.backend, Backend::Etcd(_))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the map half-updated (each insert is atomic),
        // so a poisoned lock is still consistent.
        self.inner.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// A consistent snapshot of part of the store.
pub struct Listing {
    pub items: Vec<(String, Arc<Object>)>,
    pub revision: u64,
}

/// Makes committed events visible: the index, the revision, each resource's last write, then the
/// hub. The one way the index changes, whatever the backend.
fn apply(inner: &Inner, events: Vec<Arc<Event>>, revision: u64) {
    {
        let mut state = inner.state.write().unwrap_or_else(|e| e.into_inner());
        for event in &events {
            let resource = event.key.split('/').next().unwrap_or_default();
            match state.last_writes.get_mut(resource) {
                Some(rv) => *rv = event.rv,
                None => {
                    state.last_writes.insert(resource.to_string(), event.rv);
                }
            }
            match event.kind {
                EventType::Deleted => state.objects.remove(event.key.as_ref()),
                _ => state.objects.insert(event.key.to_string(), event.object.clone()),
            };
        }
        state.revision = state.revision.max(revision);
    }
    inner.hub.publish(events);
}

/// Checks the precondition and produces the event for one write at revision `rv`.
fn stage(key: &str, pre: Precondition, op: Op, current: Option<Arc<Object>>, rv: u64) -> Result<Event> {
    match (&current, pre) {
        (Some(_), Precondition::Absent) => return Err(Error::AlreadyExists),
        (None, Precondition::Revision(_)) => return Err(Error::NotFound),
        (Some(c), Precondition::Revision(want)) if c.rv != want => return Err(Error::Conflict { current: c.rv }),
        _ => {}
    }
    let (kind, mut value) = match op {
        Op::Put(v) if current.is_some() => (EventType::Modified, v),
        Op::Put(v) => (EventType::Added, v),
        Op::Delete(_) if current.is_none() => return Err(Error::NotFound),
        Op::Delete(v) => (EventType::Deleted, v),
    };
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    let data = Bytes::from(serde_json::to_vec(&value)?);
    Ok(Event { rv, kind, key: key.into(), object: Arc::new(Object { rv, data }), prev: current })
}

/// Reads `metadata.resourceVersion` from stored JSON without parsing the whole object.
fn revision_of(data: &[u8]) -> Result<u64, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion", default)]
        resource_version: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Partial {
        metadata: Option<Meta>,
    }
    let p: Partial = serde_json::from_slice(data)?;
    Ok(p.metadata.and_then(|m| m.resource_version).and_then(|s| s.parse().ok()).unwrap_or(0))
}

#[cfg(test)]
mod tests;
