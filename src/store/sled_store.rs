//! The sled backend: one writer thread takes every pending write, stages them in order against the
//! index (each seeing the ones before it), applies them to sled as one atomic batch with the revision
//! counter, flushes once, then makes them visible and answers them all (group commit). A batch of
//! nothing but deferred updates ([`super::Options::deferred`]) is kept in memory and goes to disk
//! with the next batch that is flushed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{Backend, Error, Event, EventType, Inner, Object, Op, Options, Precondition, Result, State, Store};

/// Key under which the revision counter is persisted; sorts before every object key.
const REVISION_KEY: &[u8] = b"\0revision";
/// Most writes committed in one batch.
const MAX_BATCH: usize = 512;
/// Revisions reserved on disk ahead of deferred writes: a batch of deferred writes that would
/// pass the counter on disk is flushed, moving it this far ahead, so at most one in this many
/// costs a flush.
const RESERVED_REVISIONS: u64 = 1000;

/// What the writer thread is asked to do.
pub(super) enum Message {
    Write(WriteRequest),
    /// Take the deferred writes to disk now (a clean stop).
    Sync(oneshot::Sender<Result<()>>),
}

pub(super) struct WriteRequest {
    pub key: String,
    pub pre: Precondition,
    pub op: Op,
    pub reply: oneshot::Sender<Result<Arc<Object>>>,
}

/// Opens (or creates) the store at `path`, loads the current objects and starts the writer.
pub(super) fn open(path: &Path, options: Options) -> Result<Store> {
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
        let rv = super::revision_of(&data).map_err(|source| Error::Corrupt { key: key.clone(), source })?;
        state.objects.insert(key, Arc::new(Object { rv, data }));
    }
    let (tx, rx) = mpsc::channel();
    let on_disk = state.revision;
    let store = Store::with(state, &options, Backend::Sled(tx));
    let writer = Writer {
        db,
        inner: Arc::downgrade(&store.inner),
        deferred: options.deferred,
        pending: BTreeMap::new(),
        on_disk,
    };
    thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || writer.run(rx))
        .map_err(|e| Error::Write(sled::Error::Io(e)))?;
    Ok(store)
}

struct Writer {
    db: sled::Db,
    inner: std::sync::Weak<Inner>,
    /// Key prefixes whose updates need no flush of their own ([`super::Options::deferred`]).
    deferred: Vec<String>,
    /// Deferred updates not on disk yet, the latest of each key. They are kept here, not handed to
    /// sled, because sled writes every batch to its log file at once (flushed or not), and the
    /// point is not to write them at all until something else is written.
    pending: BTreeMap<String, Arc<Object>>,
    /// The revision counter as last flushed. Every revision handed out is either in a flushed
    /// batch or at most this, so a store reopened after a crash never hands one out twice.
    on_disk: u64,
}

struct Staged {
    reply: oneshot::Sender<Result<Arc<Object>>>,
    result: Result<Event>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Message>) {
        while let Ok(first) = rx.recv() {
            let (mut batch, mut syncs) = (Vec::new(), Vec::new());
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Write(req) => batch.push(req),
                    Message::Sync(reply) => syncs.push(reply),
                }
                if batch.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            let Some(inner) = self.inner.upgrade() else { break };
            if !batch.is_empty() {
                self.commit(&inner, batch);
            }
            if !syncs.is_empty() {
                let synced = self.sync();
                for reply in syncs {
                    let _ = reply.send(synced.as_ref().map(drop).map_err(|e| Error::Write(unsupported(e))));
                }
            }
        }
        // A clean stop: deferred writes go to disk too.
        if let Err(e) = self.sync() {
            tracing::error!("final flush of the store failed: {e}");
        }
    }

    /// Writes the deferred updates and flushes.
    fn sync(&mut self) -> sled::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = self.take_pending();
        self.db.apply_batch(batch)?;
        self.db.flush().map(drop)
    }

    /// A batch of the deferred updates, which are no longer pending.
    fn take_pending(&mut self) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (key, object) in std::mem::take(&mut self.pending) {
            batch.insert(key.as_bytes(), object.data.as_ref());
        }
        batch
    }

    /// Whether the write can wait for the next flush: an update under a deferred prefix.
    fn deferrable(&self, event: &Event) -> bool {
        event.kind == EventType::Modified && self.deferred.iter().any(|p| event.key.starts_with(p.as_str()))
    }

    fn commit(&mut self, inner: &Inner, batch: Vec<WriteRequest>) {
        // This thread is the only mutator of the index, so it may read it without holding the lock
        // across the batch.
        let lookup = |key: &str| inner.state.read().unwrap_or_else(|e| e.into_inner()).objects.get(key).cloned();
        let mut revision = inner.state.read().unwrap_or_else(|e| e.into_inner()).revision;
        // Writes later in the batch see earlier ones through this overlay.
        let mut overlay: BTreeMap<String, Option<Arc<Object>>> = BTreeMap::new();
        let mut staged = Vec::with_capacity(batch.len());
        let mut deferrable = true;
        for req in batch {
            let current = match overlay.get(&req.key) {
                Some(o) => o.clone(),
                None => lookup(&req.key),
            };
            let result = super::stage(&req.key, req.pre, req.op, current, revision + 1).inspect(|event| {
                revision = event.rv;
                deferrable &= self.deferrable(event);
                let after = (event.kind != EventType::Deleted).then(|| event.object.clone());
                overlay.insert(req.key.clone(), after);
            });
            staged.push(Staged { reply: req.reply, result });
        }
        if overlay.is_empty() {
            for s in staged {
                let _ = s.reply.send(s.result.map(|e| e.object));
            }
            return;
        }
        // Deferred writes within the revisions reserved on disk wait in memory; anything else goes
        // to disk with the deferred writes before it and the counter, which a batch of deferred
        // writes moves ahead of itself to reserve revisions.
        let deferred = deferrable && revision <= self.on_disk;
        if deferred {
            for (key, object) in overlay {
                if let Some(object) = object {
                    self.pending.insert(key, object);
                }
            }
        } else {
            let counter = match deferrable {
                true => revision + RESERVED_REVISIONS,
                false => revision.max(self.on_disk),
            };
            let mut sled_batch = self.take_pending();
            for (key, object) in &overlay {
                match object {
                    Some(object) => sled_batch.insert(key.as_bytes(), object.data.as_ref()),
                    None => sled_batch.remove(key.as_bytes()),
                }
            }
            sled_batch.insert(REVISION_KEY, &counter.to_be_bytes());
            let durable = self.db.apply_batch(sled_batch).and_then(|_| self.db.flush().map(drop));
            if let Err(e) = durable {
                tracing::error!("committing {} write(s) to disk failed: {e}", staged.len());
                for s in staged {
                    let _ = s.reply.send(Err(Error::Write(unsupported(&e))));
                }
                return;
            }
            self.on_disk = counter;
            inner.flushes.fetch_add(1, Ordering::Relaxed);
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
        inner.committed.fetch_add(events.len() as u64, Ordering::Relaxed);
        if deferred {
            inner.deferred.fetch_add(events.len() as u64, Ordering::Relaxed);
        }
        super::apply(inner, events, revision);
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
}

fn decode_revision(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

/// A sled error again, for each of the writes it failed (sled's errors are not `Clone`).
fn unsupported(e: &sled::Error) -> sled::Error {
    sled::Error::Unsupported(e.to_string())
}
