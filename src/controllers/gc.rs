//! Garbage collection by `ownerReferences`, the `orphan` and `foregroundDeletion` finalizers, and
//! removal of pods bound to a node that was deleted (upstream's garbage collector and PodGC).
//!
//! Like upstream's, the collector is a graph over every kind rather than a per-kind reconciler: it
//! watches the metadata of every resource discovery lists (events excepted, as upstream's
//! `DefaultIgnoredResources`) and keeps a small index: object uid → key, and owner uid → dependent
//! keys. Only objects with owners (or that are owners) cost more than their uid. The watches of
//! different kinds are not ordered with each other, so an owner is taken for gone only once a live
//! read says so (upstream's `isDangling`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, PartialObjectMeta, Patch,
    PatchParams,
};
use kube::discovery::{Discovery, verbs};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Resources the collector does not follow (upstream's `DefaultIgnoredResources`).
const IGNORED: &[(&str, &str)] = &[("", "events"), ("events.k8s.io", "events")];

/// An object: its resource (an index into the collector's list), namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    resource: usize,
    namespace: Option<String>,
    name: String,
}

#[derive(Default)]
struct Index {
    /// uid → key of every live object.
    uids: HashMap<String, Key>,
    /// owner uid → keys of its dependents.
    dependents: HashMap<String, BTreeSet<Key>>,
    /// key → owner references, for objects that have owners.
    owners: HashMap<Key, Vec<OwnerReference>>,
    /// key → uid, to unindex by key.
    keys: HashMap<Key, String>,
}

impl Index {
    fn upsert(&mut self, key: &Key, uid: &str, owners: &[OwnerReference]) {
        self.remove(key);
        self.uids.insert(uid.to_string(), key.clone());
        self.keys.insert(key.clone(), uid.to_string());
        if !owners.is_empty() {
            for o in owners {
                self.dependents.entry(o.uid.clone()).or_default().insert(key.clone());
            }
            self.owners.insert(key.clone(), owners.to_vec());
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some(owners) = self.owners.remove(key) {
            for o in owners {
                if let Some(set) = self.dependents.get_mut(&o.uid) {
                    set.remove(key);
                    if set.is_empty() {
                        self.dependents.remove(&o.uid);
                    }
                }
            }
        }
        if let Some(uid) = self.keys.remove(key) {
            self.uids.remove(&uid);
        }
    }

    /// Whether no owner of `key` is known to exist (a candidate for deletion).
    fn orphaned(&self, key: &Key) -> bool {
        self.owners.get(key).is_some_and(|owners| owners.iter().all(|o| !self.uids.contains_key(&o.uid)))
    }

    fn dependents_of(&self, uid: &str) -> Vec<Key> {
        self.dependents.get(uid).into_iter().flatten().cloned().collect()
    }
}

struct Collector {
    client: Client,
    resources: Vec<ApiResource>,
    index: Index,
}

/// Runs the collector until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let resources = loop {
        match followed_resources(&client).await {
            Ok(r) => break r,
            Err(e) => tracing::warn!("garbage collector: discovery failed: {e}; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let streams = resources.iter().enumerate().map(|(i, ar)| {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), ar);
        watcher(api, watcher::Config::default()).default_backoff().map(move |e| (i, e)).boxed()
    });
    let mut events = futures::stream::select_all(streams);
    let mut c = Collector { client, resources, index: Index::default() };
    // Until every kind is listed an owner may just not be indexed yet: act only afterwards.
    let mut unlisted: BTreeSet<usize> = (0..c.resources.len()).collect();
    let mut relisted: HashMap<usize, Vec<Key>> = HashMap::new();
    // Terminating objects seen before that, whose finalizers are worked once everything is listed.
    let mut terminating: Vec<(Key, ObjectMeta)> = Vec::new();
    loop {
        let (i, event) = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = events.next() => match next { Some(e) => e, None => return },
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("garbage collector: watch of {}: {e}", c.resources[i].plural);
                continue;
            }
        };
        match event {
            Event::Init => {
                relisted.insert(i, Vec::new());
            }
            Event::InitApply(obj) => {
                let key = c.key(i, &obj.metadata);
                c.index.upsert(&key, obj.metadata.uid.as_deref().unwrap_or_default(), owners(&obj.metadata));
                relisted.entry(i).or_default().push(key.clone());
                if unlisted.is_empty() {
                    c.on_changed(&key, &obj.metadata).await;
                } else if obj.metadata.deletion_timestamp.is_some() {
                    terminating.push((key, obj.metadata));
                }
            }
            Event::InitDone => {
                let seen: BTreeSet<Key> = relisted.remove(&i).unwrap_or_default().into_iter().collect();
                let stale: Vec<(Key, String)> = c
                    .index
                    .keys
                    .iter()
                    .filter(|(k, _)| k.resource == i && !seen.contains(*k))
                    .map(|(k, u)| (k.clone(), u.clone()))
                    .collect();
                for (key, uid) in stale {
                    c.index.remove(&key);
                    c.on_deleted(&key, &uid, &[]).await;
                }
                if unlisted.remove(&i) && unlisted.is_empty() {
                    tracing::debug!("garbage collector: every kind listed; collecting");
                    c.sweep(std::mem::take(&mut terminating)).await;
                }
            }
            Event::Apply(obj) => {
                let key = c.key(i, &obj.metadata);
                c.index.upsert(&key, obj.metadata.uid.as_deref().unwrap_or_default(), owners(&obj.metadata));
                if unlisted.is_empty() {
                    c.on_changed(&key, &obj.metadata).await;
                } else if obj.metadata.deletion_timestamp.is_some() {
                    terminating.push((key, obj.metadata));
                }
            }
            Event::Delete(obj) => {
                let key = c.key(i, &obj.metadata);
                c.index.remove(&key);
                if unlisted.is_empty() {
                    c.on_deleted(&key, obj.metadata.uid.as_deref().unwrap_or_default(), owners(&obj.metadata)).await;
                }
            }
        }
    }
}

/// The resources that can be listed, watched and deleted, one per kind (the preferred version).
async fn followed_resources(client: &Client) -> Result<Vec<ApiResource>, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            let ignored = IGNORED.iter().any(|(g, r)| ar.group == *g && ar.plural == *r);
            let ops = [verbs::LIST, verbs::WATCH, verbs::DELETE];
            if !ignored && ops.iter().all(|v| caps.supports_operation(v)) {
                out.push(ar);
            }
        }
    }
    Ok(out)
}

/// An `Api` for one object's scope: its namespace, or the cluster.
fn scoped<K>(client: &Client, ar: &ApiResource, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

fn owners(meta: &ObjectMeta) -> &[OwnerReference] {
    meta.owner_references.as_deref().unwrap_or_default()
}

impl Collector {
    fn key(&self, resource: usize, meta: &ObjectMeta) -> Key {
        Key { resource, namespace: meta.namespace.clone(), name: meta.name.clone().unwrap_or_default() }
    }

    fn api(&self, key: &Key) -> Api<DynamicObject> {
        scoped(&self.client, &self.resources[key.resource], key.namespace.as_deref())
    }

    /// Once everything is listed: collect every orphan and work every terminating owner's finalizer.
    async fn sweep(&self, terminating: Vec<(Key, ObjectMeta)>) {
        let orphans: Vec<Key> = self.index.owners.keys().filter(|k| self.index.orphaned(k)).cloned().collect();
        for key in orphans {
            self.collect_orphan(&key).await;
        }
        for (key, meta) in terminating {
            self.finalize(&key, &meta).await;
        }
    }

    async fn on_changed(&self, key: &Key, meta: &ObjectMeta) {
        if self.index.orphaned(key) {
            self.collect_orphan(key).await;
        } else {
            self.finalize(key, meta).await;
        }
    }

    async fn on_deleted(&self, key: &Key, uid: &str, owner_refs: &[OwnerReference]) {
        // Dependents whose last owner this was go too.
        for d in self.index.dependents_of(uid) {
            if self.index.orphaned(&d) {
                self.collect_orphan(&d).await;
            }
        }
        // An owner waiting in foreground deletion may now be free to go.
        for owner in owner_refs {
            if let Some(owner_key) = self.index.uids.get(&owner.uid).cloned()
                && let Some(meta) = self.read_meta(&owner_key).await
            {
                self.finalize(&owner_key, &meta).await;
            }
        }
        // Pods bound to a deleted node are removed at once (PodGC).
        let ar = &self.resources[key.resource];
        if ar.group.is_empty() && ar.plural == "nodes" {
            self.delete_pods_of(&key.name).await;
        }
    }

    /// Deletes `key` if none of its owners exists: those not in the index are read live, so a
    /// dependent seen before its owner's own watch caught up is left alone.
    async fn collect_orphan(&self, key: &Key) {
        let Some(refs) = self.index.owners.get(key) else { return };
        for r in refs {
            match self.owner_exists(key.namespace.as_deref(), r).await {
                Ok(false) => {}
                Ok(true) => return,
                Err(e) => {
                    tracing::debug!("garbage collector: looking up owner {} {}: {e}", r.kind, r.name);
                    return;
                }
            }
        }
        self.delete(key, &DeleteParams::default()).await;
    }

    /// Whether the owner a reference names exists with that uid (an owner of an unserved kind
    /// counts as existing: nothing is deleted on ignorance).
    async fn owner_exists(&self, namespace: Option<&str>, r: &OwnerReference) -> Result<bool, kube::Error> {
        let (group, version) = match r.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", r.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &r.kind);
        let Some(ar) = self.resources.iter().find(|a| a.group == gvk.group && a.kind == gvk.kind) else {
            return Ok(true);
        };
        let api: Api<PartialObjectMeta<DynamicObject>> = scoped(&self.client, ar, namespace);
        Ok(api.get_opt(&r.name).await?.is_some_and(|o| o.metadata.uid.as_deref() == Some(r.uid.as_str())))
    }

    async fn read_meta(&self, key: &Key) -> Option<ObjectMeta> {
        let api: Api<PartialObjectMeta<DynamicObject>> =
            scoped(&self.client, &self.resources[key.resource], key.namespace.as_deref());
        api.get_opt(&key.name).await.ok().flatten().map(|o| o.metadata)
    }

    async fn delete(&self, key: &Key, params: &DeleteParams) {
        match self.api(key).delete(&key.name, params).await {
            Ok(_) => tracing::debug!("garbage collector deleted {} {}", self.resources[key.resource].kind, key.name),
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
            Err(e) => {
                tracing::warn!("garbage collector: deleting {} {}: {e}", self.resources[key.resource].kind, key.name)
            }
        }
    }

    async fn delete_pods_of(&self, node: &str) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let bound = match pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await {
            Ok(list) => list.items,
            Err(e) => return tracing::warn!("garbage collector: listing the pods of deleted node {node}: {e}"),
        };
        for pod in bound {
            let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else { continue };
            match Api::<Pod>::namespaced(self.client.clone(), &ns)
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => tracing::info!("deleted pod {ns}/{name}: its node {node} is gone"),
                Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                Err(e) => tracing::warn!("garbage collector: deleting pod {ns}/{name} of gone node {node}: {e}"),
            }
        }
    }

    /// Works the `orphan` and `foregroundDeletion` finalizers of a terminating owner.
    async fn finalize(&self, key: &Key, meta: &ObjectMeta) {
        if meta.deletion_timestamp.is_none() {
            return;
        }
        let finalizers = meta.finalizers.as_deref().unwrap_or_default();
        let uid = meta.uid.as_deref().unwrap_or_default();
        let deps = self.index.dependents_of(uid);
        if finalizers.iter().any(|f| f == "orphan") {
            for d in &deps {
                self.drop_owner(d, uid).await;
            }
            self.remove_finalizer(key, meta, "orphan").await;
        } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
            if deps.is_empty() {
                self.remove_finalizer(key, meta, "foregroundDeletion").await;
            } else {
                for d in &deps {
                    self.delete(d, &DeleteParams::default()).await;
                }
            }
        }
    }

    async fn drop_owner(&self, key: &Key, owner_uid: &str) {
        let Some(meta) = self.read_meta(key).await else { return };
        let rest: Vec<&OwnerReference> = owners(&meta).iter().filter(|o| o.uid != owner_uid).collect();
        let owners = if rest.is_empty() { Value::Null } else { json!(rest) };
        self.merge_patch(key, &meta, json!({"ownerReferences": owners})).await;
    }

    async fn remove_finalizer(&self, key: &Key, meta: &ObjectMeta, finalizer: &str) {
        let rest: Vec<&String> = meta.finalizers.iter().flatten().filter(|f| *f != finalizer).collect();
        let finalizers = if rest.is_empty() { Value::Null } else { json!(rest) };
        self.merge_patch(key, meta, json!({"finalizers": finalizers})).await;
    }

    /// A merge patch of `metadata` made on the version `meta` was read at: if the object changed
    /// meanwhile it is left alone, and its next event brings it back here.
    async fn merge_patch(&self, key: &Key, meta: &ObjectMeta, mut patch: Value) {
        patch["resourceVersion"] = json!(meta.resource_version);
        let body = json!({"metadata": patch});
        match self.api(key).patch(&key.name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
            Err(e) => {
                tracing::warn!("garbage collector: updating {} {}: {e}", self.resources[key.resource].kind, key.name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Key { resource: 0, namespace: Some("a".into()), name: name.into() }
    }

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "o".into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn index_tracks_orphans() {
        let mut idx = Index::default();
        idx.upsert(&key("owner"), "u1", &[]);
        idx.upsert(&key("dep"), "u2", &[owner("u1")]);
        assert!(!idx.orphaned(&key("dep")));
        assert_eq!(idx.dependents_of("u1"), vec![key("dep")]);
        idx.remove(&key("owner"));
        assert!(idx.orphaned(&key("dep")));
        idx.remove(&key("dep"));
        assert!(idx.dependents.is_empty());
        assert!(idx.uids.is_empty() && idx.keys.is_empty() && idx.owners.is_empty());
    }

    /// Polls `check` until it holds, for at most 10 s.
    async fn eventually<F: AsyncFn() -> bool>(what: &str, check: F) {
        for _ in 0..200 {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what} never happened");
    }

    #[tokio::test]
    async fn owners_gone_take_their_dependents_and_finalizers_are_worked() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let (_dir, _registry, client) = crate::client::for_tests().await;
        let shutdown = CancellationToken::new();
        tokio::spawn(run(client.clone(), shutdown.clone()));
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let make = async |name: &str, owner: Option<&ConfigMap>| {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name.into());
            if let Some(o) = owner {
                cm.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: o.metadata.name.clone().unwrap(),
                    uid: o.metadata.uid.clone().unwrap(),
                    ..Default::default()
                }]);
            }
            cms.create(&Default::default(), &cm).await.unwrap()
        };
        let gone = async |name: &str| cms.get_opt(name).await.unwrap().is_none();

        // Background: the dependent follows its owner.
        let owner = make("owner", None).await;
        make("dep", Some(&owner)).await;
        cms.delete("owner", &DeleteParams::default()).await.unwrap();
        eventually("the dependent's deletion", async || gone("dep").await).await;

        // A dependent whose owner never existed goes too; one whose owner exists stays.
        let mut ghost = owner.clone();
        ghost.metadata.uid = Some("no-such-uid".into());
        make("stray", Some(&ghost)).await;
        let kept_owner = make("kept-owner", None).await;
        make("kept", Some(&kept_owner)).await;
        eventually("the stray's deletion", async || gone("stray").await).await;
        assert!(!gone("kept").await, "a dependent of a live owner was deleted");

        // Orphan: the dependent stays, without the owner reference.
        cms.delete("kept-owner", &DeleteParams::orphan()).await.unwrap();
        eventually("the orphaned owner's deletion", async || gone("kept-owner").await).await;
        let kept = cms.get("kept").await.unwrap();
        assert_eq!(kept.metadata.owner_references, None);

        // Foreground: the owner waits for its dependents, then goes.
        let owner = make("fg-owner", None).await;
        make("fg-dep", Some(&owner)).await;
        cms.delete("fg-owner", &DeleteParams::foreground()).await.unwrap();
        eventually("the foreground deletion", async || gone("fg-owner").await && gone("fg-dep").await).await;
        shutdown.cancel();
    }
}
