//! DaemonSets run one pod on every eligible node (upstream's daemonset controller,
//! `pkg/controller/daemon`): a node is eligible when it matches the template's nodeSelector and
//! required node affinity and its NoSchedule and NoExecute taints are tolerated, counting the
//! tolerations every daemon pod gets (not-ready, unreachable, pressure, unschedulable). Pods are
//! placed by the scheduler, pinned to their node by a `metadata.name` node affinity term; failed
//! pods are replaced after a per-node backoff, surplus pods deleted. Templates are recorded as
//! ControllerRevisions; RollingUpdate replaces pods within maxUnavailable, or first starts the new
//! pod beside the old one within maxSurge; OnDelete replaces only pods deleted by hand.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::deployment::{scaled, template_hash};
use super::expectations::Expectations;
use super::history;
use super::informer::{Cache, Informer, synced};
use super::ownership::{Claim, controller_ref, pod_owners};
use super::pods::{is_available, is_ready};
use super::runtime::{self, Error, Reconciler, api_message};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::labels::selector_matches;
use crate::scheduling::{node_term_matches, tolerates};

/// `apps.DefaultDaemonSetUniqueLabelKey`: the template hash, on pods and revisions.
const HASH_LABEL: &str = "controller-revision-hash";
/// `extensions.DaemonSetTemplateGenerationKey`: the template generation a pod was made from.
const GENERATION_LABEL: &str = "pod-template-generation";
const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";
/// Upstream's `BurstReplicas` for DaemonSets.
const BURST_REPLICAS: usize = 250;
/// Upstream's failed-pod backoff: 1 s, doubled per failure on the same node, at most 15 minutes.
const FAILED_BACKOFF: Duration = Duration::from_secs(1);
const MAX_FAILED_BACKOFF: Duration = Duration::from_secs(15 * 60);

pub struct DaemonSets {
    client: Client,
    pods: Cache<Pod>,
    nodes: Cache<Node>,
    revisions: Cache<ControllerRevision>,
    expectations: Expectations,
    /// Per `<namespace>/<set>/<node>`: failed pods replaced so far and when the last one was.
    failed: Mutex<HashMap<String, (u32, Instant)>>,
    recorder: Recorder,
}

/// Starts the controller on the shared pod, node and ControllerRevision watches.
pub fn spawn(
    client: &Client,
    pods: &mut Informer<Pod>,
    nodes: &mut Informer<Node>,
    revisions: &Informer<ControllerRevision>,
    shutdown: &CancellationToken,
) {
    let controller = Controller::new(Api::<DaemonSet>::all(client.clone()), watcher::Config::default());
    let sets: Cache<DaemonSet> = controller.store();
    let (for_pods, for_nodes) = (sets.clone(), sets);
    let controller = controller
        .watches_shared_stream(pods.subscribe(), move |pod| {
            pod_owners(&for_pods, &pod, |ds: &DaemonSet| &ds.spec.selector)
        })
        // Any node change may change where daemon pods belong.
        .watches_shared_stream(nodes.subscribe(), move |_node| {
            for_nodes.state().iter().map(|ds| ObjectRef::from_obj(&**ds)).collect::<Vec<_>>()
        });
    let reconciler = DaemonSets {
        client: client.clone(),
        pods: pods.cache(),
        nodes: nodes.cache(),
        revisions: revisions.cache(),
        expectations: Expectations::default(),
        failed: Mutex::new(HashMap::new()),
        recorder: Recorder::spawn(client.clone(), "daemonset-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// `AddOrUpdateDaemonPodTolerations`: what every daemon pod tolerates, so that it keeps running
/// on a node that is not ready, unreachable, under pressure or cordoned.
fn with_daemon_tolerations(mut tolerations: Vec<Toleration>, host_network: bool) -> Vec<Toleration> {
    let mut add = |key: &str, effect: &str| {
        if !tolerations.iter().any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect)) {
            tolerations.push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Toleration::default()
            });
        }
    };
    add("node.kubernetes.io/not-ready", "NoExecute");
    add("node.kubernetes.io/unreachable", "NoExecute");
    add("node.kubernetes.io/disk-pressure", "NoSchedule");
    add("node.kubernetes.io/memory-pressure", "NoSchedule");
    add("node.kubernetes.io/pid-pressure", "NoSchedule");
    add("node.kubernetes.io/unschedulable", "NoSchedule");
    if host_network {
        add("node.kubernetes.io/network-unavailable", "NoSchedule");
    }
    tolerations
}

/// `NodeShouldRunDaemonPod`: (whether a daemon pod should start on `node`, whether one there may
/// keep running). Running on needs the node's NoSchedule and NoExecute taints tolerated; going on
/// running only the NoExecute ones.
fn should_run(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let spec = ds.spec.template.spec.clone().unwrap_or_default();
    let name = node.name_any();
    let labels = node.labels();
    let fits_name = spec.node_name.as_deref().is_none_or(|n| n.is_empty() || n == name);
    let fits_selector = spec.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    let fits_affinity =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| node_term_matches(t, labels, &name)));
    let tolerations = with_daemon_tolerations(spec.tolerations.unwrap_or_default(), spec.host_network == Some(true));
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let untolerated = |effect: &str| taints.iter().any(|t| t.effect == effect && !tolerates(&tolerations, t));
    let fits = fits_name && fits_selector && fits_affinity;
    (fits && !untolerated("NoSchedule") && !untolerated("NoExecute"), fits && !untolerated("NoExecute"))
}

/// `GetTargetNodeName`: the node a daemon pod is bound to, or pinned to by its node affinity.
fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    let required =
        spec.affinity.as_ref()?.node_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref()?;
    required.node_selector_terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|r| {
        let values = r.values.as_deref().unwrap_or_default();
        (r.key == "metadata.name" && r.operator == "In" && values.len() == 1).then(|| values[0].clone())
    })
}

/// `ReplaceDaemonSetPodNodeNameNodeAffinity`: the required node affinity becomes one term
/// selecting `node` by name (the node was checked against the template's own terms already).
fn pinned_to(affinity: Option<Affinity>, node: &str) -> Affinity {
    let mut affinity = affinity.unwrap_or_default();
    let node_affinity = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    });
    affinity
}

fn generation(ds: &DaemonSet) -> Option<&String> {
    ds.annotations().get(TEMPLATE_GENERATION)
}

/// `CreatePodTemplate` for one node: the template with the daemon tolerations, its hash and
/// generation labels, pinned to `node`.
fn new_pod(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let template = ds.spec.template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    if let Some(g) = generation(ds) {
        labels.insert(GENERATION_LABEL.into(), g.clone());
    }
    let mut spec = template.spec.unwrap_or_default();
    let host_network = spec.host_network == Some(true);
    spec.tolerations = Some(with_daemon_tolerations(spec.tolerations.take().unwrap_or_default(), host_network));
    spec.affinity = Some(pinned_to(spec.affinity.take(), node));
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(ds)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// `IsPodUpdated`: made from the current template, by hash or by generation.
fn updated(ds: &DaemonSet, pod: &Pod, hash: &str) -> bool {
    let labels = pod.labels();
    labels.get(HASH_LABEL).map(String::as_str) == Some(hash)
        || generation(ds).is_some_and(|g| labels.get(GENERATION_LABEL) == Some(g))
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// `podByCreationTimestampAndPhase`: oldest first.
fn oldest_first(pods: &mut [Arc<Pod>]) {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    pods.sort_by(|a, b| created(a).cmp(&created(b)).then_with(|| a.name_any().cmp(&b.name_any())));
}

/// A node's pod made from the current template and its pod made from an earlier one.
type NewAndOld = (Option<Arc<Pod>>, Option<Arc<Pod>>);

/// `findUpdatedPodsOnNode`: the node's (new, old) pod not being deleted; `None` when it has two
/// of either, which manage settles first.
fn new_and_old(ds: &DaemonSet, pods: &[Arc<Pod>], hash: &str) -> Option<NewAndOld> {
    let (mut new, mut old) = (None, None);
    for p in pods.iter().filter(|p| !deleting(p)) {
        let slot = if updated(ds, p, hash) { &mut new } else { &mut old };
        if slot.replace(p.clone()).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// Rolling update limits (`updatedDesiredNodeCounts`): (maxSurge, maxUnavailable) of `desired`
/// nodes, rounded up; both zero means one unavailable.
fn limits(ds: &DaemonSet, desired: usize) -> (usize, usize) {
    let rolling = ds.spec.update_strategy.as_ref().and_then(|s| s.rolling_update.clone()).unwrap_or_default();
    let total = desired as i32;
    let surge = scaled(rolling.max_surge.as_ref(), total, true).max(0) as usize;
    let unavailable = scaled(rolling.max_unavailable.as_ref(), total, true).max(0) as usize;
    if surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) }
}

/// What one sync changes: nodes to get a pod, pods to delete.
#[derive(Default)]
struct Changes {
    create: Vec<String>,
    delete: Vec<Arc<Pod>>,
    /// When a failed pod's backoff ends and the set should be looked at again.
    retry: Option<Duration>,
}

impl Reconciler for DaemonSets {
    type Object = DaemonSet;
    const NAME: &'static str = "daemonset";

    async fn synced(&self) -> bool {
        synced(&self.pods).await && synced(&self.nodes).await && synced(&self.revisions).await
    }

    async fn reconcile(&self, ds: Arc<DaemonSet>) -> Result<Action, Error> {
        let ns = ds.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", ds.name_any());
        let satisfied = self.expectations.satisfied_in(&key, &self.pods, &ns);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let selects = |labels: &BTreeMap<String, String>| selector_matches(Some(&ds.spec.selector), labels);
        let claim = Claim { owner: &*ds, adopting: ds.metadata.deletion_timestamp.is_none() };
        let candidates = self.pods.state().into_iter().filter(|p| p.namespace().as_deref() == Some(&ns));
        let pods = claim.claim(&api, candidates, |p| selects(p.labels())).await?;
        let revisions_api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let candidates = self.revisions.state().into_iter().filter(|r| r.namespace().as_deref() == Some(&ns));
        let claimed = claim.claim(&revisions_api, candidates, |r| selects(r.labels())).await?;
        let mut revisions: Vec<ControllerRevision> = claimed.iter().map(|r| (**r).clone()).collect();
        history::sort(&mut revisions);
        let mut collisions = ds.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
        let current = self.current_revision(&ds, &revisions_api, &revisions, &mut collisions).await?;
        let hash = current.labels().get(HASH_LABEL).cloned().unwrap_or_default();

        // Pods by the node they are on or meant for; finished pods already going are done with.
        let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        for p in &pods {
            if matches!(phase(p), "Succeeded" | "Failed") && deleting(p) {
                continue;
            }
            if let Some(node) = target_node(p) {
                by_node.entry(node).or_default().push(p.clone());
            }
        }
        for list in by_node.values_mut() {
            oldest_first(list);
        }
        let nodes = self.nodes.state();
        let now = Timestamp::now();
        let mut retry = None;
        let mut outcome = Ok(());
        if satisfied && ds.metadata.deletion_timestamp.is_none() {
            let mut changes = self.manage(&ds, &key, &nodes, &by_node, &hash);
            if changes.create.is_empty() && changes.delete.is_empty() {
                let strategy = ds.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
                if strategy != Some("OnDelete") {
                    changes = self.rolling_update(&ds, &nodes, &by_node, &hash, now);
                }
            }
            retry = changes.retry;
            outcome = self.sync_nodes(&ds, &key, &api, changes, &hash).await;
        }
        self.cleanup_history(&ds, &revisions_api, &revisions, &pods, &current).await?;

        let status = status(&ds, &nodes, &by_node, &hash, collisions, satisfied, now);
        if ds.status.as_ref() != Some(&status) {
            let sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), &ns);
            sets.patch_status(&ds.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
                .await?;
        }
        outcome?;
        let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
        if min_ready > 0 && status.number_ready != status.number_available.unwrap_or(0) {
            retry = Some(
                retry.map_or(Duration::from_secs(min_ready as u64), |r| r.min(Duration::from_secs(min_ready as u64))),
            );
        }
        Ok(retry.map_or_else(Action::await_change, Action::requeue))
    }
}

impl DaemonSets {
    /// `constructHistory`: the revision of the current template, made, or renumbered to be the
    /// newest when the template went back to an earlier one.
    async fn current_revision(
        &self,
        ds: &DaemonSet,
        api: &Api<ControllerRevision>,
        revisions: &[ControllerRevision],
        collisions: &mut i32,
    ) -> Result<ControllerRevision, Error> {
        let template = &ds.spec.template;
        let data = history::template_patch(template);
        let next = history::next(revisions);
        match revisions.iter().rfind(|r| r.data.0 == data) {
            Some(r) if r.revision.unwrap_or(0) + 1 == next => Ok(r.clone()),
            Some(r) => history::renumber(api, r, next).await,
            None => {
                let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
                history::create(api, collisions, |c| {
                    let hash = template_hash(template, (c != 0).then_some(c));
                    let mut labels = labels.clone();
                    labels.insert(HASH_LABEL.into(), hash.clone());
                    history::new(ds, labels, &hash, data.clone(), next)
                })
                .await
            }
        }
    }

    /// `manage` (`podsShouldBeOnNode` per node): nodes missing their pod, failed, surplus and
    /// misplaced pods.
    fn manage(
        &self,
        ds: &DaemonSet,
        key: &str,
        nodes: &[Arc<Node>],
        by_node: &HashMap<String, Vec<Arc<Pod>>>,
        hash: &str,
    ) -> Changes {
        let surge = limits(ds, 1).0 > 0;
        let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
        let mut changes = Changes::default();
        for node in nodes {
            let name = node.name_any();
            let (run, keep) = should_run(ds, node);
            let pods = by_node.get(&name).map(Vec::as_slice).unwrap_or_default();
            if run && pods.is_empty() {
                changes.create.push(name);
            } else if keep {
                let mut running = Vec::new();
                for p in pods.iter().filter(|p| !deleting(p)) {
                    match phase(p) {
                        "Failed" => match self.failed_backoff(&format!("{key}/{name}")) {
                            Some(wait) => changes.retry = Some(changes.retry.map_or(wait, |r| r.min(wait))),
                            None => {
                                self.recorder.record(
                                    EventObject::of(ds),
                                    EventType::Warning,
                                    "FailedDaemonPod",
                                    "Delete",
                                    format!(
                                        "Found failed daemon pod {}/{} on node {name}, will try to kill it",
                                        p.namespace().unwrap_or_default(),
                                        p.name_any()
                                    ),
                                );
                                changes.delete.push(p.clone());
                            }
                        },
                        "Succeeded" => {
                            self.recorder.record(
                                EventObject::of(ds),
                                EventType::Normal,
                                "SucceededDaemonPod",
                                "Delete",
                                format!(
                                    "Found succeeded daemon pod {}/{} on node {name}, will try to delete it",
                                    p.namespace().unwrap_or_default(),
                                    p.name_any()
                                ),
                            );
                            changes.delete.push(p.clone());
                        }
                        _ => running.push(p.clone()),
                    }
                }
                if !surge {
                    // One pod per node: the oldest stays.
                    changes.delete.extend(running.into_iter().skip(1));
                } else if running.len() > 1 {
                    // With surge, a new pod may stand beside an old ready one until it is available.
                    let (mut new, mut old) = (None, None);
                    for p in running {
                        let slot = if updated(ds, &p, hash) { &mut new } else { &mut old };
                        if slot.is_none() {
                            *slot = Some(p);
                        } else {
                            changes.delete.push(p);
                        }
                    }
                    if let (Some(new), Some(old)) = (new, old)
                        && (!is_ready(&old) || is_available(&new, min_ready, Timestamp::now()))
                    {
                        changes.delete.push(old);
                    }
                }
            } else {
                changes.delete.extend(pods.iter().filter(|p| !deleting(p)).cloned());
            }
        }
        // Pods meant for nodes that are gone never get scheduled; the pod GC only takes bound ones.
        for (node, pods) in by_node {
            if !nodes.iter().any(|n| n.metadata.name.as_deref() == Some(node)) {
                let unbound =
                    |p: &&Arc<Pod>| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty);
                changes.delete.extend(pods.iter().filter(unbound).filter(|p| !deleting(p)).cloned());
            }
        }
        changes
    }

    /// Whether the failed pods of a set on a node are still backing off; if not, the backoff
    /// doubles for the next failure.
    fn failed_backoff(&self, key: &str) -> Option<Duration> {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        failed.retain(|_, (_, at)| now.duration_since(*at) < 2 * MAX_FAILED_BACKOFF);
        if let Some((count, at)) = failed.get(key) {
            let wait = FAILED_BACKOFF.saturating_mul(1u32 << count.saturating_sub(1).min(20)).min(MAX_FAILED_BACKOFF);
            let since = now.duration_since(*at);
            if since < wait {
                return Some(wait - since);
            }
        }
        let entry = failed.entry(key.to_string()).or_insert((0, now));
        *entry = (entry.0 + 1, now);
        None
    }

    /// `rollingUpdate`: old pods replaced within maxUnavailable, or new ones started beside them
    /// within maxSurge and the old deleted once the new is available.
    fn rolling_update(
        &self,
        ds: &DaemonSet,
        nodes: &[Arc<Node>],
        by_node: &HashMap<String, Vec<Arc<Pod>>>,
        hash: &str,
        now: Timestamp,
    ) -> Changes {
        let eligible: HashMap<String, bool> = nodes.iter().map(|n| (n.name_any(), should_run(ds, n).0)).collect();
        let desired = eligible.values().filter(|r| **r).count();
        let (max_surge, max_unavailable) = limits(ds, desired);
        let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
        let available = |p: &Pod| is_available(p, min_ready, now);
        let mut changes = Changes::default();
        let mut nodes_in_order: Vec<&String> = by_node.keys().collect();
        nodes_in_order.sort();
        if max_surge == 0 {
            let (mut unavailable, mut replace, mut candidates) = (0, Vec::new(), Vec::new());
            for node in nodes_in_order {
                match new_and_old(ds, &by_node[node], hash) {
                    None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                    Some((Some(new), None)) => unavailable += usize::from(!available(&new)),
                    Some((None, Some(old))) if !available(&old) => {
                        unavailable += 1;
                        replace.push(old);
                    }
                    Some((None, Some(_))) if unavailable >= max_unavailable => {}
                    Some((None, Some(old))) => candidates.push(old),
                }
            }
            let room = max_unavailable.saturating_sub(unavailable).min(candidates.len());
            changes.delete = replace.into_iter().chain(candidates.into_iter().take(room)).collect();
            return changes;
        }
        let (mut surging, mut allowed, mut candidates) = (0, Vec::new(), Vec::new());
        for node in nodes_in_order {
            let Some((new, old)) = new_and_old(ds, &by_node[node], hash) else {
                surging += 1;
                continue;
            };
            match (new, old) {
                (_, None) => {}
                // Pods that should not stay on their node are the manage loop's, except an
                // unavailable old one, which is not replaced there.
                (None, Some(old)) if !available(&old) && !eligible.get(node).copied().unwrap_or(false) => {
                    changes.delete.push(old)
                }
                (None, Some(old)) if !available(&old) => allowed.push(node.clone()),
                (None, Some(_)) if surging >= max_surge => {}
                (None, Some(_)) => candidates.push(node.clone()),
                (Some(new), Some(_)) if !available(&new) => surging += 1,
                (Some(_), Some(old)) => changes.delete.push(old),
            }
        }
        let room = max_surge.saturating_sub(surging).min(candidates.len());
        changes.create = allowed.into_iter().chain(candidates.into_iter().take(room)).collect();
        changes
    }

    /// `syncNodes`: at most 250 creates and deletes, creates in slow-start batches that stop at
    /// the first failure.
    async fn sync_nodes(
        &self,
        ds: &DaemonSet,
        key: &str,
        api: &Api<Pod>,
        changes: Changes,
        hash: &str,
    ) -> Result<(), Error> {
        let object = EventObject::of(ds);
        let deletes = changes.delete;
        for p in deletes.iter().take(BURST_REPLICAS) {
            self.expectations.deleted(key, p.name_any(), p.uid().unwrap_or_default());
        }
        let params = DeleteParams::default();
        let done = join_all(
            deletes
                .iter()
                .take(BURST_REPLICAS)
                .map(|p| api.delete(p.metadata.name.as_deref().unwrap_or_default(), &params)),
        )
        .await;
        let mut failed = None;
        for (p, result) in deletes.iter().zip(done) {
            match result {
                Ok(_) => self.recorder.record(
                    object.clone(),
                    EventType::Normal,
                    "SuccessfulDelete",
                    "Delete",
                    format!("Deleted pod: {}", p.name_any()),
                ),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    self.expectations.delete_failed(key, &p.name_any(), p.uid().as_deref().unwrap_or_default());
                    self.recorder.record(
                        object.clone(),
                        EventType::Warning,
                        "FailedDelete",
                        "Delete",
                        format!("Error deleting: {}", api_message(&e)),
                    );
                    failed = Some(e);
                }
            }
        }
        let mut left: Vec<String> = changes.create.into_iter().take(BURST_REPLICAS).collect();
        let mut batch = 1;
        while !left.is_empty() {
            let made: Vec<Pod> = left.drain(..batch.min(left.len())).map(|node| new_pod(ds, &node, hash)).collect();
            let params = PostParams::default();
            let created = join_all(made.iter().map(|pod| api.create(&params, pod))).await;
            let mut stop = false;
            for result in created {
                match result {
                    Ok(pod) => {
                        self.expectations.created(key, pod.name_any());
                        self.recorder.record(
                            object.clone(),
                            EventType::Normal,
                            "SuccessfulCreate",
                            "Create",
                            format!("Created pod: {}", pod.name_any()),
                        );
                    }
                    Err(e) => {
                        self.recorder.record(
                            object.clone(),
                            EventType::Warning,
                            "FailedCreate",
                            "Create",
                            format!("Error creating: {}", api_message(&e)),
                        );
                        failed = Some(e);
                        stop = true;
                    }
                }
            }
            if stop {
                break;
            }
            batch *= 2;
        }
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// `cleanupHistory`: revisions no pod is made from, beyond `revisionHistoryLimit`, oldest first.
    async fn cleanup_history(
        &self,
        ds: &DaemonSet,
        api: &Api<ControllerRevision>,
        revisions: &[ControllerRevision],
        pods: &[Arc<Pod>],
        current: &ControllerRevision,
    ) -> Result<(), Error> {
        let live: Vec<&str> = pods.iter().filter_map(|p| p.labels().get(HASH_LABEL).map(String::as_str)).collect();
        let old: Vec<&ControllerRevision> = revisions
            .iter()
            .filter(|r| r.name_any() != current.name_any())
            .filter(|r| r.labels().get(HASH_LABEL).is_none_or(|h| !live.contains(&h.as_str())))
            .collect();
        let limit = ds.spec.revision_history_limit.unwrap_or(10).max(0) as usize;
        for r in old.iter().take(old.len().saturating_sub(limit)) {
            match api.delete(&r.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// `updateDaemonSetStatus`: counted over the oldest pod of each eligible node. The generation
/// is observed only by a sync that acted on it.
fn status(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    hash: &str,
    collisions: i32,
    synced: bool,
    now: Timestamp,
) -> DaemonSetStatus {
    let old = ds.status.clone().unwrap_or_default();
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let mut s = DaemonSetStatus {
        observed_generation: if synced { ds.metadata.generation } else { old.observed_generation },
        collision_count: Some(collisions),
        conditions: old.conditions,
        ..DaemonSetStatus::default()
    };
    let (mut available, mut updated_count) = (0, 0);
    for node in nodes {
        let (run, _) = should_run(ds, node);
        let oldest = by_node.get(&node.name_any()).and_then(|pods| pods.first());
        match (run, oldest) {
            (true, None) => s.desired_number_scheduled += 1,
            (true, Some(pod)) => {
                s.desired_number_scheduled += 1;
                s.current_number_scheduled += 1;
                if is_ready(pod) {
                    s.number_ready += 1;
                    available += i32::from(is_available(pod, min_ready, now));
                }
                updated_count += i32::from(updated(ds, pod, hash));
            }
            (false, Some(_)) => s.number_misscheduled += 1,
            (false, None) => {}
        }
    }
    s.number_available = Some(available);
    s.number_unavailable = Some(s.desired_number_scheduled - available);
    s.updated_number_scheduled = Some(updated_count);
    s
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn ds(template_spec: Value) -> DaemonSet {
        serde_json::from_value(json!({"metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid",
                "annotations": {TEMPLATE_GENERATION: "2"}},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": template_spec}}}))
        .unwrap()
    }

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
            .unwrap()
    }

    #[test]
    fn eligible_nodes_match_the_selector_and_have_their_taints_tolerated() {
        let plain = ds(json!({"containers": [{"name": "c"}], "nodeSelector": {"role": "edge"}}));
        let edge = node("a", json!({"role": "edge"}), json!([]));
        assert_eq!(should_run(&plain, &edge), (true, true));
        assert_eq!(should_run(&plain, &node("b", json!({}), json!([]))), (false, false));
        // The tolerations every daemon pod has: a cordoned or not-ready node keeps its pod.
        let cordoned = node(
            "a",
            json!({"role": "edge"}),
            json!([
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
        );
        assert_eq!(should_run(&plain, &cordoned), (true, true));
        let tainted =
            node("a", json!({"role": "edge"}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]));
        assert_eq!(should_run(&plain, &tainted), (false, true), "a NoSchedule taint lets a running pod stay");
        let evicting =
            node("a", json!({"role": "edge"}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]));
        assert_eq!(should_run(&plain, &evicting), (false, false));
        let tolerant = ds(json!({"containers": [{"name": "c"}], "nodeSelector": {"role": "edge"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}));
        assert_eq!(should_run(&tolerant, &evicting), (true, true));
        let affine = ds(
            json!({"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["edge"]}]}]}}}}),
        );
        assert_eq!(should_run(&affine, &edge), (true, true));
        assert!(!should_run(&affine, &node("b", json!({"role": "core"}), json!([]))).0);
    }

    #[test]
    fn pods_are_pinned_to_their_node_and_labelled_with_the_revision() {
        let set = ds(json!({"containers": [{"name": "c"}], "hostNetwork": true,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["edge"]}]}]}}}}));
        let pod = new_pod(&set, "n1", "abc");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
        assert_eq!(pod.labels()[HASH_LABEL], "abc");
        assert_eq!(pod.labels()[GENERATION_LABEL], "2");
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        let terms = &pod
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1, "the template's terms are replaced by the node's name");
        let tolerations = pod.spec.as_ref().unwrap().tolerations.clone().unwrap();
        assert_eq!(tolerations.len(), 7, "six daemon tolerations and network-unavailable for host networking");
        assert!(updated(&set, &pod, "abc"));
        assert!(updated(&set, &pod, "other"), "the same template generation");
    }

    #[test]
    fn rolling_limits_round_up_and_never_stall() {
        let with = |ru: Value| -> DaemonSet {
            let mut set = ds(json!({"containers": [{"name": "c"}]}));
            set.spec.update_strategy =
                serde_json::from_value(json!({"type": "RollingUpdate", "rollingUpdate": ru})).unwrap();
            set
        };
        assert_eq!(limits(&with(json!({"maxUnavailable": "25%", "maxSurge": 0})), 10), (0, 3));
        assert_eq!(limits(&with(json!({"maxUnavailable": 0, "maxSurge": "10%"})), 10), (1, 0));
        assert_eq!(limits(&with(json!({"maxUnavailable": 0, "maxSurge": 0})), 10), (0, 1));
    }
}
