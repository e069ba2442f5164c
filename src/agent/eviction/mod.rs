//! Node-pressure eviction, as kubelet's eviction manager (`pkg/kubelet/eviction`). With each new
//! stats sample (every 10 s) the signals are observed and held against the thresholds: a met
//! threshold sets the node condition it drives (MemoryPressure, DiskPressure, PIDPressure; held
//! for `--eviction-pressure-transition-period` after the last sighting), and once its grace period
//! has passed the node reclaims what it can itself (unused images, for the disk signals) and, if
//! that is not enough, evicts one pod, ranked as kubelet ranks them, and waits for it to stop.
//! The evicted pod ends `Failed` with reason `Evicted` and a `DisruptionTarget` condition; critical
//! pods are never evicted. While a condition holds, admission turns pods away as kubelet does.

pub mod observe;
pub mod rank;
pub mod thresholds;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Taint};
use tokio_util::sync::CancellationToken;

use crate::events::{EventType, ObjectRef, Recorder};
use crate::registry::kinds::pod_rules::binary_quantity;
pub use thresholds::{Condition, Signal, Threshold};

/// kubelet's `Reason` of an evicted pod and of a pod turned away under pressure.
pub const REASON: &str = "Evicted";
/// How long an evicted pod is waited for before the next round (kubelet's `podCleanupTimeout`).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_POLL: Duration = Duration::from_secs(1);
/// The grace period of a pod evicted for a hard threshold (`immediateEvictionGracePeriodSeconds`).
const IMMEDIATE_GRACE: i64 = 1;

/// The eviction flags.
#[derive(Clone, Debug)]
pub struct Config {
    pub thresholds: Vec<Threshold>,
    /// `--eviction-pressure-transition-period` (5m): how long a condition stays after its last sighting.
    pub pressure_transition: Duration,
    /// `--eviction-max-pod-grace-period`: the most grace a pod evicted for a soft threshold gets.
    pub max_pod_grace: i64,
    /// `--local-storage-capacity-isolation` (kubelet's `localStorageCapacityIsolation`): whether
    /// pods over their local storage limits are evicted.
    pub local_storage_isolation: bool,
}

/// Each signal's (available, capacity) now, and when it was measured.
pub type Observations = BTreeMap<Signal, Observed>;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observed {
    pub available: i128,
    pub capacity: i128,
    /// The stats reading it comes from (a threshold acts once per reading).
    pub sample: u64,
}

/// The pressure conditions the node has now: reported by the heartbeat, asked by admission.
pub struct Pressure {
    now: Mutex<BTreeSet<Condition>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure { now: Mutex::default(), changed: tokio::sync::watch::Sender::new(0) }
    }
}

impl Pressure {
    pub fn conditions(&self) -> BTreeSet<Condition> {
        self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Ticks at every change of the conditions.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Sets the conditions; returns those that appeared and those that went.
    fn set(&self, conditions: BTreeSet<Condition>) -> (Vec<Condition>, Vec<Condition>) {
        let mut now = self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let appeared = conditions.difference(&now).copied().collect();
        let went: Vec<Condition> = now.difference(&conditions).copied().collect();
        let changed = *now != conditions;
        *now = conditions;
        drop(now);
        if changed {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        (appeared, went)
    }

    /// kubelet's eviction admission: under memory pressure alone only BestEffort pods that do not
    /// tolerate it are turned away; under any other pressure every pod is; critical pods never.
    /// The rejection's reason and message.
    pub fn admit(&self, pod: &Pod) -> Option<(String, String)> {
        let conditions = self.conditions();
        if conditions.is_empty() || crate::cgroups::is_critical_pod(pod) {
            return None;
        }
        if conditions.len() == 1 && conditions.contains(&Condition::Memory) {
            let best_effort = crate::cgroups::qos_class(pod) == crate::cgroups::QosClass::BestEffort;
            let taint = Taint {
                key: "node.kubernetes.io/memory-pressure".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            };
            let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
            if !best_effort || crate::scheduling::tolerates(tolerations, &taint) {
                return None;
            }
        }
        let names: Vec<&str> = conditions.iter().map(|c| c.name()).collect();
        Some((REASON.into(), format!("The node had condition: [{}]. ", names.join(" "))))
    }
}

/// An eviction, as the pod's worker carries it out: stop within `grace` seconds, end `Failed`
/// with reason `Evicted` and `message`.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub grace: i64,
    pub message: String,
    /// Whether the pod gets the `DisruptionTarget` condition (node pressure: yes; a local storage
    /// limit: no, as kubelet).
    pub disruption: bool,
}

/// What the eviction manager needs of the node's pods.
pub trait Pods: Send + Sync {
    /// The pods that hold node resources now.
    fn active(&self) -> Vec<Pod>;
    /// Stops the pod for good, as `eviction` says.
    fn evict(&self, pod: &Pod, eviction: Eviction);
    /// Whether everything of the pod has stopped (or it is gone).
    fn stopped(&self, uid: &str) -> bool;
}

/// What a pod keeps on the node's disk, for its ephemeral-storage limits, in bytes: each
/// container's writable layer and logs, and each disk-backed emptyDir volume.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalStorage {
    pub containers: BTreeMap<String, u64>,
    pub empty_dirs: BTreeMap<String, u64>,
}

/// Where the signals come from, and what the node can reclaim itself.
pub trait Node: Send + Sync {
    /// The signals now, and each pod's use (by UID) as the newest stats reading has it.
    fn observe(&self) -> impl Future<Output = (Observations, HashMap<String, rank::Usage>)> + Send;
    /// Removes every unused image (kubelet's `DeleteUnusedImages`). Returns the bytes freed.
    fn delete_unused_images(&self) -> impl Future<Output = anyhow::Result<u64>> + Send;
    /// What `pod` keeps on disk (its containers' writable layers as `usage` measured them).
    fn local_storage(&self, pod: &Pod, usage: &rank::Usage) -> impl Future<Output = LocalStorage> + Send;
    /// How many processes the pod runs now.
    fn processes(&self, pod: &Pod) -> Option<u64>;
}

/// Whether `pod` has a local storage limit to watch: an ephemeral-storage limit on a container,
/// or a size limit on a disk-backed emptyDir.
fn has_storage_limits(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    containers.flat_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage")).next().is_some()
        || spec.volumes.iter().flatten().any(|v| {
            v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some() && e.medium.as_deref() != Some("Memory"))
        })
}

fn bytes_of(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> i128 {
    crate::registry::kinds::pod_rules::parse_quantity(&q.0).unwrap_or(0) / 1000
}

/// kubelet's `localStorageEviction` for one pod: the message when it is over one of its limits,
/// checked in kubelet's order (an emptyDir's size limit, the pod's total, a container's limit).
fn over_storage_limit(pod: &Pod, used: &LocalStorage) -> Option<String> {
    use crate::registry::kinds::pod_rules::canonical_quantity;
    let spec = pod.spec.as_ref()?;
    let canonical = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        canonical_quantity(&q.0).unwrap_or_else(|| q.0.clone())
    };
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else { continue };
        let used = used.empty_dirs.get(&v.name).copied().unwrap_or(0);
        if bytes_of(limit) > 0 && i128::from(used) > bytes_of(limit) {
            return Some(format!("Usage of EmptyDir volume {:?} exceeds the limit {:?}. ", v.name, canonical(limit)));
        }
    }
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage").cloned()
    };
    let app: Vec<i128> = spec.containers.iter().filter_map(limit).map(|q| bytes_of(&q)).collect();
    let init = spec.init_containers.iter().flatten().filter_map(limit).map(|q| bytes_of(&q)).max();
    if !app.is_empty() || init.is_some() {
        let pod_limit = app.iter().sum::<i128>().max(init.unwrap_or(0));
        let total: u64 = used.containers.values().chain(used.empty_dirs.values()).sum();
        if i128::from(total) > pod_limit {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                binary_quantity(pod_limit)
            ));
        }
    }
    for c in spec.containers.iter() {
        let Some(q) = limit(c) else { continue };
        if bytes_of(&q) > 0 && i128::from(used.containers.get(&c.name).copied().unwrap_or(0)) > bytes_of(&q) {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                c.name,
                canonical(&q)
            ));
        }
    }
    None
}

/// The eviction manager's memory between rounds.
#[derive(Default)]
struct State {
    /// Thresholds met last round past their grace period (held until their minimum reclaim).
    met: Vec<Threshold>,
    first_observed: HashMap<(Signal, bool), Instant>,
    last_observed: BTreeMap<Condition, Instant>,
    /// The reading each signal was last acted on at: a threshold acts once per reading.
    acted_on: BTreeMap<Signal, u64>,
}

/// The thresholds `observations` meet; with `reclaim`, a threshold is met until its minimum
/// reclaim is available too.
fn met(thresholds: &[Threshold], observations: &Observations, reclaim: bool) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            observations.get(&t.signal).is_some_and(|o| o.capacity > 0 && o.available < t.floor(o.capacity, reclaim))
        })
        .cloned()
        .collect()
}

/// What one round decided.
#[derive(Debug, Default, PartialEq)]
struct Round {
    conditions: BTreeSet<Condition>,
    /// The thresholds to act on now, most urgent first (memory first, as kubelet's
    /// `byEvictionPriority`).
    act: Vec<Threshold>,
}

impl State {
    /// kubelet's `synchronize` up to the choice of what to reclaim.
    fn round(&mut self, config: &Config, observations: &Observations, now: Instant) -> Round {
        let mut thresholds = met(&config.thresholds, observations, false);
        for t in met(&self.met, observations, true) {
            if !thresholds.contains(&t) {
                thresholds.push(t);
            }
        }
        let key = |t: &Threshold| (t.signal, t.hard);
        self.first_observed.retain(|k, _| thresholds.iter().any(|t| key(t) == *k));
        for t in &thresholds {
            self.first_observed.entry(key(t)).or_insert(now);
        }
        for t in &thresholds {
            self.last_observed.insert(t.signal.condition(), now);
        }
        self.last_observed.retain(|_, at| now.saturating_duration_since(*at) < config.pressure_transition);
        let conditions = self.last_observed.keys().copied().collect();
        let due: Vec<Threshold> = thresholds
            .into_iter()
            .filter(|t| {
                self.first_observed.get(&key(t)).is_some_and(|at| now.saturating_duration_since(*at) >= t.grace)
            })
            .collect();
        self.met = due.clone();
        let mut act: Vec<Threshold> = due
            .into_iter()
            .filter(|t| {
                let sample = observations.get(&t.signal).map(|o| o.sample);
                sample.is_some() && self.acted_on.get(&t.signal).copied() != sample
            })
            .collect();
        act.sort_by_key(|t| t.signal.condition() != Condition::Memory);
        Round { conditions, act }
    }

    fn acted(&mut self, signal: Signal, observations: &Observations) {
        if let Some(o) = observations.get(&signal) {
            self.acted_on.insert(signal, o.sample);
        }
    }
}

/// kubelet's `evictionMessage`: the resource, the threshold and what was available, and each
/// container using more of it than it asked for.
fn message(threshold: &Threshold, observed: Option<&Observed>, pod: &Pod, usage: Option<&rank::Usage>) -> String {
    let resource = threshold.signal.resource();
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some(o) = observed {
        let quantity = binary_quantity(threshold.value.of(o.capacity));
        message += &format!("Threshold quantity: {quantity}, available: {}. ", binary_quantity(o.available));
    }
    let (Some(usage), Some(spec)) = (usage, pod.spec.as_ref()) else { return message };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    for c in containers {
        let Some((_, memory, disk)) = usage.containers.iter().find(|(name, ..)| *name == c.name) else { continue };
        let used = match resource {
            "memory" => *memory,
            "ephemeral-storage" => *disk,
            _ => continue,
        };
        let request = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get(resource));
        let requested =
            request.and_then(|q| crate::registry::kinds::pod_rules::parse_quantity(&q.0)).unwrap_or(0) / 1000;
        if i128::from(used) > requested {
            message += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                binary_quantity(i128::from(used)),
                request.map_or("0", |q| q.0.as_str())
            );
        }
    }
    message
}

/// The pods to rank for `signal`, with their use. What is costly to measure is measured only for
/// the signal that needs it: all a pod stores for disk (kubelet's `localDiskUsage`: writable layers,
/// logs, emptyDirs), its processes for PIDs.
async fn candidates(
    pods: Vec<Pod>,
    usage: &HashMap<String, rank::Usage>,
    signal: Signal,
    node: &impl Node,
) -> Vec<rank::Candidate> {
    let mut out = Vec::with_capacity(pods.len());
    for pod in pods {
        let mut usage = pod.metadata.uid.as_ref().and_then(|uid| usage.get(uid)).cloned();
        if let Some(u) = usage.as_mut() {
            if signal.resource() == "ephemeral-storage" {
                let stored = node.local_storage(&pod, u).await;
                u.disk = stored.containers.values().chain(stored.empty_dirs.values()).sum();
                for (name, _, disk) in &mut u.containers {
                    *disk = stored.containers.get(name.as_str()).copied().unwrap_or(*disk);
                }
            }
            if signal == Signal::PidAvailable {
                u.processes = node.processes(&pod).unwrap_or(0);
            }
        }
        out.push(rank::Candidate { pod, usage });
    }
    out
}

/// The eviction manager.
pub struct Manager {
    pub config: Config,
    pub pressure: Arc<Pressure>,
    pub recorder: Recorder,
    pub node: ObjectRef,
}

impl Manager {
    /// Runs a round after each `sampled` tick, until `shutdown`.
    pub async fn run(
        self,
        node: impl Node,
        pods: Arc<dyn Pods>,
        mut sampled: tokio::sync::watch::Receiver<u64>,
        shutdown: CancellationToken,
    ) {
        if self.config.thresholds.is_empty() && !self.config.local_storage_isolation {
            return;
        }
        let mut state = State::default();
        loop {
            tokio::select! {
                changed = sampled.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
            let evicted = self.round(&mut state, &node, pods.as_ref()).await;
            if !evicted.is_empty() {
                let deadline = Instant::now() + CLEANUP_TIMEOUT;
                while !evicted.iter().all(|uid| pods.stopped(uid)) && Instant::now() < deadline {
                    tokio::select! {
                        _ = tokio::time::sleep(CLEANUP_POLL) => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
                // The next round acts on a reading taken after the pod stopped.
                sampled.borrow_and_update();
            }
        }
    }

    /// One round. Returns the UIDs of the pods evicted.
    async fn round(&self, state: &mut State, node: &impl Node, pods: &dyn Pods) -> Vec<String> {
        let (observations, usage) = node.observe().await;
        let active = pods.active();
        let round = state.round(&self.config, &observations, Instant::now());
        let (appeared, went) = self.pressure.set(round.conditions);
        for c in appeared {
            tracing::warn!("node agent: the node now has {}", c.name());
            self.node_event(EventType::Normal, transition(c, true));
        }
        for c in went {
            tracing::info!("node agent: the node no longer has {}", c.name());
            self.node_event(EventType::Normal, transition(c, false));
        }
        // Pods over their local storage limits go first, all of them at once (kubelet's
        // `localStorageEviction`); then one pod for the thresholds, if any is due.
        let over = self.storage_evictions(node, pods, &active, &usage).await;
        if !over.is_empty() {
            return over;
        }
        let Some(threshold) = round.act.first().cloned() else { return Vec::new() };
        state.acted(threshold.signal, &observations);
        self.relieve(&threshold, &observations, &usage, active, node, pods).await.into_iter().collect()
    }

    /// Relieves a threshold as kubelet does: node-level reclaim first (unused images, for the disk
    /// signals), then one pod, the first non-critical one in rank order. Returns its UID.
    async fn relieve(
        &self,
        threshold: &Threshold,
        observations: &Observations,
        usage: &HashMap<String, rank::Usage>,
        active: Vec<Pod>,
        node: &impl Node,
        pods: &dyn Pods,
    ) -> Option<String> {
        let resource = threshold.signal.resource();
        tracing::info!("eviction manager: attempting to reclaim {resource}");
        let reclaiming = format!("Attempting to reclaim {resource}");
        self.recorder.record(self.node.clone(), EventType::Warning, "EvictionThresholdMet", "", reclaiming);
        if threshold.signal.condition() == Condition::Disk {
            match node.delete_unused_images().await {
                Ok(freed) => tracing::info!("eviction manager: removed unused images, {freed} bytes"),
                Err(e) => tracing::info!("eviction manager: removing unused images: {e:#}"),
            }
            let (after, _) = node.observe().await;
            if met(&self.config.thresholds, &after, true).is_empty() {
                tracing::info!("eviction manager: able to reduce {resource} pressure without evicting pods");
                return None;
            }
        }
        if active.is_empty() {
            tracing::warn!("eviction manager: eviction thresholds have been met, but no pods are active to evict");
            return None;
        }
        let mut candidates = candidates(active, usage, threshold.signal, node).await;
        rank::rank(&mut candidates, threshold.signal);
        for c in candidates {
            let name = crate::agent::spec::full_name(&c.pod);
            if crate::cgroups::is_critical_pod(&c.pod) {
                tracing::warn!("eviction manager: cannot evict a critical pod {name}");
                continue;
            }
            let grace = if threshold.hard { IMMEDIATE_GRACE } else { self.soft_grace(&c.pod) };
            let message = message(threshold, observations.get(&threshold.signal), &c.pod, c.usage.as_ref());
            tracing::warn!("eviction manager: evicting pod {name}: {message}");
            pods.evict(&c.pod, Eviction { grace, message, disruption: true });
            return c.pod.metadata.uid;
        }
        tracing::warn!("eviction manager: unable to evict any pods from the node");
        None
    }

    /// Evicts every non-critical pod over one of its local storage limits, with a 1 s grace period
    /// and no `DisruptionTarget` condition (kubelet's `localStorageEviction`).
    async fn storage_evictions(
        &self,
        node: &impl Node,
        pods: &dyn Pods,
        active: &[Pod],
        usage: &HashMap<String, rank::Usage>,
    ) -> Vec<String> {
        let mut evicted = Vec::new();
        if !self.config.local_storage_isolation {
            return evicted;
        }
        for pod in active.iter().filter(|p| has_storage_limits(p) && !crate::cgroups::is_critical_pod(p)) {
            let Some(used) = pod.metadata.uid.as_ref().and_then(|uid| usage.get(uid)) else { continue };
            let Some(message) = over_storage_limit(pod, &node.local_storage(pod, used).await) else { continue };
            tracing::warn!("eviction manager: evicting pod {}: {message}", crate::agent::spec::full_name(pod));
            pods.evict(pod, Eviction { grace: IMMEDIATE_GRACE, message, disruption: false });
            evicted.extend(pod.metadata.uid.clone());
        }
        evicted
    }

    /// The grace period of a pod evicted for a soft threshold: the smaller of
    /// `--eviction-max-pod-grace-period` and the pod's own, the pod's own where that comes to 0
    /// (the default), at least 1 s (kubelet's `calculateEffectiveGracePeriod`).
    fn soft_grace(&self, pod: &Pod) -> i64 {
        let own = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
        let grace = own.map_or(self.config.max_pod_grace, |g| g.min(self.config.max_pod_grace));
        let grace = if grace == 0 { own.unwrap_or(30) } else { grace };
        grace.max(1)
    }

    fn node_event(&self, kind: EventType, reason: &str) {
        let message = format!("Node {} status is now: {reason}", self.node.name);
        self.recorder.record(self.node.clone(), kind, reason, "", message);
    }
}

/// The Node event of a condition's change (kubelet's status setters).
fn transition(c: Condition, now: bool) -> &'static str {
    match (c, now) {
        (Condition::Memory, true) => "NodeHasInsufficientMemory",
        (Condition::Memory, false) => "NodeHasSufficientMemory",
        (Condition::Disk, true) => "NodeHasDiskPressure",
        (Condition::Disk, false) => "NodeHasNoDiskPressure",
        (Condition::Pid, true) => "NodeHasInsufficientPID",
        (Condition::Pid, false) => "NodeHasSufficientPID",
    }
}

#[cfg(test)]
mod tests;
