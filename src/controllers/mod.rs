//! The control loops a single-node cluster needs from kube-controller-manager: namespace lifecycle,
//! default service accounts, garbage collection by owner, and event expiry.
//!
//! Each loop drives the registry in process; none reaches into another.

mod gc;
mod namespace;

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::registry::{Registry, Resource, StatusError, WatchItem, WatchOptions, WriteOptions};

/// Namespaces every cluster starts with.
pub const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// How long events are kept (kube-apiserver's `--event-ttl` default).
const EVENT_TTL: Duration = Duration::from_secs(3600);

/// Creates the system namespaces if they are missing.
pub async fn bootstrap(registry: &Registry) -> Result<(), StatusError> {
    let namespaces = resource(registry, "", "namespaces")?;
    for name in SYSTEM_NAMESPACES {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match registry.create(&namespaces, None, ns, &WriteOptions::default()).await {
            Ok(_) => tracing::info!("created namespace {name}"),
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Starts every controller; they stop when `shutdown` fires.
pub fn spawn_all(registry: &Registry, shutdown: &CancellationToken) {
    let r = registry.clone();
    tokio::spawn(supervise("namespace", shutdown.clone(), move || namespace::run(r.clone())));
    let r = registry.clone();
    tokio::spawn(supervise("serviceaccount", shutdown.clone(), move || service_accounts(r.clone())));
    let r = registry.clone();
    tokio::spawn(supervise("garbage-collector", shutdown.clone(), move || gc::run(r.clone())));
    let r = registry.clone();
    tokio::spawn(supervise("event-ttl", shutdown.clone(), move || expire_events(r.clone())));
}

/// Runs a controller loop, restarting it after a pause if it fails, until shutdown.
async fn supervise<F, Fut>(name: &'static str, shutdown: CancellationToken, run: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), StatusError>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = run() => {
                if let Err(e) = result {
                    // 410 only means the watch must be restarted from a fresh list.
                    if e.code != 410 {
                        tracing::warn!("{name} controller stopped: {e}; restarting");
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn resource(registry: &Registry, group: &str, plural: &str) -> Result<Resource, StatusError> {
    let version = "v1";
    registry.find(group, version, plural).ok_or_else(|| StatusError::internal(format!("{plural} are not served")))
}

fn parse(bytes: &[u8]) -> Result<Value, StatusError> {
    serde_json::from_slice(bytes).map_err(StatusError::internal)
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// Every active namespace has a `default` ServiceAccount.
async fn service_accounts(registry: Registry) -> Result<(), StatusError> {
    let namespaces = resource(&registry, "", "namespaces")?;
    let accounts = resource(&registry, "", "serviceaccounts")?;
    let mut ns_watch = registry.watch(&namespaces, None, WatchOptions::default())?;
    let mut sa_watch = registry.watch(&accounts, None, WatchOptions::default())?;
    loop {
        let ns = tokio::select! {
            item = ns_watch.next() => match item? {
                WatchItem::Added(o) | WatchItem::Modified(o) => {
                    let v = parse(&o)?;
                    if crate::registry::is_terminating(&v) { continue }
                    name_of(&v)
                }
                _ => continue,
            },
            item = sa_watch.next() => match item? {
                WatchItem::Deleted(o) => {
                    let v = parse(&o)?;
                    if name_of(&v) != "default" { continue }
                    v["metadata"]["namespace"].as_str().unwrap_or_default().to_string()
                }
                _ => continue,
            },
        };
        if registry.get(&accounts, Some(&ns), "default").is_ok() {
            continue;
        }
        let sa =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
        match registry.create(&accounts, Some(&ns), sa, &WriteOptions::default()).await {
            Ok(_) => tracing::debug!("created service account {ns}/default"),
            // Gone meanwhile, or terminating: nothing to do.
            Err(e) if matches!(e.code, 403 | 404 | 409) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Deletes events older than the TTL, every few minutes.
async fn expire_events(registry: Registry) -> Result<(), StatusError> {
    let events = resource(&registry, "", "events")?;
    loop {
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(EVENT_TTL).unwrap_or_default();
        let page = registry.list(&events, None, &Default::default())?;
        for item in &page.items {
            let v = parse(item)?;
            let last = ["lastTimestamp", "eventTime", "firstTimestamp"]
                .iter()
                .filter_map(|f| v[f].as_str())
                .chain(v["series"]["lastObservedTime"].as_str())
                .chain(v["metadata"]["creationTimestamp"].as_str())
                .filter_map(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .max();
            if last.is_some_and(|t| t < cutoff) {
                let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
                let _ = registry.delete(&events, ns.as_deref(), &name_of(&v), &Default::default()).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(300)).await;
    }
}
