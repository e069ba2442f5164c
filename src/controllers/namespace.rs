//! Namespace deletion: a terminating namespace is emptied, then its `kubernetes` finalizer is removed
//! through `/finalize`, which lets the storage delete it.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use super::{name_of, parse, resource};
use crate::registry::{Registry, StatusError, WatchItem, WatchOptions, WriteOptions, is_terminating};

/// How often namespaces still waiting for their content to go are looked at again.
const RECHECK: Duration = Duration::from_secs(2);

pub async fn run(registry: Registry) -> Result<(), StatusError> {
    let namespaces = resource(&registry, "", "namespaces")?;
    let mut watch = registry.watch(&namespaces, None, WatchOptions::default())?;
    let mut terminating: BTreeSet<String> = BTreeSet::new();
    let mut tick = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            item = watch.next() => match item? {
                WatchItem::Added(o) | WatchItem::Modified(o) => {
                    let v = parse(&o)?;
                    if is_terminating(&v) {
                        terminating.insert(name_of(&v));
                    }
                }
                WatchItem::Deleted(o) => {
                    terminating.remove(&name_of(&parse(&o)?));
                }
                WatchItem::Bookmark { .. } => {}
            },
            _ = tick.tick(), if !terminating.is_empty() => {}
        }
        let pending: Vec<String> = terminating.iter().cloned().collect();
        for ns in pending {
            if finish(&registry, &ns).await? {
                terminating.remove(&ns);
            }
        }
    }
}

/// Deletes what is left in `ns`; once nothing is, finalizes it. Returns whether it was finalized.
async fn finish(registry: &Registry, ns: &str) -> Result<bool, StatusError> {
    let mut left = 0;
    let mut seen_storage = BTreeSet::new();
    for r in registry.resources().iter().filter(|r| r.info().namespaced) {
        // Two views of one storage (events) are emptied once.
        if !seen_storage.insert(r.info().storage) {
            continue;
        }
        let page = registry.list(r, Some(ns), &Default::default())?;
        for item in &page.items {
            left += 1;
            let v = parse(item)?;
            if is_terminating(&v) {
                continue;
            }
            match registry.delete(r, Some(ns), &name_of(&v), &Default::default()).await {
                Ok(_) => {}
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if left > 0 {
        return Ok(false);
    }
    let namespaces = resource(registry, "", "namespaces")?;
    let current = match registry.get_value(&namespaces, None, ns) {
        Ok(v) => v,
        Err(e) if e.code == 404 => return Ok(true),
        Err(e) => return Err(e),
    };
    let finalizers: Vec<Value> = current["spec"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter().filter(|x| x.as_str() != Some(crate::registry::kinds::NAMESPACE_FINALIZER)).cloned().collect()
        })
        .unwrap_or_default();
    let mut body = current.clone();
    body["spec"]["finalizers"] = json!(finalizers);
    match registry.update(&namespaces, None, ns, body, Some("finalize"), &WriteOptions::default()).await {
        Ok(_) => {
            tracing::info!("namespace {ns} is empty and finalized");
            Ok(true)
        }
        Err(e) if e.code == 404 => Ok(true),
        Err(e) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
