//! VolumeBinding (upstream's plugin of that name): a pod's claims must exist and not be going; bound
//! claims' volumes must admit the node (their node affinity); an `Immediate` claim must be bound
//! before the pod is placed; a `WaitForFirstConsumer` claim needs a free volume that fits on the node,
//! or a class that can provision there. PreBind binds the chosen static volumes, marks the claims to
//! provision with the chosen node (`volume.kubernetes.io/selected-node`), and waits until every claim
//! is bound (`bindTimeoutSeconds`, 600 by default).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;

use crate::registry::kinds::storage::{
    BIND_COMPLETED, BOUND_BY_CONTROLLER, SELECTED_NODE, claim_reference, storage_bytes,
};
use crate::scheduler::framework::{ClusterEvent, CycleState, Plugin, Point, PreFilterResult, Status};
use crate::scheduler::types::{NodeFacts, NodeInfo, PodInfo, label_selector_matches, node_term_matches};

pub const NAME: &str = "VolumeBinding";
const STATE: &str = "VolumeBinding/claims";
const DECISIONS: &str = "VolumeBinding/decisions";
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

pub const ERR_NODE_CONFLICT: &str = "node(s) didn't match PersistentVolume's node affinity";
pub const ERR_BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const ERR_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";

/// `VolumeBindingArgs`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Args {
    bind_timeout_seconds: Option<i64>,
}

/// The storage objects the scheduler follows (claims, volumes, classes, nodes' CSI drivers and
/// attachments), and a signal of the claims' changes.
#[derive(Clone)]
pub struct Storage {
    pub claims: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    pub csi_nodes: Store<CSINode>,
    pub attachments: Store<VolumeAttachment>,
    pub claims_changed: tokio::sync::watch::Receiver<u64>,
}

pub struct VolumeBinding {
    storage: Storage,
    client: kube::Client,
    bind_timeout: Duration,
}

/// PreFilter's findings.
struct Claims {
    bound: Vec<Arc<PersistentVolume>>,
    /// Unbound `WaitForFirstConsumer` claims, with their classes.
    delayed: Vec<(Arc<PersistentVolumeClaim>, Option<Arc<StorageClass>>)>,
    /// Filter's decision for each node that passed, for Reserve to take.
    decided: Mutex<HashMap<String, Arc<Decisions>>>,
}

/// Reserve's decisions for the chosen node.
#[derive(Default)]
struct Decisions {
    /// Static volume → the claim it is bound to.
    static_binds: Vec<(String, Arc<PersistentVolumeClaim>)>,
    provision: Vec<Arc<PersistentVolumeClaim>>,
}

fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty())
        && pvc.annotations().contains_key(BIND_COMPLETED)
}

/// Whether a volume's required node affinity admits the node.
fn affinity_admits(pv: &PersistentVolume, node: &NodeFacts) -> bool {
    let Some(required) = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    required.node_selector_terms.iter().any(|t| node_term_matches(t, node))
}

impl VolumeBinding {
    pub fn new(args: Args, storage: Storage, client: kube::Client) -> Result<Self, String> {
        let secs = args.bind_timeout_seconds.unwrap_or(600);
        if secs < 0 {
            return Err(format!(
                "bindTimeoutSeconds: Invalid value: {secs}: invalid BindTimeoutSeconds, should not be a negative value"
            ));
        }
        Ok(VolumeBinding { storage, client, bind_timeout: Duration::from_secs(secs as u64) })
    }

    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.storage.classes.get(&ObjectRef::new(name))
    }

    /// `FindMatchingVolume` on a node: the smallest free volume of the claim's class that fits.
    fn matching_volume(
        &self,
        pvc: &PersistentVolumeClaim,
        node: &NodeFacts,
        taken: &[String],
    ) -> Option<Arc<PersistentVolume>> {
        let cs = pvc.spec.clone().unwrap_or_default();
        let want = storage_bytes(cs.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap_or(0);
        let modes = cs.access_modes.clone().unwrap_or_default();
        let none = BTreeMap::new();
        let mut best: Option<(i128, Arc<PersistentVolume>)> = None;
        for pv in self.storage.volumes.state() {
            let vs = pv.spec.clone().unwrap_or_default();
            if vs.claim_ref.is_some()
                || pv.metadata.deletion_timestamp.is_some()
                || pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Available")
                || taken.contains(&pv.name_any())
            {
                continue;
            }
            let size = storage_bytes(vs.capacity.as_ref()).unwrap_or(0);
            let fits = size >= want
                && vs.storage_class_name.clone().unwrap_or_default()
                    == cs.storage_class_name.clone().unwrap_or_default()
                && vs.volume_mode.as_deref().unwrap_or("Filesystem")
                    == cs.volume_mode.as_deref().unwrap_or("Filesystem")
                && modes.iter().all(|m| vs.access_modes.iter().flatten().any(|h| h == m))
                && (cs.selector.is_none()
                    || label_selector_matches(cs.selector.as_ref(), pv.metadata.labels.as_ref().unwrap_or(&none)))
                && affinity_admits(&pv, node);
            if fits && best.as_ref().is_none_or(|(s, _)| size < *s) {
                best = Some((size, pv));
            }
        }
        best.map(|(_, pv)| pv)
    }

    /// Whether the class can provision a volume for the claim on the node.
    fn provisionable(class: Option<&StorageClass>, node: &NodeFacts) -> bool {
        let Some(class) = class else { return false };
        if class.provisioner.is_empty() || class.provisioner == NO_PROVISIONER {
            return false;
        }
        let terms = class.allowed_topologies.clone().unwrap_or_default();
        terms.is_empty()
            || terms.iter().any(|t| {
                t.match_label_expressions
                    .iter()
                    .flatten()
                    .all(|e| node.labels.get(&e.key).is_some_and(|v| e.values.contains(v)))
            })
    }

    /// Bound volumes and provisioned claims for the node, as Reserve decides them.
    fn decide(&self, claims: &Claims, node: &NodeFacts) -> Result<Decisions, Status> {
        let mut d = Decisions::default();
        let mut taken = Vec::new();
        for (pvc, class) in &claims.delayed {
            if let Some(selected) = pvc.annotations().get(SELECTED_NODE)
                && *selected != node.name
            {
                return Err(Status::unresolvable(ERR_BIND_CONFLICT));
            }
            if let Some(pv) = self.matching_volume(pvc, node, &taken) {
                taken.push(pv.name_any());
                d.static_binds.push((pv.name_any(), pvc.clone()));
            } else if Self::provisionable(class.as_deref(), node) {
                d.provision.push(pvc.clone());
            } else {
                return Err(Status::unresolvable(ERR_BIND_CONFLICT));
            }
        }
        Ok(d)
    }

    /// Whether every claim of the pod is bound; an error when provisioning gave up on the node.
    /// Whether every claim of the pod is bound; an error when provisioning gave up on the node (the
    /// selected node, once the cache showed it, was removed or changed). `seen` are the claims whose
    /// selected node the cache has shown: PreBind's own write may not have reached it yet.
    fn all_bound(&self, pod: &PodInfo, node: &str, seen: &mut HashSet<String>) -> Result<bool, String> {
        let mut done = true;
        for c in &pod.claims {
            let Some(pvc) = self.storage.claims.get(&ObjectRef::new(&c.name).within(&pod.namespace)) else {
                return Err(format!("persistentvolumeclaim \"{}\" not found", c.name));
            };
            if is_bound(&pvc) {
                continue;
            }
            done = false;
            match pvc.annotations().get(SELECTED_NODE) {
                Some(n) if n == node => {
                    seen.insert(c.name.clone());
                }
                None if seen.contains(&c.name) => return Err(format!("provisioning failed for PVC \"{}\"", c.name)),
                None => {}
                Some(_) => return Err(format!("selectedNode annotation reset for PVC \"{}\"", c.name)),
            }
        }
        Ok(done)
    }
}

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter, Point::Reserve, Point::PreBind]
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, _nodes: &[Arc<NodeInfo>]) -> (Status, PreFilterResult) {
        if pod.claims.is_empty() {
            return (Status::skip(), None);
        }
        let mut claims = Claims { bound: Vec::new(), delayed: Vec::new(), decided: Mutex::default() };
        let mut immediate = false;
        for c in &pod.claims {
            let Some(pvc) = self.storage.claims.get(&ObjectRef::new(&c.name).within(&pod.namespace)) else {
                let msg = if c.ephemeral {
                    format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{}\"",
                        c.name
                    )
                } else {
                    format!("persistentvolumeclaim \"{}\" not found", c.name)
                };
                return (Status::unresolvable(msg), None);
            };
            if c.ephemeral && !pvc.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == pod.uid) {
                let msg = format!(
                    "PVC {}/{} was not created for pod {}/{} (pod is not owner)",
                    pod.namespace, c.name, pod.namespace, pod.name
                );
                return (Status::unresolvable(msg), None);
            }
            if pvc.metadata.deletion_timestamp.is_some() {
                return (Status::unresolvable(format!("persistentvolumeclaim \"{}\" is being deleted", c.name)), None);
            }
            if is_bound(&pvc) {
                let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
                let Some(pv) = self.storage.volumes.get(&ObjectRef::new(&pv_name)) else {
                    let msg = format!(
                        "persistentvolumeclaim \"{}\" bound to non-existent persistentvolume \"{pv_name}\"",
                        c.name
                    );
                    return (Status::unresolvable(msg), None);
                };
                claims.bound.push(pv);
                continue;
            }
            let class = self.class(&pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default());
            if class.as_ref().is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")) {
                claims.delayed.push((pvc, class));
            } else {
                immediate = true;
            }
        }
        if immediate {
            return (Status::unresolvable(ERR_UNBOUND_IMMEDIATE), None);
        }
        state.write(STATE, Arc::new(claims));
        (Status::success(), None)
    }

    fn filter(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(claims) = state.read::<Arc<Claims>>(STATE) else { return Status::success() };
        if !claims.bound.iter().all(|pv| affinity_admits(pv, &node.node)) {
            return Status::unresolvable(ERR_NODE_CONFLICT);
        }
        match self.decide(claims, &node.node) {
            Ok(d) => {
                if !claims.delayed.is_empty() {
                    claims
                        .decided
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(node.node.name.clone(), Arc::new(d));
                }
                Status::success()
            }
            Err(s) => s,
        }
    }

    fn reserve(&self, state: &mut CycleState, _pod: &PodInfo, node: &str) -> Status {
        let Some(claims) = state.read::<Arc<Claims>>(STATE).cloned() else { return Status::success() };
        if let Some(d) = claims.decided.lock().unwrap_or_else(|e| e.into_inner()).remove(node) {
            state.write(DECISIONS, d);
        }
        Status::success()
    }

    fn pre_bind<'a>(&'a self, state: &'a CycleState, pod: &'a PodInfo, node: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let Some(d) = state.read::<Arc<Decisions>>(DECISIONS).cloned() else { return Status::success() };
            if let Err(e) = self.bind_volumes(&d, node).await {
                return Status::error(format!("binding volumes: {e}"));
            }
            let mut changed = self.storage.claims_changed.clone();
            let deadline = tokio::time::Instant::now() + self.bind_timeout;
            let mut seen = HashSet::new();
            loop {
                match self.all_bound(pod, node, &mut seen) {
                    Ok(true) => return Status::success(),
                    Ok(false) => {}
                    Err(e) => return Status::error(format!("binding volumes: {e}")),
                }
                match tokio::time::timeout_at(deadline, changed.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Status::error("binding volumes: the claims are no longer followed"),
                    Err(_) => return Status::error("binding volumes: context deadline exceeded"),
                }
            }
        })
    }

    fn requeue(&self, _pod: &PodInfo, event: &ClusterEvent) -> bool {
        matches!(event, ClusterEvent::StorageChanged | ClusterEvent::NodeAdded(_) | ClusterEvent::NodeChanged(_))
    }
}

impl VolumeBinding {
    /// PreBind's writes: each static volume's claimRef, each provisioned claim's selected node.
    async fn bind_volumes(&self, d: &Decisions, node: &str) -> Result<(), kube::Error> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        for (pv_name, pvc) in &d.static_binds {
            let mut pv = volumes.get(pv_name).await?;
            pv.annotations_mut().insert(BOUND_BY_CONTROLLER.into(), "yes".into());
            pv.spec.get_or_insert_with(Default::default).claim_ref = Some(claim_reference(pvc));
            volumes.replace(pv_name, &PostParams::default(), &pv).await?;
        }
        for pvc in &d.provision {
            if pvc.annotations().get(SELECTED_NODE).map(String::as_str) == Some(node) {
                continue;
            }
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default());
            let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
            claims.patch(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(())
    }
}
