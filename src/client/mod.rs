//! The one way components outside `api/`, `registry/` and `store/` reach the cluster: a
//! [`kube::Client`], so they speak typed k8s-openapi objects and can use kube-runtime's watcher,
//! reflector and `Controller`.
//!
//! Inside `cairn server` the client's transport is the API router itself, called in process as a
//! tower service: no socket, no TLS, no serialization beyond the JSON bodies every client sends. Its
//! requests carry an [`InProcess`] identity that the router's authentication trusts (only code in this
//! process can attach a request extension). A node on another machine builds the same `kube::Client`
//! over HTTPS instead.

pub mod balancer;
pub mod leader;

use std::fmt::Debug;
use std::hash::Hash;

use futures::StreamExt as _;
use http::Request;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::api::{InProcess, User};

/// The identity of the in-process control loops (kube-controller-manager's user name upstream).
pub fn controller_manager() -> User {
    User::new("system:kube-controller-manager", vec!["system:masters".into()])
}

/// The scheduler's identity (kube-scheduler's upstream).
pub fn scheduler() -> User {
    User::new("system:kube-scheduler", vec!["system:masters".into()])
}

/// The identity of a node's controllers: the service proxy, the cluster DNS, the routes to other
/// nodes' pods, the CSI provisioner and attacher (`system:cairn-controller`, as a joined node's).
pub fn node_controller() -> User {
    User::new(crate::api::authz::CONTROLLER_USER, vec!["system:masters".into()])
}

/// The node agent's identity (a kubelet's upstream: `system:node:<name>` in `system:nodes`).
pub fn node(name: &str) -> User {
    User::new(format!("system:node:{name}"), vec!["system:nodes".into(), "system:masters".into()])
}

/// A node's user agent, in process or from a joined machine.
pub const KUBELET_AGENT: &str = "kubelet/cairn";

/// The user agent of upstream's component with this identity: its name, up to the `/`, is the
/// field manager `metadata.managedFields` records the component's writes under.
pub fn user_agent(user: &User) -> &'static str {
    match user.name.as_str() {
        "system:kube-controller-manager" => "kube-controller-manager/cairn",
        "system:kube-scheduler" => "kube-scheduler/cairn",
        n if n.starts_with("system:node:") => KUBELET_AGENT,
        _ => "cairn/cairn",
    }
}

/// A client whose requests are served by this process's API router (`api::router`, the one the
/// listener serves, shared) as `user`.
pub fn in_process(router: axum::Router, user: User) -> kube::Client {
    let agent = http::HeaderValue::from_static(user_agent(&user));
    let service = tower::ServiceBuilder::new()
        .map_request(move |mut req: Request<kube::client::Body>| {
            req.headers_mut().entry(http::header::USER_AGENT).or_insert_with(|| agent.clone());
            req.extensions_mut().insert(InProcess(user.clone()));
            req
        })
        .service(router);
    kube::Client::new(service, "default")
}

/// A cache of the objects `api` and `config` select, fed by a watch (kube-runtime's reflector; it
/// relists after a gap) until `shutdown`.
pub fn cache<K>(api: kube::Api<K>, config: watcher::Config, shutdown: &CancellationToken) -> Store<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let follow =
        reflector::reflector(writer, watcher(api, config)).default_backoff().for_each(|_| std::future::ready(()));
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = follow => {}
            _ = shutdown.cancelled() => {}
        }
    });
    store
}

/// The same, with a signal of every change it applies (for waiting on a condition of the cache).
pub fn notified_cache<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    shutdown: &CancellationToken,
) -> (Store<K>, tokio::sync::watch::Receiver<u64>)
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let follow = reflector::reflector(writer, watcher(api, config)).default_backoff().for_each(move |event| {
        if event.is_ok() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        std::future::ready(())
    });
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = follow => {}
            _ = shutdown.cancelled() => {}
        }
    });
    (store, rx)
}

/// A store in a temporary folder with its registry, and an in-process client on it.
#[cfg(test)]
pub async fn for_tests() -> (tempfile::TempDir, crate::registry::Registry, kube::Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::store::Store::open(dir.path(), Default::default()).expect("store");
    let registry = crate::registry::Registry::new(store);
    crate::registry::bootstrap::system_namespaces(&registry).await.expect("system namespaces");
    let client = on_registry(&registry);
    (dir, registry, client)
}

/// An in-process client on a registry of a test's own.
#[cfg(test)]
pub fn on_registry(registry: &crate::registry::Registry) -> kube::Client {
    let state = crate::api::AppState::new(registry.clone(), Default::default(), "127.0.0.1:6443".into());
    in_process(crate::api::router(std::sync::Arc::new(state)), controller_manager())
}
