//! The scheduler: places pending pods on nodes the way kube-scheduler does.
//!
//! Data flow: the store's watch feeds `intake`, which keeps the [`cache::Cache`] (nodes and the
//! pods bound or assumed to them) and the [`queue::SchedulingQueue`] (pods waiting for a node)
//! current. The scheduling loop pops one pod at a time and runs its profile's plugins against a
//! snapshot of the cache ([`algorithm`]); the chosen node is assumed in the cache and the binding
//! cycle runs concurrently, binding through the registry's `pods/binding`. Failures go back to the
//! queue, with a `FailedScheduling` event and the `PodScheduled` condition.

pub mod algorithm;
pub mod cache;
pub mod config;
pub mod framework;
pub mod plugins;
pub mod queue;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::events::{EventType, ObjectRef, Recorder};
use crate::registry::{Registry, StatusError};
use crate::store::{self, EventType as StoreEvent, Object, Subscription};
use algorithm::Failure;
use cache::{Cache, Snapshot};
pub use config::Config;
use framework::{ClusterEvent, CycleState, Profile, Status};
use queue::{QueueHooks, QueueOptions, QueuedPod, SchedulingQueue};
use types::{NodeFacts, PodInfo};

const PODS: &str = "pods/";
const NODES: &str = "nodes/";

/// The running scheduler's shared state.
pub struct Scheduler {
    registry: Registry,
    profiles: Arc<HashMap<String, Arc<Profile>>>,
    queue: Arc<SchedulingQueue>,
    cache: Mutex<Cache>,
    recorders: HashMap<String, Recorder>,
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

fn lock(cache: &Mutex<Cache>) -> MutexGuard<'_, Cache> {
    // Cache updates are single map operations; a panic elsewhere cannot leave one half done.
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

fn parse<T: DeserializeOwned>(obj: &Object) -> Option<T> {
    serde_json::from_slice(&obj.data).map_err(|e| tracing::warn!("scheduler: unreadable object: {e}")).ok()
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
        registry: Registry,
        client: kube::Client,
        config: &Config,
        node_name: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let handle = plugins::Handle { registry: registry.clone() };
        let profiles = config.build(&handle).map_err(|e| anyhow::anyhow!("scheduler configuration: {e}"))?;
        let opts = QueueOptions {
            initial_backoff: config.initial_backoff,
            max_backoff: config.max_backoff,
            ..QueueOptions::default()
        };
        Self::launch(registry, client, profiles, opts, node_name, shutdown);
        Ok(())
    }

    fn launch(
        registry: Registry,
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
        let sched = Arc::new(Scheduler { registry, profiles, queue, cache: Mutex::new(Cache::default()), recorders });
        tokio::spawn(sched.clone().run(shutdown));
        sched
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut known = HashMap::new();
        // Start scheduling only once the nodes and pods that exist are loaded.
        let (sub, pods_listed_at) = self.load(&mut known);
        tracing::info!(
            "scheduler started with profile(s) {:?}: {} node(s) known",
            self.profiles.keys().collect::<Vec<_>>(),
            lock(&self.cache).node_count()
        );
        let flushes = {
            let queue = self.queue.clone();
            tokio::spawn(async move { queue.run_flushes().await })
        };
        let intake = tokio::spawn(self.clone().intake(sub, pods_listed_at, known));
        let scheduling = tokio::spawn(self.clone().scheduling_loop());
        shutdown.cancelled().await;
        self.queue.close();
        intake.abort();
        let _ = scheduling.await;
        let _ = flushes.await;
    }

    /// Lists nodes and pods into the cache and queue (again, after a watch fell behind, reconciling
    /// with what was known) and returns the watch that continues from there.
    /// Pod events up to the returned revision are already in the listing and must be skipped.
    fn load(&self, known: &mut HashMap<String, Arc<str>>) -> (Subscription, u64) {
        let store = self.registry.store();
        let (nodes, sub) = store.list_and_watch(NODES);
        let listed: std::collections::HashSet<String> =
            nodes.items.iter().filter_map(|(_, obj)| parse::<Node>(obj).map(|n| self.on_node(&n))).collect();
        let stale: Vec<String> =
            lock(&self.cache).node_names().filter(|n| !listed.contains(*n)).map(String::from).collect();
        for name in stale {
            lock(&self.cache).remove_node(&name);
        }
        let pods = store.list(PODS, None);
        let mut seen = std::collections::HashSet::new();
        for (key, obj) in &pods.items {
            if let Some(pod) = parse::<Pod>(obj) {
                let info = Arc::new(PodInfo::from_pod(&pod));
                seen.insert(info.uid.clone());
                known.insert(info.uid.clone(), Arc::from(key.as_str()));
                self.on_pod(info, true);
            }
        }
        known.retain(|uid, _| {
            let keep = seen.contains(uid);
            if !keep {
                self.pod_gone(uid);
            }
            keep
        });
        (sub, pods.revision)
    }

    /// Follows the watch; when it falls too far behind, reloads.
    async fn intake(
        self: Arc<Self>,
        mut sub: Subscription,
        mut pods_listed_at: u64,
        mut known: HashMap<String, Arc<str>>,
    ) {
        loop {
            let event = match sub.next().await {
                Ok(e) => e,
                Err(store::Error::TooOld { .. }) => {
                    tracing::info!("scheduler fell behind the watch; reloading nodes and pods");
                    (sub, pods_listed_at) = self.load(&mut known);
                    continue;
                }
                Err(e) => {
                    tracing::warn!("scheduler watch ended: {e}");
                    return;
                }
            };
            if event.key.starts_with(NODES) {
                match event.kind {
                    StoreEvent::Deleted => {
                        let name = event.key.strip_prefix(NODES).unwrap_or_default();
                        let removed = lock(&self.cache).remove_node(name);
                        if let Some(node) = removed {
                            self.queue.on_event(&ClusterEvent::NodeRemoved(node));
                        }
                    }
                    _ => {
                        if let Some(node) = parse::<Node>(&event.object) {
                            self.on_node(&node);
                        }
                    }
                }
            } else if event.key.starts_with(PODS) && event.rv > pods_listed_at {
                let Some(pod) = parse::<Pod>(&event.object) else { continue };
                let info = Arc::new(PodInfo::from_pod(&pod));
                if event.kind == StoreEvent::Deleted {
                    known.remove(&info.uid);
                    self.pod_gone(&info.uid);
                } else {
                    known.insert(info.uid.clone(), event.key.clone());
                    self.on_pod(info, event.kind == StoreEvent::Added);
                }
            }
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
            self.queue.delete(&pod.uid);
            let touched = lock(&self.cache).upsert_pod(pod.clone());
            if touched.is_some() {
                self.queue.on_event(&ClusterEvent::AssignedPodAdded { pod });
            }
        } else if pod.deleting {
            // Going away before it was placed: never scheduled.
            self.queue.delete(&pod.uid);
        } else if self.profiles.contains_key(&pod.scheduler_name) {
            if new { self.queue.add(pod) } else { self.queue.update(pod) }
        }
    }

    /// A pod was deleted or finished: it leaves the queue, and its node's resources are freed.
    fn pod_gone(&self, uid: &str) {
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
        let mut state = CycleState::default();
        let node = match algorithm::schedule_pod(&profile, &mut state, &pod, &snapshot.nodes, next_start) {
            Ok(node) => node,
            Err(failure) => return self.failed(qp, &failure),
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
        let status = match wait {
            // No plugin here can allow a waiting pod early, so a wait always runs out.
            Some((t, plugin)) => {
                tokio::time::sleep(t).await;
                Status::unschedulable(format!("rejected due to timeout after waiting {t:?} at plugin {plugin}"))
                    .with_plugin(plugin)
            }
            None => profile.run_bind(&pod, &node).await,
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
            Failure::Error(e) => Failure::Error(format!("running Bind plugin {:?}: {e}", status.plugin)),
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
        self.failed(qp, failure);
        if let Some((pod, node)) = removed {
            self.queue.on_event(&ClusterEvent::AssignedPodRemoved { pod, node });
        }
    }

    /// upstream's `handleSchedulingFailure`: back to the queue, a `FailedScheduling` event and the
    /// `PodScheduled=False` condition.
    fn failed(self: &Arc<Self>, mut qp: QueuedPod, failure: &Failure) {
        let pod = qp.pod.clone();
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
            if let Err(e) = this.set_unscheduled(&pod, reason, &message).await {
                tracing::debug!("recording why pod {} is unscheduled: {e}", pod.key());
            }
        });
    }

    fn record(&self, profile: &str, pod: &PodInfo, kind: EventType, reason: &str, action: &'static str, msg: String) {
        if let Some(r) = self.recorders.get(profile) {
            r.record(pod_ref(pod), kind, reason, action, msg);
        }
    }

    /// Sets `PodScheduled=False` with the reason, unless the pod was replaced, bound or deleted
    /// meanwhile. Writes nothing when the condition already says so.
    async fn set_unscheduled(&self, pod: &PodInfo, reason: &str, message: &str) -> Result<(), StatusError> {
        let pods = self.registry.find("", "v1", "pods").ok_or_else(|| StatusError::internal("pods are not served"))?;
        self.registry
            .modify(&pods, Some(&pod.namespace), &pod.name, Some("status"), |current| {
                let uid = current["metadata"]["uid"].as_str().unwrap_or_default();
                let bound = current["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
                if uid != pod.uid || bound {
                    let gr = crate::registry::GroupResource { group: String::new(), resource: "pods".into() };
                    return Err(StatusError::conflict(&gr, &pod.name, "the pod was replaced or bound meanwhile"));
                }
                let mut v = current.clone();
                crate::registry::kinds::pod::set_condition(
                    &mut v,
                    "PodScheduled",
                    "False",
                    Some(reason),
                    Some(message),
                );
                Ok(v)
            })
            .await
            .map(|_| ())
    }
}
