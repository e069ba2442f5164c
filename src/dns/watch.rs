//! The watches the record set is built from (CoreDNS's `dnsController`): reflectors of Services,
//! EndpointSlices and Namespaces; every change wakes one rebuilder, which builds a new
//! [`RecordSet`] from the three caches and swaps it in. Changes arriving during a rebuild are
//! folded into the next one, so a burst costs a few rebuilds, not one per object.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::records::RecordSet;
use super::server::Snapshot;

/// The three caches, readable while their watches run.
#[derive(Clone)]
pub struct Caches {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    namespaces: Store<Namespace>,
}

impl Caches {
    /// Waits until every cache holds its first list; false when a watch stopped first (shutdown).
    pub async fn ready(&self) -> bool {
        self.services.wait_until_ready().await.is_ok()
            && self.slices.wait_until_ready().await.is_ok()
            && self.namespaces.wait_until_ready().await.is_ok()
    }
}

fn watch<K>(api: Api<K>, changed: Arc<Notify>, shutdown: CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let events = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
        let mut events = std::pin::pin!(events.take_until(shutdown.cancelled_owned()));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                    changed.notify_one();
                }
                Ok(_) => {}
                // The watcher retries with backoff; the last snapshot keeps answering meanwhile.
                Err(e) => tracing::debug!("cluster DNS watch of {}: {e}", K::kind(&())),
            }
        }
    });
    reader
}

/// Starts the watches and the rebuilder that keeps `snapshot` current until `shutdown`.
pub fn start(client: Client, domain: String, snapshot: Snapshot, shutdown: CancellationToken) -> Caches {
    let changed = Arc::new(Notify::new());
    let caches = Caches {
        services: watch(Api::all(client.clone()), changed.clone(), shutdown.clone()),
        slices: watch(Api::all(client.clone()), changed.clone(), shutdown.clone()),
        namespaces: watch(Api::all(client), changed.clone(), shutdown.clone()),
    };
    let reader = caches.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = changed.notified() => {}
                () = shutdown.cancelled() => return,
            }
            let serial = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
            let (services, slices, namespaces) =
                (reader.services.state(), reader.slices.state(), reader.namespaces.state());
            let built = RecordSet::build(
                &domain,
                u32::try_from(serial).unwrap_or(u32::MAX),
                namespaces.iter().map(AsRef::as_ref),
                services.iter().map(AsRef::as_ref),
                slices.iter().map(AsRef::as_ref),
            );
            match built {
                Ok(set) => {
                    tracing::debug!("cluster DNS records rebuilt: {} services", set.service_count());
                    snapshot.store(Arc::new(set));
                }
                Err(e) => tracing::warn!("cluster DNS records not rebuilt: {e}"),
            }
        }
    });
    caches
}
