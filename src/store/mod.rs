//! The only owner of sled: durable objects, one cluster-wide resourceVersion, and the watch hub.
//!
//! # Guarantees
//! - Every object is stored as its JSON bytes, with `metadata.resourceVersion` set to the revision of
//!   the write that produced it. Revisions come from one counter that only ever increases, also across
//!   restarts (it is persisted in the same atomic batch as the objects).
//! - A write is acknowledged only after sled has flushed it to disk. Writes arriving while a flush is in
//!   progress are committed together with one flush (group commit): one writer thread takes every
//!   pending write, applies them as one atomic batch, flushes once, then answers them all.
//! - Readers never see a write before it is durable: the in-memory index that serves reads and watches
//!   is updated after the flush.
//!
//! # Caveats
//! - Reads are served from an in-memory index of the current objects (like kube-apiserver's watch
//!   cache); sled is read once, at start-up.
//! - Watch history is a bounded window; resuming from a revision older than the window (or from before
//!   a restart) fails with [`Error::TooOld`], and the caller must re-list, as clients do on 410 Gone.

mod watch;

pub use watch::{Event, EventType, Subscription};

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, mpsc};
use std::thread;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::oneshot;

use watch::Hub;

/// Key under which the revision counter is persisted; sorts before every object key.
const REVISION_KEY: &[u8] = b"\0revision";
/// Most writes committed in one batch.
const MAX_BATCH: usize = 512;

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

struct WriteRequest {
    key: String,
    pre: Precondition,
    op: Op,
    reply: oneshot::Sender<Result<Arc<Object>>>,
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
    writes: mpsc::Sender<WriteRequest>,
    flushes: AtomicU64,
    committed: AtomicU64,
}

/// Counters of the writer, for benchmarks and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Flushes to disk (one per committed batch).
    pub flushes: u64,
    /// Writes committed.
    pub writes: u64,
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
}

impl Default for Options {
    fn default() -> Self {
        Self { cache_bytes: 16 << 20, history: 10_000, history_bytes: 32 << 20 }
    }
}

impl Store {
    /// Opens (or creates) the store at `path` and loads the current objects.
    pub fn open(path: &Path, options: Options) -> Result<Self> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(options.cache_bytes)
            // Every acknowledged write is flushed explicitly; no background flushing on top.
            .flush_every_ms(None)
            .open()
            .map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        let mut state = State::default();
        for entry in db.iter() {
            let (key, value) = entry?;
            if key.as_ref() == REVISION_KEY {
                state.revision = decode_revision(&value);
                continue;
            }
            let key = String::from_utf8_lossy(&key).into_owned();
            let data = Bytes::copy_from_slice(&value);
            let rv = revision_of(&data).map_err(|source| Error::Corrupt { key: key.clone(), source })?;
            state.objects.insert(key, Arc::new(Object { rv, data }));
        }
        let revision = state.revision;
        let (tx, rx) = mpsc::channel();
        let inner = Arc::new(Inner {
            state: RwLock::new(state),
            hub: Arc::new(Hub::new(revision, options.history, options.history_bytes)),
            writes: tx,
            flushes: AtomicU64::new(0),
            committed: AtomicU64::new(0),
        });
        let writer = Writer { db, inner: Arc::downgrade(&inner) };
        thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| Error::Write(sled::Error::Io(e)))?;
        Ok(Self { inner })
    }

    /// How many flushes and writes the writer has done.
    pub fn stats(&self) -> Stats {
        Stats {
            flushes: self.inner.flushes.load(Ordering::Relaxed),
            writes: self.inner.committed.load(Ordering::Relaxed),
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

    /// Commits one write durably and returns the stored object (for a delete, its final state).
    pub async fn write(&self, key: String, pre: Precondition, op: Op) -> Result<Arc<Object>> {
        let (reply, rx) = oneshot::channel();
        self.inner.writes.send(WriteRequest { key, pre, op, reply }).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
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

struct Writer {
    db: sled::Db,
    inner: std::sync::Weak<Inner>,
}

struct Staged {
    reply: oneshot::Sender<Result<Arc<Object>>>,
    result: Result<Event>,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<WriteRequest>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            let Some(inner) = self.inner.upgrade() else { return };
            self.commit(&inner, batch);
        }
        if let Err(e) = self.db.flush() {
            tracing::error!("final flush of the store failed: {e}");
        }
    }

    fn commit(&self, inner: &Inner, batch: Vec<WriteRequest>) {
        // This thread is the only mutator of the index, so it may read it without holding the lock
        // across the batch.
        let lookup = |key: &str| inner.state.read().unwrap_or_else(|e| e.into_inner()).objects.get(key).cloned();
        let mut revision = inner.state.read().unwrap_or_else(|e| e.into_inner()).revision;
        // Writes later in the batch see earlier ones through this overlay.
        let mut overlay: BTreeMap<String, Option<Arc<Object>>> = BTreeMap::new();
        let mut sled_batch = sled::Batch::default();
        let mut staged = Vec::with_capacity(batch.len());
        for req in batch {
            let current = match overlay.get(&req.key) {
                Some(o) => o.clone(),
                None => lookup(&req.key),
            };
            let result = stage(&req.key, req.pre, req.op, current, revision + 1).inspect(|event| {
                revision = event.rv;
                match event.kind {
                    EventType::Deleted => {
                        sled_batch.remove(req.key.as_bytes());
                        overlay.insert(req.key.clone(), None);
                    }
                    _ => {
                        sled_batch.insert(req.key.as_bytes(), event.object.data.as_ref());
                        overlay.insert(req.key.clone(), Some(event.object.clone()));
                    }
                }
            });
            staged.push(Staged { reply: req.reply, result });
        }
        if overlay.is_empty() {
            for s in staged {
                let _ = s.reply.send(s.result.map(|e| e.object));
            }
            return;
        }
        sled_batch.insert(REVISION_KEY, &revision.to_be_bytes());
        let durable = self.db.apply_batch(sled_batch).and_then(|_| self.db.flush().map(|_| ()));
        if let Err(e) = durable {
            tracing::error!("committing {} write(s) to disk failed: {e}", staged.len());
            let msg = e.to_string();
            for s in staged {
                let _ = s.reply.send(Err(Error::Write(sled::Error::Unsupported(msg.clone()))));
            }
            return;
        }
        inner.flushes.fetch_add(1, Ordering::Relaxed);
        inner.committed.fetch_add(overlay_writes(&staged), Ordering::Relaxed);
        {
            let mut state = inner.state.write().unwrap_or_else(|e| e.into_inner());
            for (key, obj) in overlay {
                let resource = key.split('/').next().unwrap_or_default();
                match state.last_writes.get_mut(resource) {
                    Some(rv) => *rv = revision,
                    None => {
                        state.last_writes.insert(resource.to_string(), revision);
                    }
                }
                match obj {
                    Some(o) => state.objects.insert(key, o),
                    None => state.objects.remove(&key),
                };
            }
            state.revision = revision;
        }
        let mut replies = Vec::with_capacity(staged.len());
        let events: Vec<Arc<Event>> = staged
            .into_iter()
            .filter_map(|s| match s.result {
                Ok(event) => {
                    let event = Arc::new(event);
                    replies.push((s.reply, Ok(event.object.clone())));
                    Some(event)
                }
                Err(e) => {
                    replies.push((s.reply, Err(e)));
                    None
                }
            })
            .collect();
        inner.hub.publish(events);
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
}

fn overlay_writes(staged: &[Staged]) -> u64 {
    staged.iter().filter(|s| s.result.is_ok()).count() as u64
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

fn decode_revision(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
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
