//! Garbage collection by `ownerReferences`, the `orphan` and `foregroundDeletion` finalizers, and
//! removal of pods bound to a node that was deleted (upstream's PodGC).
//!
//! The collector follows every change in the store and keeps a small index: object uid → key, and
//! owner uid → dependent keys. Only objects with owners (or that are owners) cost memory.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::json;

use crate::registry::patch::PatchType;
use crate::registry::{DeleteOptions, Registry, Resource, StatusError, WriteOptions};
use crate::store::{EventType, Object};

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    owner_references: Vec<OwnerRef>,
    #[serde(default)]
    finalizers: Vec<String>,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize)]
struct OwnerRef {
    uid: String,
}

#[derive(Deserialize)]
struct Partial {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Option<PodSpecPart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecPart {
    #[serde(default)]
    node_name: Option<String>,
}

fn meta(obj: &Object) -> Option<Partial> {
    serde_json::from_slice(&obj.data).ok()
}

#[derive(Default)]
struct Index {
    /// uid → store key of every live object.
    uids: HashMap<String, String>,
    /// owner uid → keys of its dependents.
    dependents: HashMap<String, BTreeSet<String>>,
    /// key → owner uids, for objects that have owners.
    owners: HashMap<String, Vec<String>>,
    /// key → uid, to unindex by key.
    keys: HashMap<String, String>,
}

impl Index {
    fn upsert(&mut self, key: &str, m: &Meta) {
        self.remove(key);
        self.uids.insert(m.uid.clone(), key.to_string());
        self.keys.insert(key.to_string(), m.uid.clone());
        if !m.owner_references.is_empty() {
            let owners: Vec<String> = m.owner_references.iter().map(|o| o.uid.clone()).collect();
            for o in &owners {
                self.dependents.entry(o.clone()).or_default().insert(key.to_string());
            }
            self.owners.insert(key.to_string(), owners);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(owners) = self.owners.remove(key) {
            for o in owners {
                if let Some(set) = self.dependents.get_mut(&o) {
                    set.remove(key);
                    if set.is_empty() {
                        self.dependents.remove(&o);
                    }
                }
            }
        }
        if let Some(uid) = self.keys.remove(key) {
            self.uids.remove(&uid);
        }
    }

    /// Whether every owner of `key` is gone.
    fn orphaned(&self, key: &str) -> bool {
        self.owners.get(key).is_some_and(|owners| owners.iter().all(|o| !self.uids.contains_key(o)))
    }
}

struct Collector {
    registry: Registry,
    index: Index,
    /// storage prefix → resource.
    by_storage: HashMap<&'static str, Resource>,
}

pub async fn run(registry: Registry) -> Result<(), StatusError> {
    let mut by_storage = HashMap::new();
    for r in registry.resources() {
        by_storage.entry(r.info().storage).or_insert_with(|| r.clone());
    }
    let (listing, mut sub) = registry.store().list_and_watch("");
    let mut c = Collector { registry, index: Index::default(), by_storage };
    for (key, obj) in &listing.items {
        if let Some(p) = meta(obj) {
            c.index.upsert(key, &p.metadata);
        }
    }
    let orphans: Vec<String> = c.index.owners.keys().filter(|k| c.index.orphaned(k)).cloned().collect();
    for key in orphans {
        c.delete_key(&key, None).await?;
    }
    for (key, obj) in &listing.items {
        if let Some(p) = meta(obj) {
            c.finalize(key, &p.metadata).await?;
        }
    }
    loop {
        let event = sub.next().await.map_err(|e| StatusError::gone(e.to_string()))?;
        let Some(p) = meta(&event.object) else { continue };
        match event.kind {
            EventType::Deleted => {
                c.index.remove(&event.key);
                c.on_deleted(&event.key, &p).await?;
            }
            _ => {
                c.index.upsert(&event.key, &p.metadata);
                if c.index.orphaned(&event.key) {
                    c.delete_key(&event.key, None).await?;
                } else {
                    c.finalize(&event.key, &p.metadata).await?;
                }
            }
        }
    }
}

impl Collector {
    fn resource_of(&self, key: &str) -> Option<Resource> {
        self.by_storage.get(key.split('/').next()?).cloned()
    }

    /// Splits a store key into namespace and name for its resource.
    fn locate(&self, key: &str) -> Option<(Resource, Option<String>, String)> {
        let r = self.resource_of(key)?;
        let rest: Vec<&str> = key.splitn(3, '/').collect();
        match (r.info().namespaced, rest.as_slice()) {
            (true, [_, ns, name]) => Some((r, Some(ns.to_string()), name.to_string())),
            (false, [_, name]) => Some((r, None, name.to_string())),
            _ => None,
        }
    }

    async fn delete_key(&self, key: &str, grace: Option<i64>) -> Result<(), StatusError> {
        let Some((r, ns, name)) = self.locate(key) else { return Ok(()) };
        let opts = DeleteOptions { grace_period_seconds: grace, ..Default::default() };
        match self.registry.delete(&r, ns.as_deref(), &name, &opts).await {
            Ok(_) => {
                tracing::debug!("garbage collector deleted {key}");
                Ok(())
            }
            Err(e) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn on_deleted(&mut self, key: &str, p: &Partial) -> Result<(), StatusError> {
        // Dependents whose last owner this was go too.
        let deps: Vec<String> = self.index.dependents.get(&p.metadata.uid).into_iter().flatten().cloned().collect();
        for d in deps {
            if self.index.orphaned(&d) {
                self.delete_key(&d, None).await?;
            }
        }
        // An owner waiting in foreground deletion may now be free to go.
        for owner in &p.metadata.owner_references {
            if let Some(owner_key) = self.index.uids.get(&owner.uid).cloned()
                && let Some((r, ns, name)) = self.locate(&owner_key)
                && let Ok(v) = self.registry.get_value(&r, ns.as_deref(), &name)
                && let Ok(m) = serde_json::from_value::<Meta>(v["metadata"].clone())
            {
                self.finalize(&owner_key, &m).await?;
            }
        }
        // Pods bound to a deleted node are removed at once.
        if key.starts_with(&format!("{}/", crate::registry::kinds::NODES_STORAGE)) {
            let node = &p.metadata.name;
            let pods = self.by_storage.get("pods").cloned();
            if let Some(pods) = pods {
                let fields = crate::registry::selector::FieldSelector::parse(&format!("spec.nodeName={node}"))
                    .map_err(|e| StatusError::internal(e.to_string()))?;
                let page =
                    self.registry.list(&pods, None, &crate::registry::ListOptions { fields, ..Default::default() })?;
                for item in page.items {
                    let Ok(pod) = serde_json::from_slice::<Partial>(&item) else { continue };
                    let bound = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                    if bound == *node {
                        let k = format!("pods/{}/{}", pod.metadata.namespace.unwrap_or_default(), pod.metadata.name);
                        self.delete_key(&k, Some(0)).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Works the `orphan` and `foregroundDeletion` finalizers of a terminating owner.
    async fn finalize(&self, key: &str, m: &Meta) -> Result<(), StatusError> {
        if m.deletion_timestamp.is_none() {
            return Ok(());
        }
        let deps: Vec<String> = self.index.dependents.get(&m.uid).into_iter().flatten().cloned().collect();
        if m.finalizers.iter().any(|f| f == "orphan") {
            for d in &deps {
                self.drop_owner(d, &m.uid).await?;
            }
            self.remove_finalizer(key, m, "orphan").await?;
        } else if m.finalizers.iter().any(|f| f == "foregroundDeletion") {
            if deps.is_empty() {
                self.remove_finalizer(key, m, "foregroundDeletion").await?;
            } else {
                for d in &deps {
                    self.delete_key(d, None).await?;
                }
            }
        }
        Ok(())
    }

    async fn drop_owner(&self, key: &str, owner_uid: &str) -> Result<(), StatusError> {
        let Some((r, ns, name)) = self.locate(key) else { return Ok(()) };
        let Ok(v) = self.registry.get_value(&r, ns.as_deref(), &name) else { return Ok(()) };
        let owners: Vec<serde_json::Value> = v["metadata"]["ownerReferences"]
            .as_array()
            .map(|a| a.iter().filter(|o| o["uid"] != owner_uid).cloned().collect())
            .unwrap_or_default();
        let patch = json!({"metadata": {"ownerReferences": if owners.is_empty() { serde_json::Value::Null } else { json!(owners) }}});
        self.merge_patch(&r, ns.as_deref(), &name, &patch).await
    }

    async fn remove_finalizer(&self, key: &str, m: &Meta, finalizer: &str) -> Result<(), StatusError> {
        let Some((r, ns, name)) = self.locate(key) else { return Ok(()) };
        let rest: Vec<&String> = m.finalizers.iter().filter(|f| *f != finalizer).collect();
        let patch =
            json!({"metadata": {"finalizers": if rest.is_empty() { serde_json::Value::Null } else { json!(rest) }}});
        self.merge_patch(&r, ns.as_deref(), &name, &patch).await
    }

    async fn merge_patch(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), StatusError> {
        let body = serde_json::to_vec(patch).map_err(StatusError::internal)?;
        match self.registry.patch(r, ns, name, &body, PatchType::Merge, None, &WriteOptions::default()).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(uid: &str, owners: &[&str]) -> Meta {
        Meta {
            uid: uid.into(),
            owner_references: owners.iter().map(|o| OwnerRef { uid: o.to_string() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn index_tracks_orphans() {
        let mut idx = Index::default();
        idx.upsert("cm/a/owner", &m("u1", &[]));
        idx.upsert("pods/a/dep", &m("u2", &["u1"]));
        assert!(!idx.orphaned("pods/a/dep"));
        idx.remove("cm/a/owner");
        assert!(idx.orphaned("pods/a/dep"));
        idx.remove("pods/a/dep");
        assert!(idx.dependents.is_empty());
    }
}
