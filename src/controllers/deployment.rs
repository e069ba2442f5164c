//! Deployments roll their template out through ReplicaSets (upstream's deployment controller,
//! `pkg/controller/deployment`): the ReplicaSet whose template equals the Deployment's (ignoring
//! `pod-template-hash`) is the new one, made on demand as `<name>-<hash>`; RollingUpdate moves
//! replicas from the old sets to the new one within maxSurge and maxUnavailable, Recreate empties
//! the old sets first; scaling a Deployment mid-rollout is spread over its sets in proportion;
//! revisions, history cleanup, pause, and the Progressing and Available conditions as upstream.
//! `kubectl rollout undo` is done by kubectl itself (it copies an old set's template back).

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::ownership::{Claim, controlled_by, controller_of, controller_ref};
use super::runtime::{self, Error, Reconciler, api_message};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::labels::selector_matches;

/// The label that tells a Deployment's ReplicaSets (and their pods) apart.
pub const HASH_LABEL: &str = "pod-template-hash";
const REVISION: &str = "deployment.kubernetes.io/revision";
const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// Annotations of a Deployment that are not copied to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];
/// Upstream's `maxRevHistoryLengthInChars`.
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

pub struct Deployments {
    client: Client,
    sets: Cache<ReplicaSet>,
    pods: Cache<Pod>,
    recorder: Recorder,
}

/// Starts the controller on the shared ReplicaSet and pod watches.
pub fn spawn(client: &Client, sets: &mut Informer<ReplicaSet>, pods: &mut Informer<Pod>, shutdown: &CancellationToken) {
    let controller = Controller::new(Api::<Deployment>::all(client.clone()), watcher::Config::default());
    let deployments: Cache<Deployment> = controller.store();
    let (for_sets, for_pods, set_cache) = (deployments.clone(), deployments, sets.cache());
    let controller = controller
        .watches_shared_stream(sets.subscribe(), move |rs| set_owners(&for_sets, &rs))
        .watches_shared_stream(pods.subscribe(), move |pod| recreating_owner(&for_pods, &set_cache, &pod));
    let reconciler = Deployments {
        client: client.clone(),
        sets: sets.cache(),
        pods: pods.cache(),
        recorder: Recorder::spawn(client.clone(), "deployment-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// A set's controller if that is a Deployment; for an orphan, every Deployment that selects it.
fn set_owners(deployments: &Cache<Deployment>, rs: &ReplicaSet) -> Vec<ObjectRef<Deployment>> {
    let ns = rs.namespace().unwrap_or_default();
    match controller_of(&rs.metadata) {
        Some(r) if r.kind == "Deployment" && r.api_version == "apps/v1" => vec![ObjectRef::new(&r.name).within(&ns)],
        Some(_) => Vec::new(),
        None => deployments
            .state()
            .iter()
            .filter(|d| d.namespace().as_deref() == Some(&ns) && selector_matches(Some(&d.spec.selector), rs.labels()))
            .map(|d| ObjectRef::from_obj(&**d))
            .collect(),
    }
}

/// The Deployment a pod belongs to, when it uses Recreate: it waits for old pods to be gone.
fn recreating_owner(
    deployments: &Cache<Deployment>,
    sets: &Cache<ReplicaSet>,
    pod: &Pod,
) -> Option<ObjectRef<Deployment>> {
    let ns = pod.namespace()?;
    let set = controller_of(&pod.metadata).filter(|r| r.kind == "ReplicaSet")?;
    let rs = sets.get(&ObjectRef::new(&set.name).within(&ns))?;
    let owner = controller_of(&rs.metadata).filter(|r| r.kind == "Deployment")?;
    let key = ObjectRef::new(&owner.name).within(&ns);
    let d = deployments.get(&key)?;
    (strategy_type(&d) == "Recreate").then_some(key)
}

fn strategy_type(d: &Deployment) -> &str {
    d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate")
}

fn replicas(d: &Deployment) -> i32 {
    d.spec.replicas.unwrap_or(1)
}

fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.replicas.unwrap_or(1)
}

fn rs_status(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.clone().unwrap_or_default();
    (s.replicas, s.ready_replicas.unwrap_or(0), s.available_replicas.unwrap_or(0))
}

/// `GetScaledValueFromIntOrPercent`.
pub(super) fn scaled(v: Option<&IntOrString>, total: i32, round_up: bool) -> i32 {
    match v {
        Some(IntOrString::Int(i)) => *i,
        Some(IntOrString::String(s)) => {
            let p: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let x = p * i64::from(total);
            (if round_up { (x + 99) / 100 } else { x / 100 }) as i32
        }
        None => 0,
    }
}

/// `ResolveFenceposts`: maxSurge rounds up, maxUnavailable down, and both zero means one unavailable.
fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d.spec.strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
    let n = replicas(d);
    let surge = scaled(ru.and_then(|r| r.max_surge.as_ref()), n, true);
    let unavailable = scaled(ru.and_then(|r| r.max_unavailable.as_ref()), n, false);
    if surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) }
}

fn max_surge(d: &Deployment) -> i32 {
    if strategy_type(d) != "RollingUpdate" { 0 } else { fenceposts(d).0 }
}

fn max_unavailable(d: &Deployment) -> i32 {
    if strategy_type(d) != "RollingUpdate" || replicas(d) == 0 { 0 } else { fenceposts(d).1.min(replicas(d)) }
}

fn annotation(rs: &ReplicaSet, key: &str) -> Option<i64> {
    rs.annotations().get(key).and_then(|v| v.parse().ok())
}

fn revision(rs: &ReplicaSet) -> i64 {
    annotation(rs, REVISION).unwrap_or(0)
}

/// Templates equal but for the `pod-template-hash` label (`EqualIgnoreHash`), compared as Go's
/// `Semantic.DeepEqual` sees them: a field holding its zero value (`0`, `false`, `""`, `{}`, `[]`)
/// equals one left out, as a template read back from protobuf (where Go writes zeros) must equal
/// the same template sent as JSON.
fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut v = serde_json::to_value(t).unwrap_or_default();
        if let Some(labels) = v.pointer_mut("/metadata/labels").and_then(serde_json::Value::as_object_mut) {
            labels.remove(HASH_LABEL);
        }
        without_zeros(v)
    };
    strip(a) == strip(b)
}

fn without_zeros(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            Value::Object(m.into_iter().map(|(k, v)| (k, without_zeros(v))).filter(|(_, v)| !is_zero(v)).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(without_zeros).collect()),
        other => other,
    }
}

fn is_zero(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
    }
}

/// `ComputeHash`: FNV-1a of the template (and the collision count), written in upstream's
/// consonant-and-digit alphabet (`rand.SafeEncodeString`).
pub fn template_hash(template: &PodTemplateSpec, collisions: Option<i32>) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(&serde_json::to_vec(template).unwrap_or_default());
    if let Some(c) = collisions {
        feed(&(c as u32).to_le_bytes());
    }
    super::history::safe_encode(hash)
}

fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let t = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b)).then_with(|| a.name_any().cmp(&b.name_any()))
}

fn condition<'a>(status: &'a DeploymentStatus, kind: &str) -> Option<&'a DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_.as_deref() == Some(kind))
}

fn new_condition(kind: &str, status: &str, reason: &str, message: String, now: Timestamp) -> DeploymentCondition {
    DeploymentCondition {
        type_: Some(kind.into()),
        status: Some(status.into()),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// `SetDeploymentCondition`: the same status and reason changes nothing; the same status keeps
/// its transition time.
fn set_condition(status: &mut DeploymentStatus, mut c: DeploymentCondition) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(cur) = conditions.iter().find(|x| x.type_ == c.type_) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    conditions.retain(|x| x.type_ != c.type_);
    conditions.push(c);
}

fn remove_condition(status: &mut DeploymentStatus, kind: &str) {
    if let Some(c) = &mut status.conditions {
        c.retain(|x| x.type_.as_deref() != Some(kind));
    }
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec.progress_deadline_seconds.is_some_and(|s| s != i32::MAX)
}

/// `DeploymentComplete`: every replica updated and available, and this generation observed.
fn complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let n = Some(replicas(d));
    s.updated_replicas == n
        && s.replicas == n
        && s.available_replicas == n
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// `DeploymentProgressing`: more updated, fewer old, or more ready or available replicas.
fn progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    let old_old = n(old.replicas) - n(old.updated_replicas);
    let new_old = n(new.replicas) - n(new.updated_replicas);
    n(new.updated_replicas) > n(old.updated_replicas)
        || new_old < old_old
        || n(new.ready_replicas) > n(old.ready_replicas)
        || n(new.available_replicas) > n(old.available_replicas)
}

/// `DeploymentTimedOut`: no progress within `progressDeadlineSeconds` of the last.
fn timed_out(d: &Deployment, s: &DeploymentStatus, now: Timestamp) -> bool {
    if !has_progress_deadline(d) {
        return false;
    }
    let Some(c) = condition(s, "Progressing") else { return false };
    match c.reason.as_deref() {
        Some("NewReplicaSetAvailable") => false,
        Some("ProgressDeadlineExceeded") => true,
        _ => c.last_update_time.as_ref().is_some_and(|t| {
            t.0 + SignedDuration::from_secs(i64::from(d.spec.progress_deadline_seconds.unwrap_or(0))) < now
        }),
    }
}

/// The sets a sync works on: the new one (if any) and the old ones.
struct Sets {
    new: Option<ReplicaSet>,
    old: Vec<ReplicaSet>,
}

impl Sets {
    fn all(&self) -> impl Iterator<Item = &ReplicaSet> {
        self.old.iter().chain(self.new.iter())
    }
    fn spec_total(&self) -> i32 {
        self.all().map(rs_replicas).sum()
    }
    fn active_old(&self) -> Vec<ReplicaSet> {
        self.old.iter().filter(|rs| rs_replicas(rs) > 0).cloned().collect()
    }
}

impl Reconciler for Deployments {
    type Object = Deployment;
    const NAME: &'static str = "deployment";

    async fn synced(&self) -> bool {
        synced(&self.sets).await && synced(&self.pods).await
    }

    async fn reconcile(&self, d: Arc<Deployment>) -> Result<Action, Error> {
        let mut d = (*d).clone();
        let ns = d.namespace().unwrap_or_default();
        let sets_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let sync = Sync { ctl: self, api: sets_api.clone() };
        let selector = &d.spec.selector;
        if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty())
        {
            self.recorder.record(
                EventObject::of(&d),
                EventType::Warning,
                "SelectingAll",
                "Sync",
                "This deployment is selecting all pods. A non-empty selector is required.".into(),
            );
            let generation = d.metadata.generation;
            if d.status.as_ref().and_then(|s| s.observed_generation) < generation {
                let mut status = d.status.clone().unwrap_or_default();
                status.observed_generation = generation;
                sync.write_status(&mut d, status).await?;
            }
            return Ok(Action::await_change());
        }
        let candidates = self.sets.state().into_iter().filter(|rs| rs.namespace().as_deref() == Some(&ns));
        let claim = Claim { owner: &d, adopting: d.metadata.deletion_timestamp.is_none() };
        let owned =
            claim.claim(&sets_api, candidates, |rs| selector_matches(Some(&d.spec.selector), rs.labels())).await?;
        let owned: Vec<ReplicaSet> = owned.iter().map(|rs| (**rs).clone()).collect();

        let sets = sync.sets(&mut d, owned).await?;
        if d.metadata.deletion_timestamp.is_some() {
            sync.sync_status(&mut d, &sets).await?;
            return Ok(Action::await_change());
        }
        sync.paused_condition(&mut d).await?;
        if d.spec.paused == Some(true) || scaling_event(&d, &sets) {
            sync.sync(&mut d, sets).await?;
            return Ok(Action::await_change());
        }
        if strategy_type(&d) == "Recreate" {
            sync.recreate(&mut d, sets).await
        } else {
            sync.rolling(&mut d, sets).await
        }
    }
}

/// One sync of one Deployment.
struct Sync<'a> {
    ctl: &'a Deployments,
    api: Api<ReplicaSet>,
}

impl Sync<'_> {
    async fn write_status(&self, d: &mut Deployment, status: DeploymentStatus) -> Result<(), Error> {
        let deployments: Api<Deployment> = Api::namespaced(self.ctl.client.clone(), &d.namespace().unwrap_or_default());
        // The revision annotation travels with the status, as upstream's UpdateStatus does.
        let body = json!({"metadata": {"annotations": {REVISION: d.annotations().get(REVISION)}}, "status": status});
        *d = deployments.patch_status(&d.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?;
        Ok(())
    }

    /// Writes `rs` (its replicas and annotations), with its resourceVersion as the precondition.
    async fn update_set(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        Ok(self.api.replace(&rs.name_any(), &PostParams::default(), rs).await?)
    }

    /// `getAllReplicaSetsAndSyncRevision` without creating: the new set (if there is one) and the
    /// old ones, with the new set's revision and annotations brought up to date.
    async fn sets(&self, d: &mut Deployment, mut owned: Vec<ReplicaSet>) -> Result<Sets, Error> {
        owned.sort_by(by_creation);
        let new_index = owned
            .iter()
            .position(|rs| rs.spec.template.as_ref().is_some_and(|t| equal_ignore_hash(t, &d.spec.template)));
        let new = new_index.map(|i| owned.remove(i));
        let old = owned;
        let max_old = old.iter().map(revision).max().unwrap_or(0);
        let new_revision = (max_old + 1).to_string();
        let now = Timestamp::now();

        if let Some(existing) = new {
            let mut rs = existing.clone();
            let changed = new_set_annotations(d, &mut rs, &new_revision, true);
            if changed || rs.spec.min_ready_seconds != d.spec.min_ready_seconds {
                rs.spec.min_ready_seconds = d.spec.min_ready_seconds;
                let rs = self.update_set(&rs).await?;
                return Ok(Sets { new: Some(rs), old });
            }
            let mut needs_update =
                set_deployment_revision(d, rs.annotations().get(REVISION).cloned().unwrap_or_default());
            let mut status = d.status.clone().unwrap_or_default();
            if has_progress_deadline(d) && condition(&status, "Progressing").is_none() {
                let msg = format!("Found new replica set \"{}\"", rs.name_any());
                set_condition(&mut status, new_condition("Progressing", "True", "FoundNewReplicaSet", msg, now));
                needs_update = true;
            }
            if needs_update {
                self.write_status(d, status).await?;
            }
            return Ok(Sets { new: Some(rs), old });
        }
        Ok(Sets { new: None, old })
    }

    /// Makes the new set `<name>-<hash>` of a Deployment that has none (`getNewReplicaSet`'s
    /// creating half), sized as the strategy allows.
    async fn create_new(&self, d: &mut Deployment, sets: &mut Sets) -> Result<(), Error> {
        let new_revision = (sets.old.iter().map(revision).max().unwrap_or(0) + 1).to_string();
        let now = Timestamp::now();
        let collisions = d.status.as_ref().and_then(|s| s.collision_count);
        let hash = template_hash(&d.spec.template, collisions);
        let mut template = d.spec.template.clone();
        template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert(HASH_LABEL.into(), hash.clone());
        let mut selector = d.spec.selector.clone();
        selector.match_labels.get_or_insert_with(Default::default).insert(HASH_LABEL.into(), hash.clone());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", d.name_any())),
                namespace: d.namespace(),
                owner_references: Some(vec![controller_ref(&*d)]),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: d.spec.min_ready_seconds,
                selector,
                template: Some(template),
            },
            status: None,
        };
        let probe = Sets { new: Some(rs.clone()), old: sets.old.clone() };
        let count = new_set_replicas(d, &probe, &rs);
        rs.spec.replicas = Some(count);
        new_set_annotations(d, &mut rs, &new_revision, false);

        let created = match self.api.create(&PostParams::default(), &rs).await {
            Ok(created) => {
                if count > 0 {
                    self.event(
                        d,
                        "ScalingReplicaSet",
                        format!("Scaled up replica set {} from 0 to {count}", created.name_any()),
                    );
                }
                created
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Made by an earlier sync the cache had yet to show, or a hash collision.
                let existing = self.api.get(&rs.name_any()).await?;
                let ours = controlled_by(&existing.metadata, &d.uid().unwrap_or_default())
                    && existing.spec.template.as_ref().is_some_and(|t| equal_ignore_hash(t, &d.spec.template));
                if !ours {
                    let mut status = d.status.clone().unwrap_or_default();
                    status.collision_count = Some(collisions.unwrap_or(0) + 1);
                    self.write_status(d, status).await?;
                    tracing::info!(
                        "deployment {ns}/{}: hash collision, collisionCount bumped",
                        d.name_any(),
                        ns = d.namespace().unwrap_or_default()
                    );
                    return Err(Error::Api(kube::Error::Api(s)));
                }
                existing
            }
            Err(e) => {
                let msg = format!("Failed to create new replica set \"{}\": {}", rs.name_any(), api_message(&e));
                if has_progress_deadline(d) {
                    let mut status = d.status.clone().unwrap_or_default();
                    set_condition(
                        &mut status,
                        new_condition("Progressing", "False", "ReplicaSetCreateError", msg.clone(), now),
                    );
                    let _ = self.write_status(d, status).await;
                }
                self.ctl.recorder.record(
                    EventObject::of(&*d),
                    EventType::Warning,
                    "ReplicaSetCreateError",
                    "Create",
                    msg,
                );
                return Err(e.into());
            }
        };
        set_deployment_revision(d, new_revision);
        let mut status = d.status.clone().unwrap_or_default();
        if has_progress_deadline(d) {
            let msg = format!("Created new replica set \"{}\"", created.name_any());
            set_condition(&mut status, new_condition("Progressing", "True", "NewReplicaSetCreated", msg, now));
        }
        self.write_status(d, status).await?;
        sets.new = Some(created);
        Ok(())
    }

    fn event(&self, d: &Deployment, reason: &str, message: String) {
        self.ctl.recorder.record(EventObject::of(d), EventType::Normal, reason, "Scale", message);
    }

    /// `scaleReplicaSet`: sets the replicas and the desired/max annotations; an event when the size changed.
    async fn scale_set(&self, d: &Deployment, rs: &ReplicaSet, to: i32) -> Result<ReplicaSet, Error> {
        let from = rs_replicas(rs);
        let mut updated = rs.clone();
        let annotations_changed = set_replicas_annotations(&mut updated, replicas(d), replicas(d) + max_surge(d));
        if from == to && !annotations_changed {
            return Ok(updated);
        }
        updated.spec.replicas = Some(to);
        let written = self.update_set(&updated).await?;
        if from != to {
            let how = if to > from { "up" } else { "down" };
            self.event(
                d,
                "ScalingReplicaSet",
                format!("Scaled {how} replica set {} from {from} to {to}", rs.name_any()),
            );
        }
        Ok(written)
    }

    /// Replaces `rs` in `sets` by its written version.
    fn put(sets: &mut Sets, rs: ReplicaSet) {
        if sets.new.as_ref().is_some_and(|n| n.uid() == rs.uid()) {
            sets.new = Some(rs);
        } else if let Some(o) = sets.old.iter_mut().find(|o| o.uid() == rs.uid()) {
            *o = rs;
        }
    }

    /// `checkPausedConditions`.
    async fn paused_condition(&self, d: &mut Deployment) -> Result<(), Error> {
        if !has_progress_deadline(d) {
            return Ok(());
        }
        let mut status = d.status.clone().unwrap_or_default();
        let reason = condition(&status, "Progressing").and_then(|c| c.reason.clone());
        if reason.as_deref() == Some("ProgressDeadlineExceeded") {
            return Ok(());
        }
        let paused_shown = reason.as_deref() == Some("DeploymentPaused");
        let now = Timestamp::now();
        let c = match (d.spec.paused == Some(true), paused_shown) {
            (true, false) => {
                new_condition("Progressing", "Unknown", "DeploymentPaused", "Deployment is paused".into(), now)
            }
            (false, true) => {
                new_condition("Progressing", "Unknown", "DeploymentResumed", "Deployment is resumed".into(), now)
            }
            _ => return Ok(()),
        };
        set_condition(&mut status, c);
        self.write_status(d, status).await
    }

    /// `sync`: scaling (and history cleanup while paused), then the status.
    async fn sync(&self, d: &mut Deployment, mut sets: Sets) -> Result<(), Error> {
        self.scale(d, &mut sets).await?;
        if d.spec.paused == Some(true) {
            self.cleanup(d, &sets).await?;
        }
        self.sync_status(d, &sets).await
    }

    /// `scale`: a lone active set gets every replica; a saturated new set empties the old ones;
    /// otherwise the change is spread over the sets in proportion to their size.
    async fn scale(&self, d: &Deployment, sets: &mut Sets) -> Result<(), Error> {
        let want = replicas(d);
        if let Some(rs) = active_or_latest(sets) {
            if rs_replicas(&rs) != want {
                let rs = self.scale_set(d, &rs, want).await?;
                Self::put(sets, rs);
            }
            return Ok(());
        }
        if let Some(new) = &sets.new
            && saturated(d, new)
        {
            for rs in sets.active_old() {
                let rs = self.scale_set(d, &rs, 0).await?;
                Self::put(sets, rs);
            }
            return Ok(());
        }
        if strategy_type(d) != "RollingUpdate" {
            return Ok(());
        }
        let mut active: Vec<ReplicaSet> = sets.all().filter(|rs| rs_replicas(rs) > 0).cloned().collect();
        let total: i32 = active.iter().map(rs_replicas).sum();
        let allowed = if want > 0 { want + max_surge(d) } else { 0 };
        let to_add = allowed - total;
        match to_add.cmp(&0) {
            // Bigger first; newer first when adding, older first when removing.
            Ordering::Greater => {
                active.sort_by(|a, b| rs_replicas(b).cmp(&rs_replicas(a)).then_with(|| by_creation(b, a)))
            }
            Ordering::Less => {
                active.sort_by(|a, b| rs_replicas(b).cmp(&rs_replicas(a)).then_with(|| by_creation(a, b)))
            }
            Ordering::Equal => return Ok(()),
        }
        let mut added = 0;
        let mut sizes: Vec<i32> = Vec::new();
        for rs in &active {
            let p = proportion(d, rs, to_add, added);
            sizes.push(rs_replicas(rs) + p);
            added += p;
        }
        // The leftover goes to (or comes from) the biggest set.
        if let Some(first) = sizes.first_mut() {
            *first = (*first + to_add - added).max(0);
        }
        for (rs, size) in active.iter().zip(sizes) {
            let rs = self.scale_set(d, rs, size).await?;
            Self::put(sets, rs);
        }
        Ok(())
    }

    /// `rolloutRolling`: either scale the new set up or the old ones down, then the status.
    async fn rolling(&self, d: &mut Deployment, mut sets: Sets) -> Result<Action, Error> {
        if sets.new.is_none() {
            self.create_new(d, &mut sets).await?;
        }
        if self.scale_up_new(d, &mut sets).await? {
            return self.rollout_status(d, &sets).await;
        }
        if self.scale_down_old(d, &mut sets).await? {
            return self.rollout_status(d, &sets).await;
        }
        if complete(d, &d.status.clone().unwrap_or_default()) {
            self.cleanup(d, &sets).await?;
        }
        self.rollout_status(d, &sets).await
    }

    /// `reconcileNewReplicaSet`.
    async fn scale_up_new(&self, d: &Deployment, sets: &mut Sets) -> Result<bool, Error> {
        let Some(new) = sets.new.clone() else { return Ok(false) };
        let want = replicas(d);
        let have = rs_replicas(&new);
        let to = match have.cmp(&want) {
            Ordering::Equal => return Ok(false),
            Ordering::Greater => want,
            Ordering::Less => new_set_replicas(d, sets, &new),
        };
        if to == have {
            return Ok(false);
        }
        let rs = self.scale_set(d, &new, to).await?;
        Self::put(sets, rs);
        Ok(true)
    }

    /// `reconcileOldReplicaSets`: unhealthy old replicas first, then old ones down to what
    /// maxUnavailable allows.
    async fn scale_down_old(&self, d: &Deployment, sets: &mut Sets) -> Result<bool, Error> {
        let old_total: i32 = sets.old.iter().map(rs_replicas).sum();
        if old_total == 0 {
            return Ok(false);
        }
        let all_total = sets.spec_total();
        let min_available = replicas(d) - max_unavailable(d);
        let new_unavailable = sets.new.as_ref().map_or(0, |n| rs_replicas(n) - rs_status(n).2);
        let max_scaled_down = all_total - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        let mut old = sets.active_old();
        old.sort_by(by_creation);
        // Old replicas that are not available go first, within the budget.
        let mut cleaned = 0;
        for rs in &old {
            if cleaned >= max_scaled_down {
                break;
            }
            let (want, available) = (rs_replicas(rs), rs_status(rs).2);
            if want == 0 || want == available {
                continue;
            }
            let n = (max_scaled_down - cleaned).min(want - available);
            let rs = self.scale_set(d, rs, want - n).await?;
            Self::put(sets, rs);
            cleaned += n;
        }
        // Then available old replicas, keeping minAvailable.
        let available: i32 = sets.all().map(|rs| rs_status(rs).2).sum();
        let mut scaled_down = 0;
        if available > min_available {
            let budget = available - min_available;
            let mut old = sets.active_old();
            old.sort_by(by_creation);
            for rs in &old {
                if scaled_down >= budget {
                    break;
                }
                let n = rs_replicas(rs).min(budget - scaled_down);
                let rs2 = self.scale_set(d, rs, rs_replicas(rs) - n).await?;
                Self::put(sets, rs2);
                scaled_down += n;
            }
        }
        Ok(cleaned + scaled_down > 0)
    }

    /// `rolloutRecreate`: old sets to zero, wait until no old pod runs, then the new set to full size.
    async fn recreate(&self, d: &mut Deployment, mut sets: Sets) -> Result<Action, Error> {
        let mut scaled_down = false;
        for rs in sets.active_old() {
            let rs = self.scale_set(d, &rs, 0).await?;
            Self::put(&mut sets, rs);
            scaled_down = true;
        }
        if scaled_down || self.old_pods_running(&sets) {
            return self.rollout_status(d, &sets).await;
        }
        if sets.new.is_none() {
            self.create_new(d, &mut sets).await?;
        }
        if let Some(new) = sets.new.clone()
            && rs_replicas(&new) != replicas(d)
        {
            let rs = self.scale_set(d, &new, replicas(d)).await?;
            Self::put(&mut sets, rs);
        }
        if complete(d, &d.status.clone().unwrap_or_default()) {
            self.cleanup(d, &sets).await?;
        }
        self.rollout_status(d, &sets).await
    }

    /// `oldPodsRunning`: an old set still counts pods, or one of its pods has not finished.
    fn old_pods_running(&self, sets: &Sets) -> bool {
        if sets.old.iter().map(|rs| rs_status(rs).0).sum::<i32>() > 0 {
            return true;
        }
        let uids: Vec<String> = sets.old.iter().filter_map(|rs| rs.uid()).collect();
        self.ctl.pods.state().iter().any(|p| {
            controller_of(&p.metadata).is_some_and(|r| uids.contains(&r.uid))
                && !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
        })
    }

    /// `cleanupDeployment`: old sets beyond `revisionHistoryLimit`, oldest revision first, once
    /// they have no replicas.
    async fn cleanup(&self, d: &Deployment, sets: &Sets) -> Result<(), Error> {
        let Some(limit) = d.spec.revision_history_limit else { return Ok(()) };
        let mut cleanable: Vec<&ReplicaSet> =
            sets.old.iter().filter(|rs| rs.metadata.deletion_timestamp.is_none()).collect();
        let surplus = cleanable.len() as i64 - i64::from(limit);
        if surplus <= 0 {
            return Ok(());
        }
        cleanable.sort_by(|a, b| revision(a).cmp(&revision(b)).then_with(|| by_creation(a, b)));
        for rs in cleanable.into_iter().take(surplus as usize) {
            let busy = rs_status(rs).0 != 0
                || rs_replicas(rs) != 0
                || rs.metadata.generation > rs.status.as_ref().and_then(|s| s.observed_generation);
            if busy {
                continue;
            }
            tracing::debug!("deployment {}: deleting old replica set {}", d.name_any(), rs.name_any());
            match self.api.delete(&rs.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `syncDeploymentStatus`.
    async fn sync_status(&self, d: &mut Deployment, sets: &Sets) -> Result<(), Error> {
        let status = calculate_status(d, sets, Timestamp::now());
        if d.status.as_ref() != Some(&status) {
            self.write_status(d, status).await?;
        }
        Ok(())
    }

    /// `syncRolloutStatus`: the status with the Progressing condition, and when to look again
    /// for the progress deadline.
    async fn rollout_status(&self, d: &mut Deployment, sets: &Sets) -> Result<Action, Error> {
        let now = Timestamp::now();
        let mut status = calculate_status(d, sets, now);
        if !has_progress_deadline(d) {
            remove_condition(&mut status, "Progressing");
        }
        let current = condition(&status, "Progressing").cloned();
        let done = status.replicas == status.updated_replicas
            && current.as_ref().is_some_and(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"));
        if has_progress_deadline(d) && !done {
            let new_name = sets.new.as_ref().map(|rs| rs.name_any());
            if complete(d, &status) {
                let msg = match &new_name {
                    Some(n) => format!("ReplicaSet \"{n}\" has successfully progressed."),
                    None => "Deployment has successfully progressed.".into(),
                };
                set_condition(&mut status, new_condition("Progressing", "True", "NewReplicaSetAvailable", msg, now));
            } else if progressing(d, &status) {
                let msg = match &new_name {
                    Some(n) => format!("ReplicaSet \"{n}\" is progressing."),
                    None => format!("Deployment \"{}\" is progressing.", d.name_any()),
                };
                let mut c = new_condition("Progressing", "True", "ReplicaSetUpdated", msg, now);
                // Progress moves the update time; the transition time stays while it is True.
                if let Some(cur) = &current
                    && cur.status.as_deref() == Some("True")
                {
                    c.last_transition_time = cur.last_transition_time.clone();
                }
                remove_condition(&mut status, "Progressing");
                set_condition(&mut status, c);
            } else if timed_out(d, &status, now) {
                let msg = match &new_name {
                    Some(n) => format!("ReplicaSet \"{n}\" has timed out progressing."),
                    None => format!("Deployment \"{}\" has timed out progressing.", d.name_any()),
                };
                set_condition(&mut status, new_condition("Progressing", "False", "ProgressDeadlineExceeded", msg, now));
            }
        }
        // A set that cannot make its pods shows as the Deployment's ReplicaFailure.
        let failure = sets.all().find_map(|rs| {
            rs.status
                .as_ref()?
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_.as_deref() == Some("ReplicaFailure"))
                .cloned()
        });
        match failure {
            Some(f) => set_condition(
                &mut status,
                DeploymentCondition {
                    type_: Some("ReplicaFailure".into()),
                    status: f.status,
                    reason: f.reason,
                    message: f.message,
                    last_update_time: f.last_transition_time.clone(),
                    last_transition_time: f.last_transition_time,
                },
            ),
            None => remove_condition(&mut status, "ReplicaFailure"),
        }
        if d.status.as_ref() != Some(&status) {
            self.write_status(d, status.clone()).await?;
        }
        Ok(match requeue_for_deadline(d, &status, now) {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }
}

/// `requeueStuckDeployment`: when a rollout that stopped progressing passes its deadline.
fn requeue_for_deadline(d: &Deployment, s: &DeploymentStatus, now: Timestamp) -> Option<Duration> {
    let c = condition(s, "Progressing")?;
    if !has_progress_deadline(d) || complete(d, s) || c.reason.as_deref() != Some("ReplicaSetUpdated") {
        return None;
    }
    let updated = c.last_update_time.as_ref()?.0;
    let due = updated + SignedDuration::from_secs(i64::from(d.spec.progress_deadline_seconds.unwrap_or(0)));
    let left = due.duration_since(now);
    Some(if left < SignedDuration::from_secs(1) { Duration::from_secs(1) } else { left.unsigned_abs() })
}

/// `calculateStatus`.
fn calculate_status(d: &Deployment, sets: &Sets, now: Timestamp) -> DeploymentStatus {
    let available: i32 = sets.all().map(|rs| rs_status(rs).2).sum();
    let total = sets.spec_total();
    let mut status = d.status.clone().unwrap_or_default();
    status.observed_generation = d.metadata.generation;
    status.replicas = Some(sets.all().map(|rs| rs_status(rs).0).sum());
    status.updated_replicas = Some(sets.new.as_ref().map_or(0, |rs| rs_status(rs).0));
    status.ready_replicas = Some(sets.all().map(|rs| rs_status(rs).1).sum());
    status.available_replicas = Some(available);
    status.unavailable_replicas = Some((total - available).max(0));
    let c = if available >= replicas(d) - max_unavailable(d) {
        new_condition(
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".into(),
            now,
        )
    } else {
        new_condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
            now,
        )
    };
    set_condition(&mut status, c);
    status
}

/// `isScalingEvent`: an active set's desired-replicas annotation differs from `spec.replicas`.
fn scaling_event(d: &Deployment, sets: &Sets) -> bool {
    let want = i64::from(replicas(d));
    sets.all().filter(|rs| rs_replicas(rs) > 0).any(|rs| annotation(rs, DESIRED_REPLICAS).is_some_and(|n| n != want))
}

/// `FindActiveOrLatest`: the only set with replicas, or the newest set when none has any.
fn active_or_latest(sets: &Sets) -> Option<ReplicaSet> {
    let active: Vec<&ReplicaSet> = sets.all().filter(|rs| rs_replicas(rs) > 0).collect();
    match active.as_slice() {
        [] => sets.new.clone().or_else(|| sets.old.iter().max_by(|a, b| by_creation(a, b)).cloned()),
        [one] => Some((*one).clone()),
        _ => None,
    }
}

/// `IsSaturated`: the new set is at full size and every replica available.
fn saturated(d: &Deployment, rs: &ReplicaSet) -> bool {
    let n = replicas(d);
    annotation(rs, DESIRED_REPLICAS) == Some(i64::from(n)) && rs_replicas(rs) == n && rs_status(rs).2 == n
}

/// `NewRSNewReplicas`: how big the new set may be now.
fn new_set_replicas(d: &Deployment, sets: &Sets, new: &ReplicaSet) -> i32 {
    if strategy_type(d) != "RollingUpdate" {
        return replicas(d);
    }
    let current = sets.spec_total();
    let max_total = replicas(d) + max_surge(d);
    if current >= max_total {
        return rs_replicas(new);
    }
    rs_replicas(new) + (max_total - current).min(replicas(d) - rs_replicas(new))
}

/// `GetProportion`: this set's share of a scaling of the whole Deployment.
fn proportion(d: &Deployment, rs: &ReplicaSet, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = if replicas(d) == 0 {
        -rs_replicas(rs)
    } else {
        let max = replicas(d) + max_surge(d);
        // Without the annotation the Deployment's current size stands in, as upstream.
        let before = annotation(rs, MAX_REPLICAS)
            .map(|n| n as i32)
            .unwrap_or_else(|| d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
        if before == 0 {
            0
        } else {
            (f64::from(rs_replicas(rs)) * f64::from(max) / f64::from(before)).round() as i32 - rs_replicas(rs)
        }
    };
    let allowed = to_add - added;
    if to_add > 0 { fraction.min(allowed) } else { fraction.max(allowed) }
}

/// `SetDeploymentRevision`.
fn set_deployment_revision(d: &mut Deployment, revision: String) -> bool {
    let annotations = d.metadata.annotations.get_or_insert_with(Default::default);
    if annotations.get(REVISION) == Some(&revision) {
        return false;
    }
    annotations.insert(REVISION.into(), revision);
    true
}

/// `SetReplicasAnnotations`.
fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if annotations.get(k) != Some(&v) {
            annotations.insert(k.into(), v);
            changed = true;
        }
    }
    changed
}

/// `SetNewReplicaSetAnnotations`: the Deployment's annotations copied, the revision raised (an
/// older revision of the set goes to its history), and for a set about to be made its replica
/// annotations.
fn new_set_annotations(d: &Deployment, rs: &mut ReplicaSet, new_revision: &str, exists: bool) -> bool {
    let mut changed = false;
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in d.annotations() {
        if NOT_COPIED.contains(&k.as_str()) || annotations.get(k) == Some(v) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        changed = true;
    }
    let old = annotations.get(REVISION).cloned();
    let old_n: i64 = match old.as_deref().map(str::parse) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return changed,
    };
    let new_n: i64 = new_revision.parse().unwrap_or(0);
    if old_n < new_n {
        annotations.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        if let Some(old) = old {
            let history = annotations.get(REVISION_HISTORY).cloned().unwrap_or_default();
            let mut revisions: Vec<&str> = if history.is_empty() { Vec::new() } else { history.split(',').collect() };
            let mut total = history.len() + old.len() + 1;
            while total > MAX_REVISION_HISTORY_CHARS && !revisions.is_empty() {
                total -= revisions.remove(0).len() + 1;
            }
            revisions.push(&old);
            annotations.insert(REVISION_HISTORY.into(), revisions.join(","));
        }
    }
    if !exists && set_replicas_annotations(rs, replicas(d), replicas(d) + max_surge(d)) {
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests;
