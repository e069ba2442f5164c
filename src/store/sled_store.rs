//! The sled backend: one writer thread takes every pending write, stages them in order against the
//! index (each seeing the ones before it), applies them to sled as one atomic batch with the revision
//! counter, flushes once, then makes them visible and answers them all (group commit).

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
    let store = Store::with(state, &options, Backend::Sled(tx));
    let writer = Writer { db, inner: Arc::downgrade(&store.inner) };
    thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || writer.run(rx))
        .map_err(|e| Error::Write(sled::Error::Io(e)))?;
    Ok(store)
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
            let result = super::stage(&req.key, req.pre, req.op, current, revision + 1).inspect(|event| {
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
        super::apply(inner, events, revision);
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
}

fn decode_revision(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}
