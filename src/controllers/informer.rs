//! One watch of a kind shared by several controllers (client-go's shared informer): a reflector
//! cache every subscriber reads, and each change (deletions included, which kube-runtime's shared
//! streams leave out) passed to every subscriber's trigger stream.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::channel::mpsc;
use futures::{SinkExt as _, Stream, StreamExt as _};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// A controller's client-side cache of a kind (kube-runtime's reflector store; not cairn's store).
pub type Cache<K> = Store<K>;

/// Waits until `cache` holds the first list; false when its watch stopped first (shutdown).
///
/// kube-runtime's readiness is a oneshot channel that remembers only the last waiter's waker, so
/// of several tasks waiting at once all but one would sleep forever: each waiter polls again every
/// 100 ms until the list is in (after that the answer is immediate).
pub async fn synced<K: kube::Resource<DynamicType = ()> + Clone + 'static>(cache: &Cache<K>) -> bool {
    loop {
        match tokio::time::timeout(std::time::Duration::from_millis(100), cache.wait_until_ready()).await {
            Ok(ready) => return ready.is_ok(),
            Err(_) => continue,
        }
    }
}

/// Changes a slow subscriber may fall behind by before the watch waits for it.
const BUFFER: usize = 1024;

pub struct Informer<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<K>,
    config: watcher::Config,
    reader: Cache<K>,
    writer: reflector::store::Writer<K>,
    subscribers: Vec<mpsc::Sender<Arc<K>>>,
}

impl<K> Informer<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        let (reader, writer) = reflector::store();
        Informer { api, config, reader, writer, subscribers: Vec::new() }
    }

    /// The cache, filled once the first list is in (`Store::wait_until_ready`).
    pub fn cache(&self) -> Cache<K> {
        self.reader.clone()
    }

    /// A stream of every object added, changed or deleted from now on, for
    /// `Controller::watches_shared_stream`. Subscribers share one copy of each object.
    pub fn subscribe(&mut self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let (tx, rx) = mpsc::channel(BUFFER);
        self.subscribers.push(tx);
        rx
    }

    /// Runs the watch until `shutdown`.
    pub fn spawn(self, shutdown: CancellationToken) {
        let Informer { api, config, writer, mut subscribers, .. } = self;
        tokio::spawn(async move {
            let events = reflector::reflector(writer, watcher(api, config).default_backoff());
            let mut events = std::pin::pin!(events.take_until(shutdown.cancelled_owned()));
            while let Some(event) = events.next().await {
                let obj = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o)) => {
                        Arc::new(o)
                    }
                    Ok(_) => continue,
                    // The watcher retries with backoff; the API is away meanwhile.
                    Err(e) => {
                        tracing::debug!("shared watch of {}: {e}", K::kind(&()));
                        continue;
                    }
                };
                for tx in &mut subscribers {
                    // A subscriber gone (its controller stopped) is no reason to stop the others.
                    let _ = tx.send(obj.clone()).await;
                }
            }
        });
    }
}
