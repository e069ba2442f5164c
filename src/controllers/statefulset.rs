//! StatefulSets run pods of stable identity (upstream's statefulset controller,
//! `pkg/controller/statefulset`): pod `<set>-<ordinal>` with hostname and subdomain to match, one
//! claim per ordinal and volume claim template (`<template>-<set>-<ordinal>`), kept across pod
//! deletions. OrderedReady creates pods in ordinal order, each once its predecessors are Running,
//! Ready and available, and removes them from the highest down, one at a time; Parallel does all
//! at once. Templates are recorded as ControllerRevisions; RollingUpdate replaces the pods at or
//! above `partition` from the highest ordinal down, at most `maxUnavailable` at a time, OnDelete
//! only pods deleted by hand. `persistentVolumeClaimRetentionPolicy` says, through owner
//! references the garbage collector follows, whether claims go with the set or with scaled-down pods.
//!
//! No expectations are needed: pods have fixed names, so a cache that lags a create shows as
//! `AlreadyExists` and the next sync waits for the cache.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::history;
use super::informer::{Cache, Informer, synced};
use super::ownership::{Claim, controller_ref, pod_owners};
use super::pods::{is_available, is_ready};
use super::runtime::{self, Error, Reconciler, api_message};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::labels::selector_matches;

/// `apps.StatefulSetPodNameLabel`: each pod's own name, for a Service selecting one pod.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// `apps.PodIndexLabel`: the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// `apps.StatefulSetRevisionLabel`: the ControllerRevision a pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// Upstream's `MaxBatchSize`: the most pods created or deleted at once in Parallel mode.
const MAX_BATCH: usize = 500;
/// How often a pod waiting for a stale claim to go looks again.
const STALE_CLAIM_RECHECK: Duration = Duration::from_secs(5);

pub struct StatefulSets {
    client: Client,
    pods: Cache<Pod>,
    revisions: Cache<ControllerRevision>,
    claims: Cache<PersistentVolumeClaim>,
    recorder: Recorder,
}

/// Starts the controller on the shared pod, ControllerRevision and claim watches.
pub fn spawn(
    client: &Client,
    pods: &mut Informer<Pod>,
    revisions: &Informer<ControllerRevision>,
    claims: &Informer<PersistentVolumeClaim>,
    shutdown: &CancellationToken,
) {
    let controller = Controller::new(Api::<StatefulSet>::all(client.clone()), watcher::Config::default());
    let sets: Cache<StatefulSet> = controller.store();
    let controller = controller.watches_shared_stream(pods.subscribe(), move |pod| {
        pod_owners(&sets, &pod, |s: &StatefulSet| &s.spec.selector)
    });
    let reconciler = StatefulSets {
        client: client.clone(),
        pods: pods.cache(),
        revisions: revisions.cache(),
        claims: claims.cache(),
        recorder: Recorder::spawn(client.clone(), "statefulset-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// `getParentNameAndOrdinal`: `web-2` is ordinal 2 of set `web`.
fn parent_and_ordinal(name: &str) -> Option<(&str, usize)> {
    let (parent, ordinal) = name.rsplit_once('-')?;
    if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ordinal.parse::<i32>().ok()?.try_into().ok()?))
}

fn ordinal(pod: &Pod) -> Option<usize> {
    parent_and_ordinal(pod.metadata.name.as_deref()?).map(|(_, o)| o)
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// `isRunningAndReady`.
fn running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod)
}

/// `isRunningAndAvailable`.
fn running_and_available(pod: &Pod, min_ready: i32, now: Timestamp) -> bool {
    phase(pod) == "Running" && is_available(pod, min_ready, now)
}

/// `isUnavailable`: missing, being deleted, or not yet available.
fn unavailable(pod: Option<&Arc<Pod>>, min_ready: i32, now: Timestamp) -> bool {
    pod.is_none_or(|p| terminating(p) || !running_and_available(p, min_ready, now))
}

fn revision_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(REVISION_LABEL).map(String::as_str)
}

/// The retention policy as (whenDeleted is Delete, whenScaled is Delete).
fn deletes_claims(spec: &StatefulSetSpec) -> (bool, bool) {
    let policy = spec.persistent_volume_claim_retention_policy.clone().unwrap_or_default();
    (policy.when_deleted.as_deref() == Some("Delete"), policy.when_scaled.as_deref() == Some("Delete"))
}

/// The claims of ordinal `ord` (`getPersistentVolumeClaims`): one per template, labelled with the
/// set's selector.
fn claims_for(set: &StatefulSet, ord: usize) -> Vec<PersistentVolumeClaim> {
    let spec = set.spec.clone();
    let name = set.name_any();
    spec.volume_claim_templates
        .into_iter()
        .flatten()
        .map(|mut claim| {
            let template = claim.name_any();
            claim.metadata.name = Some(format!("{template}-{name}-{ord}"));
            claim.metadata.namespace = set.namespace();
            let labels = claim.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(spec.selector.match_labels.clone().unwrap_or_default());
            claim.status = None;
            claim
        })
        .collect()
}

/// `newStatefulSetPod`: pod `ord` of the set from `template`, made from revision `revision`.
fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, ord: usize, revision: &str) -> Pod {
    let spec = set.spec.clone();
    let name = format!("{}-{ord}", set.name_any());
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ord.to_string());
    labels.insert(REVISION_LABEL.into(), revision.into());
    let mut pod_spec = template.spec.clone().unwrap_or_default();
    pod_spec.hostname = Some(name.clone());
    pod_spec.subdomain = spec.service_name.clone().filter(|s| !s.is_empty());
    // The claims' volumes replace any template volume of the same name (`updateStorage`).
    let templates: Vec<String> = spec.volume_claim_templates.iter().flatten().map(|c| c.name_any()).collect();
    let mut volumes: Vec<Volume> = templates
        .iter()
        .zip(claims_for(set, ord))
        .map(|(template, claim)| Volume {
            name: template.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.name_any(),
                read_only: None,
            }),
            ..Volume::default()
        })
        .collect();
    volumes.extend(pod_spec.volumes.take().into_iter().flatten().filter(|v| !templates.contains(&v.name)));
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(set)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The owner references a claim of `pod` should have under the retention policy
/// (`updateClaimOwnerRefForSetAndPod`): the set's when claims go with the set, the pod's when it
/// is scaled down and claims go with scaled-down pods. `None` when the claim is left alone: it
/// already has another controller, or refers to an earlier set or pod of the same name.
fn claim_owners(
    set: &StatefulSet,
    pod: &Pod,
    condemned: bool,
    claim: &PersistentVolumeClaim,
) -> Option<Vec<OwnerReference>> {
    let (set_uid, pod_uid) = (set.uid().unwrap_or_default(), pod.uid().unwrap_or_default());
    let ours = |r: &OwnerReference| r.uid == set_uid || r.uid == pod_uid;
    let refs = claim.owner_references();
    let stale = |r: &OwnerReference| {
        (r.kind == "StatefulSet" && r.name == set.name_any() || r.kind == "Pod" && r.name == pod.name_any()) && !ours(r)
    };
    if refs.iter().any(|r| stale(r) || (r.controller == Some(true) && !ours(r))) {
        return None;
    }
    let (with_set, with_scaled) = deletes_claims(&set.spec);
    let mut wanted: Vec<OwnerReference> = refs.iter().filter(|r| !ours(r)).cloned().collect();
    if with_scaled && condemned {
        wanted.push(controller_ref(pod));
    } else if with_set {
        wanted.push(controller_ref(set));
    }
    Some(wanted)
}

/// The pod counts of a status (`computeReplicaStatus`).
fn count(
    status: &mut StatefulSetStatus,
    pods: &[Arc<Pod>],
    min_ready: i32,
    current: &str,
    update: &str,
    now: Timestamp,
) {
    let live = || pods.iter().filter(|p| !terminating(p));
    status.replicas = pods.len() as i32;
    status.ready_replicas = Some(pods.iter().filter(|p| running_and_ready(p)).count() as i32);
    status.available_replicas =
        Some(pods.iter().filter(|p| running_and_ready(p) && running_and_available(p, min_ready, now)).count() as i32);
    status.current_replicas = Some(live().filter(|p| revision_of(p) == Some(current)).count() as i32);
    status.updated_replicas = Some(live().filter(|p| revision_of(p) == Some(update)).count() as i32);
}

/// `completeRollingUpdate`: once every pod is updated and ready, the update revision is current.
fn complete_rolling_update(spec: &StatefulSetSpec, status: &mut StatefulSetStatus) {
    let rolling = spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()) != Some("OnDelete");
    if rolling && status.updated_replicas == Some(status.replicas) && status.ready_replicas == Some(status.replicas) {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
}

/// Whether a new pod `ord` is made at the current revision rather than the update one
/// (`newVersionedStatefulSetPod`): with RollingUpdate, the pods below the partition stay current.
fn stays_current(spec: &StatefulSetSpec, status: &StatefulSetStatus, start: usize, ord: usize) -> bool {
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    if strategy.type_.as_deref() == Some("OnDelete") {
        return false;
    }
    let below = match strategy.rolling_update.and_then(|r| r.partition) {
        Some(partition) => partition,
        None => status.current_replicas.unwrap_or(0),
    };
    ord < start + below.max(0) as usize
}

/// One sync's view of a set: its pods by ordinal and what they are made from.
struct Plan<'a> {
    set: &'a StatefulSet,
    api: Api<Pod>,
    start: usize,
    /// Pods at ordinals `start..start + replicas`, `None` where missing.
    replicas: Vec<Option<Arc<Pod>>>,
    /// Pods at other ordinals, highest first.
    condemned: Vec<Arc<Pod>>,
    current: (PodTemplateSpec, String),
    update: (PodTemplateSpec, String),
    min_ready: i32,
    monotonic: bool,
    now: Timestamp,
}

impl Reconciler for StatefulSets {
    type Object = StatefulSet;
    const NAME: &'static str = "statefulset";

    async fn synced(&self) -> bool {
        synced(&self.pods).await && synced(&self.revisions).await && synced(&self.claims).await
    }

    async fn reconcile(&self, set: Arc<StatefulSet>) -> Result<Action, Error> {
        let ns = set.namespace().unwrap_or_default();
        let name = set.name_any();
        let spec = set.spec.clone();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let selects = |labels: &BTreeMap<String, String>| selector_matches(Some(&spec.selector), labels);
        let claim = Claim { owner: &*set, adopting: set.metadata.deletion_timestamp.is_none() };
        let candidates = self.pods.state().into_iter().filter(|p| {
            p.namespace().as_deref() == Some(&ns)
                && parent_and_ordinal(p.metadata.name.as_deref().unwrap_or_default()).is_some_and(|(s, _)| s == name)
        });
        let pods = claim.claim(&api, candidates, |p| selects(p.labels())).await?;
        let revisions_api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let candidates = self.revisions.state().into_iter().filter(|r| r.namespace().as_deref() == Some(&ns));
        let claimed = claim.claim(&revisions_api, candidates, |r| selects(r.labels())).await?;
        let mut revisions: Vec<ControllerRevision> = claimed.iter().map(|r| (**r).clone()).collect();
        history::sort(&mut revisions);

        let old = set.status.clone().unwrap_or_default();
        let mut collisions = old.collision_count.unwrap_or(0);
        let (current, update) = self.revisions(&set, &revisions_api, &revisions, &mut collisions).await?;
        let now = Timestamp::now();
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let mut status = StatefulSetStatus {
            observed_generation: set.metadata.generation,
            current_revision: Some(current.name_any()),
            update_revision: Some(update.name_any()),
            collision_count: Some(collisions),
            conditions: old.conditions.clone(),
            ..StatefulSetStatus::default()
        };
        count(&mut status, &pods, min_ready, &current.name_any(), &update.name_any(), now);

        let (outcome, waiting) = if set.metadata.deletion_timestamp.is_none() {
            let plan = self.plan(&set, api, &pods, &current, &update, now);
            let outcome = self.sync(&plan, &mut status).await;
            let waiting =
                plan.replicas.iter().enumerate().any(|(i, p)| p.is_none() && self.claims_stale(&set, plan.start + i));
            (outcome, waiting)
        } else {
            (Ok(()), false)
        };
        complete_rolling_update(&spec, &mut status);
        if set.status.as_ref() != Some(&status) {
            let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
            sets.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
        }
        self.truncate_history(&spec, &revisions_api, &revisions, &pods, &status).await?;
        outcome?;
        // Claims are not watched: a pod waiting for a stale claim to go is looked at again.
        if waiting {
            return Ok(Action::requeue(STALE_CLAIM_RECHECK));
        }
        // Pods ready but not yet for minReadySeconds become available later: look again then.
        if min_ready > 0 && status.ready_replicas != status.available_replicas {
            return Ok(Action::requeue(Duration::from_secs(min_ready as u64)));
        }
        Ok(Action::await_change())
    }
}

impl StatefulSets {
    /// `getStatefulSetRevisions`: the current revision (the status's, or the update one for a new
    /// set) and the update revision, the one of the set's template, made or renumbered as needed.
    async fn revisions(
        &self,
        set: &StatefulSet,
        api: &Api<ControllerRevision>,
        revisions: &[ControllerRevision],
        collisions: &mut i32,
    ) -> Result<(ControllerRevision, ControllerRevision), Error> {
        let template = set.spec.template.clone();
        let data = history::template_patch(&template);
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        let next = history::next(revisions);
        let equal = revisions.iter().rfind(|r| r.data.0 == data);
        let update = match (equal, revisions.last()) {
            (Some(e), Some(last)) if history::equal(e, last) => last.clone(),
            // The template went back to an earlier revision: that one becomes the newest.
            (Some(e), _) => history::renumber(api, e, next).await?,
            (None, _) => {
                history::create(api, collisions, |c| {
                    let hash = history::hash(&data, c);
                    let mut labels = labels.clone();
                    labels.insert(history::HASH_LABEL.into(), hash.clone());
                    history::new(set, labels, &hash, data.clone(), next)
                })
                .await?
            }
        };
        let wanted = set.status.as_ref().and_then(|s| s.current_revision.as_deref());
        let current = revisions.iter().find(|r| r.metadata.name.as_deref() == wanted).cloned();
        Ok((current.unwrap_or_else(|| update.clone()), update))
    }

    fn plan<'a>(
        &self,
        set: &'a StatefulSet,
        api: Api<Pod>,
        pods: &[Arc<Pod>],
        current: &ControllerRevision,
        update: &ControllerRevision,
        now: Timestamp,
    ) -> Plan<'a> {
        let spec = set.spec.clone();
        let count = spec.replicas.unwrap_or(1).max(0) as usize;
        let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0).max(0) as usize;
        let mut replicas = vec![None; count];
        let mut condemned = Vec::new();
        for p in pods {
            let Some(ord) = ordinal(p) else { continue };
            match ord.checked_sub(start).filter(|i| *i < count) {
                Some(i) => replicas[i] = Some(p.clone()),
                None => condemned.push(p.clone()),
            }
        }
        condemned.sort_by_key(|p| Reverse(ordinal(p)));
        Plan {
            set,
            api,
            start,
            replicas,
            condemned,
            current: (history::template_of(current).unwrap_or_else(|| spec.template.clone()), current.name_any()),
            update: (spec.template.clone(), update.name_any()),
            min_ready: spec.min_ready_seconds.unwrap_or(0),
            monotonic: spec.pod_management_policy.as_deref() != Some("Parallel"),
            now,
        }
    }

    /// `updateStatefulSet`: replicas made whole, condemned pods removed, then the rolling update.
    async fn sync(&self, plan: &Plan<'_>, status: &mut StatefulSetStatus) -> Result<(), Error> {
        let spec = plan.set.spec.clone();
        // 1. Every replica exists and is healthy; OrderedReady stops at the first that is not.
        let indexes: Vec<usize> = (0..plan.replicas.len()).collect();
        if plan.monotonic {
            for i in indexes {
                if self.process_replica(plan, status, i).await? {
                    return Ok(());
                }
            }
        } else {
            for batch in indexes.chunks(MAX_BATCH) {
                let done = join_all(batch.iter().map(|i| self.process_replica(plan, status, *i))).await;
                done.into_iter().collect::<Result<Vec<_>, _>>()?;
            }
        }
        // 2. Claims of condemned pods follow the retention policy before the pods go.
        for p in &plan.condemned {
            self.fix_claims(plan.set, p, true).await?;
        }
        // 3. Condemned pods go, highest first; OrderedReady one at a time, each once the rest are healthy.
        let first_unhealthy = plan
            .replicas
            .iter()
            .find(|p| unavailable(p.as_ref(), plan.min_ready, plan.now))
            .cloned()
            .flatten()
            .or_else(|| plan.condemned.iter().rev().find(|p| unavailable(Some(p), plan.min_ready, plan.now)).cloned());
        if plan.monotonic {
            if let Some(p) = plan.condemned.first() {
                let first = first_unhealthy.as_ref().is_some_and(|f| Arc::ptr_eq(f, p));
                if !terminating(p) && (running_and_available(p, plan.min_ready, plan.now) || first) {
                    self.delete(plan, p, "scale down").await?;
                }
                return Ok(());
            }
        } else {
            let going: Vec<&Arc<Pod>> = plan.condemned.iter().filter(|p| !terminating(p)).collect();
            for batch in going.chunks(MAX_BATCH) {
                let done = join_all(batch.iter().map(|p| self.delete(plan, p, "scale down"))).await;
                done.into_iter().collect::<Result<Vec<_>, _>>()?;
            }
        }
        // 4. The rolling update (`updateStatefulSetAfterInvariantEstablished`); OnDelete has none.
        let strategy = spec.update_strategy.unwrap_or_default();
        if strategy.type_.as_deref() == Some("OnDelete") {
            return Ok(());
        }
        let rolling = strategy.rolling_update.unwrap_or_default();
        let partition = rolling.partition.unwrap_or(0).max(0) as usize;
        let total = plan.replicas.len() as i32;
        let max_unavailable = match rolling.max_unavailable.as_ref() {
            None => 1,
            v => super::deployment::scaled(v, total, false).max(1),
        } as usize;
        let down = plan.replicas.iter().filter(|p| unavailable(p.as_ref(), plan.min_ready, plan.now)).count();
        if down > max_unavailable {
            return Ok(());
        }
        let outdated = plan.replicas.iter().enumerate().rev().take_while(|(i, _)| *i >= partition);
        let victims: Vec<&Arc<Pod>> = outdated
            .filter_map(|(_, p)| p.as_ref())
            .filter(|p| revision_of(p) != Some(&plan.update.1) && !terminating(p))
            .take(max_unavailable - down)
            .collect();
        for p in victims {
            self.delete(plan, p, "update").await?;
            status.current_replicas = status.current_replicas.map(|c| c - 1);
        }
        Ok(())
    }

    /// `processReplica`: makes replica `i` exist and match its identity; says whether an
    /// OrderedReady sync must stop here.
    async fn process_replica(&self, plan: &Plan<'_>, status: &StatefulSetStatus, i: usize) -> Result<bool, Error> {
        let ord = plan.start + i;
        let Some(pod) = &plan.replicas[i] else {
            let spec = plan.set.spec.clone();
            let (template, revision) =
                if stays_current(&spec, status, plan.start, ord) { &plan.current } else { &plan.update };
            let pod = new_pod(plan.set, template, ord, revision);
            if self.claims_stale(plan.set, ord) {
                return Ok(true);
            }
            self.create_claims(plan.set, &pod, ord).await?;
            let name = pod.name_any();
            match plan.api.create(&PostParams::default(), &pod).await {
                Ok(_) => self.event(
                    plan.set,
                    EventType::Normal,
                    "SuccessfulCreate",
                    "Create",
                    format!("create Pod {name} in StatefulSet {} successful", plan.set.name_any()),
                ),
                // Made already; the cache has yet to show it.
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(true),
                Err(e) => {
                    let message = api_message(&e);
                    self.event(
                        plan.set,
                        EventType::Warning,
                        "FailedCreate",
                        "Create",
                        format!("create Pod {name} in StatefulSet {} failed error: {message}", plan.set.name_any()),
                    );
                    return Err(e.into());
                }
            }
            return Ok(plan.monotonic);
        };
        // A finished pod is replaced: deleted now, made again once it is gone.
        if matches!(phase(pod), "Failed" | "Succeeded") {
            if !terminating(pod) {
                self.delete(plan, pod, "replacement").await?;
            }
            return Ok(true);
        }
        if phase(pod) == "Pending" {
            self.create_claims(plan.set, pod, ord).await?;
        }
        if plan.monotonic
            && (terminating(pod) || !running_and_ready(pod) || !running_and_available(pod, plan.min_ready, plan.now))
        {
            return Ok(true);
        }
        // Identity labels put back where they were lost or changed.
        let name = pod.name_any();
        let index = ord.to_string();
        if pod.labels().get(POD_NAME_LABEL) != Some(&name) || pod.labels().get(POD_INDEX_LABEL) != Some(&index) {
            let patch = json!({"metadata": {"labels": {POD_NAME_LABEL: name, POD_INDEX_LABEL: index}}});
            plan.api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        self.fix_claims(plan.set, pod, false).await?;
        Ok(false)
    }

    /// `PodClaimIsStale`: a claim of a pod yet to be made is still going away (being deleted, or
    /// owned by the earlier pod of that ordinal); the pod waits for it.
    fn claims_stale(&self, set: &StatefulSet, ord: usize) -> bool {
        claims_for(set, ord).iter().any(|c| {
            let cached = self.claims.get(&ObjectRef::new(&c.name_any()).within(&c.namespace().unwrap_or_default()));
            cached.is_some_and(|c| {
                c.metadata.deletion_timestamp.is_some() || c.owner_references().iter().any(|r| r.kind == "Pod")
            })
        })
    }

    /// `createMissingPersistentVolumeClaims`: the claims of `pod` not there yet are made.
    async fn create_claims(&self, set: &StatefulSet, pod: &Pod, ord: usize) -> Result<(), Error> {
        let ns = set.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        for mut claim in claims_for(set, ord) {
            let name = claim.name_any();
            if self.claims.get(&ObjectRef::new(&name).within(&ns)).is_some() {
                continue;
            }
            claim.metadata.owner_references = claim_owners(set, pod, false, &claim).filter(|r| !r.is_empty());
            let (pod_name, set_name) = (pod.name_any(), set.name_any());
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => self.event(
                    set,
                    EventType::Normal,
                    "SuccessfulCreate",
                    "Create",
                    format!("create Claim {name} Pod {pod_name} in StatefulSet {set_name} success"),
                ),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    let message = api_message(&e);
                    self.event(
                        set,
                        EventType::Warning,
                        "FailedCreate",
                        "Create",
                        format!(
                            "create Claim {name} for Pod {pod_name} in StatefulSet {set_name} failed error: {message}"
                        ),
                    );
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// `UpdatePodClaimForRetentionPolicy`: the owner references of `pod`'s claims as the policy wants.
    async fn fix_claims(&self, set: &StatefulSet, pod: &Pod, condemned: bool) -> Result<(), Error> {
        let Some(ord) = ordinal(pod) else { return Ok(()) };
        let ns = set.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        for claim in claims_for(set, ord) {
            let Some(cached) = self.claims.get(&ObjectRef::new(&claim.name_any()).within(&ns)) else { continue };
            let Some(wanted) = claim_owners(set, pod, condemned, &cached) else { continue };
            let uids = |refs: &[OwnerReference]| refs.iter().map(|r| r.uid.clone()).collect::<HashSet<_>>();
            if uids(&wanted) == uids(cached.owner_references()) {
                continue;
            }
            let refs = if wanted.is_empty() { Value::Null } else { json!(wanted) };
            let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": cached.resource_version()}});
            match api.patch(&cached.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                // Changed or gone meanwhile: the next sync sees it as it is.
                Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn delete(&self, plan: &Plan<'_>, pod: &Pod, why: &str) -> Result<(), Error> {
        let name = pod.name_any();
        tracing::debug!("statefulset {}: deleting pod {name} for {why}", plan.set.name_any());
        match plan.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                self.event(
                    plan.set,
                    EventType::Normal,
                    "SuccessfulDelete",
                    "Delete",
                    format!("delete Pod {name} in StatefulSet {} successful", plan.set.name_any()),
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => {
                let message = api_message(&e);
                self.event(
                    plan.set,
                    EventType::Warning,
                    "FailedDelete",
                    "Delete",
                    format!("delete Pod {name} in StatefulSet {} failed error: {message}", plan.set.name_any()),
                );
                Err(e.into())
            }
        }
    }

    /// `truncateHistory`: revisions neither current, nor the update one, nor any pod's are
    /// deleted, oldest first, down to `revisionHistoryLimit`.
    async fn truncate_history(
        &self,
        spec: &StatefulSetSpec,
        api: &Api<ControllerRevision>,
        revisions: &[ControllerRevision],
        pods: &[Arc<Pod>],
        status: &StatefulSetStatus,
    ) -> Result<(), Error> {
        let mut live: HashSet<&str> = pods.iter().filter_map(|p| revision_of(p)).collect();
        live.extend(status.current_revision.as_deref());
        live.extend(status.update_revision.as_deref());
        let old: Vec<&ControllerRevision> =
            revisions.iter().filter(|r| !live.contains(r.metadata.name.as_deref().unwrap_or_default())).collect();
        let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
        for r in old.iter().take(old.len().saturating_sub(limit)) {
            match api.delete(&r.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn event(&self, set: &StatefulSet, kind: EventType, reason: &str, action: &'static str, message: String) {
        self.recorder.record(EventObject::of(set), kind, reason, action, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: Value) -> StatefulSet {
        let mut base = json!({"metadata": {"name": "web", "namespace": "default", "uid": "set-uid"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": "i"}],
                                           "volumes": [{"name": "www", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "www", "labels": {"tier": "data"}},
                                               "spec": {"accessModes": ["ReadWriteOnce"]}}]}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn ordinals_come_from_the_name() {
        assert_eq!(parent_and_ordinal("web-2"), Some(("web", 2)));
        assert_eq!(parent_and_ordinal("my-db-10"), Some(("my-db", 10)));
        assert_eq!(parent_and_ordinal("web-x"), None);
        assert_eq!(parent_and_ordinal("web-"), None);
        assert_eq!(parent_and_ordinal("web"), None);
        assert_eq!(parent_and_ordinal("web-99999999999"), None, "beyond an int32");
    }

    #[test]
    fn a_pod_has_its_identity_and_its_claims() {
        let s = set(json!({}));
        let pod = new_pod(&s, &s.spec.template, 2, "web-abc");
        assert_eq!(pod.name_any(), "web-2");
        let labels = pod.labels();
        assert_eq!(labels[POD_NAME_LABEL], "web-2");
        assert_eq!(labels[POD_INDEX_LABEL], "2");
        assert_eq!(labels[REVISION_LABEL], "web-abc");
        assert_eq!(labels["app"], "web");
        let spec = pod.spec.unwrap();
        assert_eq!((spec.hostname.as_deref(), spec.subdomain.as_deref()), (Some("web-2"), Some("nginx")));
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 2, "the claim replaces the template volume of its name: {volumes:?}");
        assert_eq!(volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name, "www-web-2");
        assert_eq!(volumes[1].name, "tmp");
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("StatefulSet", "set-uid", Some(true)));

        let claims = claims_for(&s, 2);
        assert_eq!(claims[0].name_any(), "www-web-2");
        assert_eq!(claims[0].labels().get("tier").map(String::as_str), Some("data"));
        assert_eq!(claims[0].labels().get("app").map(String::as_str), Some("web"), "the selector's labels");
    }

    #[test]
    fn claim_owners_follow_the_retention_policy() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web-3", "uid": "pod-uid"}})).unwrap();
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "www-web-3"}})).unwrap();
        let owners = |policy: Value, condemned: bool, claim: &PersistentVolumeClaim| {
            let s = set(json!({"spec": {"persistentVolumeClaimRetentionPolicy": policy}}));
            claim_owners(&s, &pod, condemned, claim).map(|r| r.iter().map(|o| o.uid.clone()).collect::<Vec<_>>())
        };
        let retain = json!({"whenDeleted": "Retain", "whenScaled": "Retain"});
        let with_set = json!({"whenDeleted": "Delete", "whenScaled": "Retain"});
        let both = json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
        assert_eq!(owners(retain.clone(), true, &claim), Some(vec![]));
        assert_eq!(owners(with_set.clone(), true, &claim), Some(vec!["set-uid".to_string()]));
        assert_eq!(owners(both.clone(), false, &claim), Some(vec!["set-uid".to_string()]));
        assert_eq!(
            owners(both.clone(), true, &claim),
            Some(vec!["pod-uid".to_string()]),
            "a scaled-down pod takes its claim along"
        );
        // Refs of our own are replaced, others kept; a claim controlled by someone else is left alone.
        let mut owned = claim.clone();
        owned.metadata.owner_references = Some(vec![
            controller_ref(&set(json!({}))),
            OwnerReference { kind: "ConfigMap".into(), name: "x".into(), uid: "other".into(), ..Default::default() },
        ]);
        assert_eq!(owners(retain.clone(), false, &owned), Some(vec!["other".to_string()]));
        owned.metadata.owner_references.as_mut().unwrap()[1].controller = Some(true);
        assert_eq!(owners(both, false, &owned), None);
    }

    #[test]
    fn revisions_record_the_template_and_give_it_back() {
        let s = set(json!({}));
        let template = s.spec.template.clone();
        let data = history::template_patch(&template);
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        let rev = history::new(&s, BTreeMap::new(), &history::hash(&data, 0), data, 1);
        assert_eq!(history::template_of(&rev), Some(template));
        assert!(rev.name_any().starts_with("web-"));
    }

    #[test]
    fn new_pods_below_the_partition_stay_at_the_current_revision() {
        let spec = |strategy: Value| set(json!({"spec": {"updateStrategy": strategy}})).spec;
        let status = StatefulSetStatus { current_replicas: Some(2), ..Default::default() };
        let partitioned = spec(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}));
        assert!(stays_current(&partitioned, &status, 0, 2));
        assert!(!stays_current(&partitioned, &status, 0, 3));
        assert!(stays_current(&partitioned, &status, 5, 7), "counted from the start ordinal");
        let unpartitioned = spec(json!({"type": "RollingUpdate"}));
        assert!(stays_current(&unpartitioned, &status, 0, 1), "below the current replicas");
        assert!(!stays_current(&unpartitioned, &status, 0, 2));
        assert!(!stays_current(&spec(json!({"type": "OnDelete"})), &status, 0, 0));
    }

    #[test]
    fn status_counts_and_completes_the_rollout() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let pod = |name: &str, revision: &str, ready: bool| -> Arc<Pod> {
            Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "labels": {REVISION_LABEL: revision}},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                           "lastTransitionTime": "2026-01-01T11:00:00Z"}]}}))
            .unwrap())
        };
        let pods = [pod("web-0", "new", true), pod("web-1", "new", true), pod("web-2", "old", false)];
        let mut status = StatefulSetStatus {
            current_revision: Some("old".into()),
            update_revision: Some("new".into()),
            ..Default::default()
        };
        count(&mut status, &pods, 0, "old", "new", now);
        assert_eq!(
            (
                status.replicas,
                status.ready_replicas,
                status.available_replicas,
                status.current_replicas,
                status.updated_replicas
            ),
            (3, Some(2), Some(2), Some(1), Some(2))
        );
        let spec = set(json!({})).spec;
        complete_rolling_update(&spec, &mut status);
        assert_eq!(status.current_revision.as_deref(), Some("old"), "not every pod is updated");
        let pods = [pod("web-0", "new", true), pod("web-1", "new", true)];
        count(&mut status, &pods, 0, "old", "new", now);
        complete_rolling_update(&spec, &mut status);
        assert_eq!((status.current_revision.as_deref(), status.current_replicas), (Some("new"), Some(2)));
    }
}
