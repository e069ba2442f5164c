//! The scheduler: places pending pods on nodes the way kube-scheduler does.
//!
//! Data flow: watches of nodes and pods (kube-runtime's `watcher`, through the client) feed
//! `intake`, which keeps the [`cache::Cache`] (nodes and the
//! pods bound or assumed to them) and the [`queue::SchedulingQueue`] (pods waiting for a node)
//! current. The scheduling loop pops one pod at a time and runs its profile's plugins against a
//! snapshot of the cache ([`algorithm`]); the chosen node is assumed in the cache and the binding
//! cycle runs concurrently, binding through the API's `pods/binding`. Failures go back to the
//! queue, with a `FailedScheduling` event and the `PodScheduled` condition; when no node fits, the
//! PostFilter plugins (preemption) may nominate a node and name pods of lower priority to delete.

pub mod algorithm;
pub mod cache;
pub mod config;
pub mod framework;
mod nominator;
pub mod plugins;
pub mod queue;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::events::{EventType, ObjectRef, Recorder};
use algorithm::Failure;
use cache::{Cache, Snapshot};
pub use config::Config;
use framework::{ClusterEvent, CycleState, Nominated, Nomination, Point, PostFilterInput, Profile, Status};
use nominator::Nominator;
use queue::{QueueHooks, QueueOptions, QueuedPod, SchedulingQueue};
use types::{DISRUPTION_TARGET, NodeFacts, PREEMPTED_BY_SCHEDULER, PodInfo};

/// The running scheduler's shared state.
pub struct Scheduler {
    client: kube::Client,
    profiles: Arc<HashMap<String, Arc<Profile>>>,
    queue: Arc<SchedulingQueue>,
    cache: Mutex<Cache>,
    recorders: HashMap<String, Recorder>,
    /// The `PodScheduled` condition and nominated node of each pod waiting for a node, as the watch
    /// last showed them: a failure that would write the same is not written (upstream's
    /// `updatePod` compares too).
    unscheduled: Mutex<HashMap<String, Unscheduled>>,
    nominator: Mutex<Nominator>,
}

/// What the API shows of a pod waiting for a node.
#[derive(Clone, Default)]
struct Unscheduled {
    condition: Option<PodCondition>,
    nominated_node: String,
}

/// The queue's view of the profiles: PreEnqueue and queueing hints.
struct Hooks {
    profiles: Arc<HashMap<String, Arc<Profile>>>,
}

impl QueueHooks for Hooks {
    fn pre_enqueue(&self, pod: &PodInfo) -> Result<(), &'static str> {
        let Some(p) = self.profiles.get(&pod.scheduler_name) else { return Ok(()) };
        let s = p.run_pre_enqueue(pod);
        if s.is_success() { Ok(()) } else { Err(s.plugin) }
    }

    fn hint(&self, qp: &QueuedPod, event: &ClusterEvent) -> bool {
        // A pod that failed without a plugin to blame (no nodes at all) retries on any change.
        if qp.rejected_by.is_empty() && qp.pending_by.is_empty() {
            return true;
        }
        let Some(p) = self.profiles.get(&qp.pod.scheduler_name) else { return false };
        p.requeue(&qp.pod, &qp.rejected_by, event) || p.requeue(&qp.pod, &qp.pending_by, event)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Cache and nominator updates are single map operations; a panic elsewhere cannot leave one
    // half done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pod_ref(pod: &PodInfo) -> ObjectRef {
    ObjectRef {
        kind: "Pod",
        api_version: "v1",
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

impl Scheduler {
    /// Builds the profiles (failing on a bad configuration) and starts the scheduler; it runs until
    /// `shutdown`.
    pub fn start(
        client: kube::Client,
        config: &Config,
        node_name: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let handle = plugins::Handle::start(client.clone(), &shutdown);
        let profiles = config.build(&handle).map_err(|e| anyhow::anyhow!("scheduler configuration: {e}"))?;
        let opts = QueueOptions {
            initial_backoff: config.initial_backoff,
            max_backoff: config.max_backoff,
            ..QueueOptions::default()
        };
        let sched = Self::launch(client, profiles, opts, node_name, shutdown.clone());
        tokio::spawn(sched.follow_storage(handle, shutdown));
        Ok(())
    }

    /// Storage objects that change may make pods the volume plugins rejected schedulable.
    async fn follow_storage(self: Arc<Self>, handle: plugins::Handle, shutdown: CancellationToken) {
        let mut claims = handle.storage.claims_changed.clone();
        let [mut volumes, mut classes, mut csi_nodes, mut attachments] = handle.storage_changed.clone();
        loop {
            let changed = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = claims.changed() => c,
                c = volumes.changed() => c,
                c = classes.changed() => c,
                c = csi_nodes.changed() => c,
                c = attachments.changed() => c,
            };
            if changed.is_err() {
                return;
            }
            self.queue.on_event(&ClusterEvent::StorageChanged);
        }
    }

    fn launch(
        client: kube::Client,
        profiles: Vec<Profile>,
        opts: QueueOptions,
        node_name: &str,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let recorders = profiles
            .iter()
            .map(|p| (p.name.clone(), Recorder::spawn(client.clone(), p.name.clone(), node_name.to_string())))
            .collect();
        let profiles: Arc<HashMap<String, Arc<Profile>>> =
            Arc::new(profiles.into_iter().map(|p| (p.name.clone(), Arc::new(p))).collect());
        let queue = Arc::new(SchedulingQueue::new(Arc::new(Hooks { profiles: profiles.clone() }), opts));
        let sched = Arc::new(Scheduler {
            client,
            profiles,
            queue,
            cache: Mutex::new(Cache::default()),
            recorders,
            unscheduled: Mutex::default(),
            nominator: Mutex::default(),
        });
        tokio::spawn(sched.clone().run(shutdown));
        sched
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // Start scheduling only once the nodes and pods that exist are loaded.
        let (loaded, ready) = tokio::sync::oneshot::channel();
        let intake = tokio::spawn(self.clone().intake(loaded));
        tokio::select! {
            _ = ready => {}
            _ = shutdown.cancelled() => {
                intake.abort();
                return;
            }
        }
        tracing::info!(
            "scheduler started with profile(s) {:?}: {} node(s) known",
            self.profiles.keys().collect::<Vec<_>>(),
            lock(&self.cache).node_count()
        );
        let flushes = {
            let queue = self.queue.clone();
            tokio::spawn(async move { queue.run_flushes().await })
        };
        let scheduling = tokio::spawn(self.clone().scheduling_loop());
        shutdown.cancelled().await;
        self.queue.close();
        intake.abort();
        let _ = scheduling.await;
        let _ = flushes.await;
    }

    /// Follows the watches of nodes and pods (kube-runtime's watcher relists when a watch falls
    /// behind; what a relist no longer shows is gone). `loaded` fires once both were listed.
    async fn intake(self: Arc<Self>, loaded: tokio::sync::oneshot::Sender<()>) {
        enum Change {
            Node(Box<Event<Node>>),
            Pod(Box<Event<Pod>>),
        }
        let config = watcher::Config::default();
        let nodes = watcher(Api::<Node>::all(self.client.clone()), config.clone())
            .default_backoff()
            .map(|e| e.map(|e| Change::Node(Box::new(e))));
        let pods = watcher(Api::<Pod>::all(self.client.clone()), config)
            .default_backoff()
            .map(|e| e.map(|e| Change::Pod(Box::new(e))));
        // The watches are drained as fast as they deliver, into a queue this loop works through
        // (an informer's reflector and DeltaFIFO): a burst that keeps this loop busy (a thousand
        // nodes uncordoned under ten thousand waiting pods) must not leave the watches so far
        // behind that they are sent to relist everything.
        let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
        let drain = tokio::spawn(async move {
            let mut watches = std::pin::pin!(futures::stream::select(nodes, pods));
            while let Some(change) = watches.next().await {
                if tx.send(change).is_err() {
                    return;
                }
            }
        });
        let _drain = tokio_util::task::AbortOnDropHandle::new(drain);
        let mut loaded = Some(loaded);
        let (mut nodes_listed, mut pods_listed) = (false, false);
        // Pods and nodes known, and those seen since a relist began.
        let mut known: HashSet<String> = HashSet::new();
        let (mut relisted_pods, mut relisted_nodes): (HashSet<String>, HashSet<String>) = Default::default();
        while let Some(change) = changes.recv().await {
            match change {
                Err(e) => tracing::warn!("scheduler watch: {e}"),
                Ok(Change::Node(event)) => match *event {
                    Event::Init => relisted_nodes.clear(),
                    Event::InitApply(node) => {
                        relisted_nodes.insert(self.on_node(&node));
                    }
                    Event::Apply(node) => {
                        self.on_node(&node);
                    }
                    Event::Delete(node) => self.node_gone(node.metadata.name.as_deref().unwrap_or_default()),
                    Event::InitDone => {
                        let stale: Vec<String> = lock(&self.cache)
                            .node_names()
                            .filter(|n| !relisted_nodes.contains(*n))
                            .map(String::from)
                            .collect();
                        for name in stale {
                            self.node_gone(&name);
                        }
                        relisted_nodes = HashSet::new();
                        nodes_listed = true;
                    }
                },
                Ok(Change::Pod(event)) => match *event {
                    Event::Init => relisted_pods.clear(),
                    Event::InitApply(pod) => {
                        let info = Arc::new(PodInfo::from_pod(&pod));
                        self.remember_condition(&info, &pod);
                        relisted_pods.insert(info.uid.clone());
                        let new = known.insert(info.uid.clone());
                        self.on_pod(info, new);
                    }
                    Event::Apply(pod) => {
                        let info = Arc::new(PodInfo::from_pod(&pod));
                        self.remember_condition(&info, &pod);
                        let new = known.insert(info.uid.clone());
                        self.on_pod(info, new);
                    }
                    Event::Delete(pod) => {
                        let uid = pod.metadata.uid.unwrap_or_default();
                        known.remove(&uid);
                        self.pod_gone(&uid);
                    }
                    Event::InitDone => {
                        known.retain(|uid| {
                            let keep = relisted_pods.contains(uid);
                            if !keep {
                                self.pod_gone(uid);
                            }
                            keep
                        });
                        relisted_pods = HashSet::new();
                        pods_listed = true;
                    }
                },
            }
            if nodes_listed
                && pods_listed
                && let Some(tx) = loaded.take()
            {
                let _ = tx.send(());
            }
        }
    }

    /// Keeps the `PodScheduled` condition and nominated node of a pod that waits for a node.
    fn remember_condition(&self, info: &PodInfo, pod: &Pod) {
        let mut map = lock(&self.unscheduled);
        let condition = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled").cloned());
        let waiting = info.node_name.is_empty() && !info.finished;
        if waiting && (condition.is_some() || !info.nominated_node.is_empty()) {
            map.insert(info.uid.clone(), Unscheduled { condition, nominated_node: info.nominated_node.clone() });
        } else {
            map.remove(&info.uid);
        }
    }

    fn node_gone(&self, name: &str) {
        let removed = lock(&self.cache).remove_node(name);
        if let Some(node) = removed {
            self.queue.on_event(&ClusterEvent::NodeRemoved(node));
        }
    }

    /// A node was added or changed. Returns its name.
    fn on_node(&self, node: &Node) -> String {
        let facts = NodeFacts::from_node(node);
        let name = facts.name.clone();
        let changed = lock(&self.cache).upsert_node(facts);
        if let Some((info, added)) = changed {
            let event = if added { ClusterEvent::NodeAdded(info) } else { ClusterEvent::NodeChanged(info) };
            self.queue.on_event(&event);
        }
        name
    }

    /// A pod was added (`new`) or changed.
    fn on_pod(&self, pod: Arc<PodInfo>, new: bool) {
        if pod.finished {
            self.pod_gone(&pod.uid);
        } else if !pod.node_name.is_empty() {
            lock(&self.nominator).remove(&pod.uid);
            self.queue.delete(&pod.uid);
            let touched = lock(&self.cache).upsert_pod(pod.clone());
            if touched.is_some() {
                self.queue.on_event(&ClusterEvent::AssignedPodAdded { pod });
            }
        } else if pod.deleting {
            // Going away before it was placed: never scheduled.
            lock(&self.nominator).remove(&pod.uid);
            self.queue.delete(&pod.uid);
        } else if self.profiles.contains_key(&pod.scheduler_name) {
            lock(&self.nominator).update(&pod);
            if new { self.queue.add(pod) } else { self.queue.update(pod) }
        }
    }

    /// A pod was deleted or finished: it leaves the queue, and its node's resources are freed.
    fn pod_gone(&self, uid: &str) {
        lock(&self.unscheduled).remove(uid);
        lock(&self.nominator).remove(uid);
        self.queue.delete(uid);
        let removed = lock(&self.cache).remove_pod(uid);
        if let Some((pod, node)) = removed {
            self.queue.on_event(&ClusterEvent::AssignedPodRemoved { pod, node });
        }
    }

    /// Pops pods one at a time and runs their scheduling cycle.
    async fn scheduling_loop(self: Arc<Self>) {
        let mut snapshot = Snapshot::default();
        let mut next_start = 0;
        while let Some(qp) = self.queue.pop().await {
            self.schedule_one(qp, &mut snapshot, &mut next_start);
        }
    }

    /// The scheduling cycle of one pod; a placed pod's binding cycle continues in its own task.
    fn schedule_one(self: &Arc<Self>, qp: QueuedPod, snapshot: &mut Snapshot, next_start: &mut usize) {
        let pod = qp.pod.clone();
        let Some(profile) = self.profiles.get(&pod.scheduler_name).cloned() else {
            self.queue.done(&pod.uid);
            return;
        };
        if pod.deleting || lock(&self.cache).is_assumed(&pod.uid) {
            self.queue.done(&pod.uid);
            return;
        }
        lock(&self.cache).update_snapshot(snapshot);
        let (pod, nominated) = {
            let nominator = lock(&self.nominator);
            // A nomination made here that the watch has not shown yet.
            let pod = match nominator.node_of(&pod.uid) {
                Some(node) if node != pod.nominated_node => {
                    Arc::new(PodInfo { nominated_node: node.to_string(), ..(*pod).clone() })
                }
                _ => pod,
            };
            let nominated = nominator.for_pod(&pod);
            (pod, nominated)
        };
        let mut state = CycleState::default();
        let node = match algorithm::schedule_pod(&profile, &mut state, &pod, &snapshot.nodes, &nominated, next_start) {
            Ok(node) => node,
            Err(Failure::Unschedulable(mut fit)) => {
                let nomination = self.post_filter(&profile, &state, &pod, &snapshot.nodes, &nominated, &mut fit);
                return self.failed(qp, &Failure::Unschedulable(fit), nomination);
            }
            Err(failure) => return self.failed(qp, &failure, Some(String::new())),
        };
        let assumed = lock(&self.cache).assume(&pod, &node);
        let Some(assumed) = assumed else {
            // Bound by someone else during this cycle; the queue has already let it go.
            self.queue.done(&pod.uid);
            return;
        };
        let s = profile.run_reserve(&mut state, &assumed, &node);
        if !s.is_success() {
            return self.roll_back(qp, &Self::rejected_at(&s));
        }
        let (s, wait) = profile.run_permit(&mut state, &assumed, &node);
        if !(s.is_success() || s.code == framework::Code::Wait) {
            profile.run_unreserve(&mut state, &assumed, &node);
            return self.roll_back(qp, &Self::rejected_at(&s));
        }
        let wait = (s.code == framework::Code::Wait).then_some((wait, s.plugin));
        tokio::spawn(self.clone().binding_cycle(qp, profile, state, assumed, node, wait));
    }

    /// PostFilter after every node rejected the pod (upstream's `schedulingCycle`): with a
    /// nomination, its victims are preempted. Returns the nominated node to record: a node, `""`
    /// to clear an earlier nomination, or `None` to leave it as it is.
    fn post_filter(
        self: &Arc<Self>,
        profile: &Arc<Profile>,
        state: &CycleState,
        pod: &Arc<PodInfo>,
        nodes: &[Arc<types::NodeInfo>],
        nominated: &Nominated,
        fit: &mut algorithm::FitError,
    ) -> Option<String> {
        if profile.plugins(Point::PostFilter).next().is_none() {
            return Some(String::new());
        }
        let input = PostFilterInput {
            profile,
            nodes,
            helpful: fit.diagnosis.helpful(nodes),
            nominated_node_unresolvable: !pod.nominated_node.is_empty()
                && fit.diagnosis.unresolvable(&pod.nominated_node),
            nominated,
        };
        let (s, nomination) = profile.run_post_filter(state, pod, &input);
        if !s.reasons.is_empty() {
            fit.diagnosis.post_filter_msg = Some(s.message());
        }
        if s.code == framework::Code::Error {
            tracing::warn!("PostFilter for pod {}: {}", pod.key(), s.message());
        }
        let nomination = nomination?;
        if s.is_success() {
            self.preempt(pod, &nomination);
        }
        Some(nomination.node)
    }

    /// Makes room on the nominated node (upstream's `prepareCandidate`): the pod is nominated there
    /// at once; lower-priority pods nominated there lose their nomination; each victim not already
    /// going gets the `DisruptionTarget` condition, is deleted gracefully and gets a `Preempted`
    /// event.
    fn preempt(self: &Arc<Self>, pod: &Arc<PodInfo>, nomination: &Nomination) {
        let node = nomination.node.clone();
        let lower = {
            let mut nominator = lock(&self.nominator);
            let nominated = PodInfo { nominated_node: node.clone(), ..(**pod).clone() };
            nominator.nominate(Arc::new(nominated), &node);
            let lower = nominator.lower_on(&node, pod.priority);
            for p in &lower {
                nominator.remove(&p.uid);
            }
            lower
        };
        let victims: Vec<Arc<PodInfo>> = nomination.victims.iter().filter(|v| !v.deleting).cloned().collect();
        tracing::info!(
            "preempting {} pod(s) on node {node} for pod {}: {}",
            victims.len(),
            pod.key(),
            victims.iter().map(|v| v.key()).collect::<Vec<_>>().join(", ")
        );
        let this = self.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            for victim in &victims {
                match this.delete_victim(&pod, victim).await {
                    Ok(()) => this.record(
                        &pod.scheduler_name,
                        victim,
                        EventType::Normal,
                        "Preempted",
                        "Preempting",
                        format!("Preempted by pod {} on node {node}", pod.uid),
                    ),
                    Err(e) => tracing::warn!("preempting pod {}: {e}", victim.key()),
                }
            }
            for p in &lower {
                if let Err(e) = this.patch_status(p, serde_json::json!({"nominatedNodeName": null})).await {
                    tracing::debug!("clearing the nominated node of pod {}: {e}", p.key());
                }
            }
        });
    }

    /// Marks a victim with `DisruptionTarget` and deletes it with its own grace period.
    async fn delete_victim(&self, pod: &PodInfo, victim: &PodInfo) -> Result<(), kube::Error> {
        let condition = PodCondition {
            type_: DISRUPTION_TARGET.into(),
            status: "True".into(),
            reason: Some(PREEMPTED_BY_SCHEDULER.into()),
            message: Some(format!("{}: preempting to accommodate a higher priority pod", pod.scheduler_name)),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        };
        self.patch_status(victim, serde_json::json!({"conditions": [condition]})).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &victim.namespace);
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: Some(victim.uid.clone()), resource_version: None }),
            ..Default::default()
        };
        match pods.delete(&victim.name, &params).await {
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            other => other.map(drop),
        }
    }

    /// Waits on Permit, binds, and finishes or rolls back.
    async fn binding_cycle(
        self: Arc<Self>,
        qp: QueuedPod,
        profile: Arc<Profile>,
        mut state: CycleState,
        pod: Arc<PodInfo>,
        node: String,
        wait: Option<(std::time::Duration, &'static str)>,
    ) {
        let mut stage = "Bind";
        let status = match wait {
            // No plugin here can allow a waiting pod early, so a wait always runs out.
            Some((t, plugin)) => {
                tokio::time::sleep(t).await;
                Status::unschedulable(format!("rejected due to timeout after waiting {t:?} at plugin {plugin}"))
                    .with_plugin(plugin)
            }
            None => match profile.run_pre_bind(&state, &pod, &node).await {
                s if s.is_success() => profile.run_bind(&pod, &node).await,
                s => {
                    stage = "PreBind";
                    s
                }
            },
        };
        if status.is_success() {
            profile.run_post_bind(&pod, &node);
            tracing::debug!("bound pod {} to {node}", pod.key());
            self.record(&profile.name, &pod, EventType::Normal, "Scheduled", "Binding", {
                format!("Successfully assigned {} to {node}", pod.key())
            });
            self.queue.done(&pod.uid);
            return;
        }
        profile.run_unreserve(&mut state, &pod, &node);
        let failure = match Self::rejected_at(&status) {
            Failure::Error(e) => Failure::Error(format!("running {stage} plugin {:?}: {e}", status.plugin)),
            other => other,
        };
        self.roll_back(qp, &failure);
    }

    /// A rejection of the chosen node after filtering (Reserve, Permit), as upstream reports it:
    /// one node, rejected for the plugin's reasons.
    fn rejected_at(s: &Status) -> Failure {
        if s.is_rejected() {
            let mut diagnosis = algorithm::Diagnosis::default();
            diagnosis.record(s.clone());
            Failure::Unschedulable(Box::new(algorithm::FitError { num_all_nodes: 1, diagnosis }))
        } else {
            Failure::Error(s.message())
        }
    }

    /// Drops the pod's assumption, handles the failure, and only then tells waiting pods that the
    /// room is free again (so that the event does not count as news for the failed pod itself).
    fn roll_back(self: &Arc<Self>, qp: QueuedPod, failure: &Failure) {
        let removed = lock(&self.cache).forget(&qp.pod.uid);
        self.failed(qp, failure, Some(String::new()));
        if let Some((pod, node)) = removed {
            self.queue.on_event(&ClusterEvent::AssignedPodRemoved { pod, node });
        }
    }

    /// upstream's `handleSchedulingFailure`: back to the queue, a `FailedScheduling` event and the
    /// `PodScheduled=False` condition, with the nominated node when `nominate` changes it (`""`
    /// clears it).
    fn failed(self: &Arc<Self>, mut qp: QueuedPod, failure: &Failure, nominate: Option<String>) {
        let pod = qp.pod.clone();
        if nominate.as_deref() == Some("") {
            lock(&self.nominator).remove(&pod.uid);
        }
        let message = failure.to_string();
        let reason = match failure {
            Failure::Error(_) => {
                tracing::warn!("scheduling pod {} failed: {message}", pod.key());
                self.queue.requeue_error(qp);
                "SchedulerError"
            }
            Failure::NoNodes | Failure::Unschedulable(_) => {
                if let Failure::Unschedulable(fit) = failure {
                    qp.rejected_by = fit.diagnosis.unschedulable_plugins.clone();
                } else {
                    qp.rejected_by.clear();
                }
                tracing::debug!("pod {} is unschedulable: {message}", pod.key());
                self.queue.requeue_unschedulable(qp);
                "Unschedulable"
            }
        };
        self.record(&pod.scheduler_name, &pod, EventType::Warning, "FailedScheduling", "Scheduling", message.clone());
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.set_unscheduled(&pod, reason, &message, nominate).await {
                tracing::debug!("recording why pod {} is unscheduled: {e}", pod.key());
            }
        });
    }

    fn record(&self, profile: &str, pod: &PodInfo, kind: EventType, reason: &str, action: &'static str, msg: String) {
        if let Some(r) = self.recorders.get(profile) {
            r.record(pod_ref(pod), kind, reason, action, msg);
        }
    }

    /// Sets `PodScheduled=False` with the reason and the nominated node, as upstream's `updatePod`:
    /// nothing is written when the status already says so; otherwise one strategic merge patch of
    /// the status.
    async fn set_unscheduled(
        &self,
        pod: &PodInfo,
        reason: &str,
        message: &str,
        nominate: Option<String>,
    ) -> Result<(), kube::Error> {
        let old = lock(&self.unscheduled).get(&pod.uid).cloned().unwrap_or_default();
        let mut status = serde_json::Map::new();
        if let Some(node) = nominate.filter(|n| *n != old.nominated_node) {
            status.insert("nominatedNodeName".into(), if node.is_empty() { Value::Null } else { Value::String(node) });
        }
        let since = match old.condition {
            Some(c) if c.status == "False" => (c.reason.as_deref() != Some(reason)
                || c.message.as_deref() != Some(message))
            .then_some(c.last_transition_time),
            _ => Some(Some(Time(k8s_openapi::jiff::Timestamp::now()))),
        };
        if let Some(since) = since {
            let condition = PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_transition_time: since,
                ..Default::default()
            };
            status.insert("conditions".into(), serde_json::json!([condition]));
        }
        if status.is_empty() {
            return Ok(());
        }
        self.patch_status(pod, Value::Object(status)).await
    }

    /// A strategic merge patch of a pod's status carrying its UID (which the API refuses to change,
    /// so a replaced pod of the same name is left alone). The answer is checked, not decoded; a pod
    /// gone or replaced is no error.
    async fn patch_status(&self, pod: &PodInfo, status: Value) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"uid": pod.uid}, "status": status});
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&pod.namespace)))
            .patch_subresource("status", &pod.name, &PatchParams::default(), &Patch::Strategic(&patch))
            .map_err(kube::Error::BuildRequest)?;
        match self.client.request_text(request).await {
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => Ok(()),
            other => other.map(drop),
        }
    }
}
