//! The node lifecycle controller (kube-controller-manager's `nodelifecycle`): it watches each node's
//! heartbeats (its Ready condition's `lastHeartbeatTime` and its Lease's `renewTime`) and, when
//! none came for `--node-monitor-grace-period` (50 s; 60 s for a node that never posted a status),
//! turns Ready, MemoryPressure, DiskPressure and PIDPressure `Unknown` ("Kubelet stopped posting
//! node status."), marks the node's pods not ready, and taints the node.
//!
//! Taints follow the conditions as upstream's: `NoSchedule` ones for Ready False/Unknown, the
//! pressure conditions, NetworkUnavailable and `spec.unschedulable` (TaintNodesByCondition), and
//! `node.kubernetes.io/not-ready` / `unreachable` `NoExecute` ones that the taint eviction
//! controller (`tainteviction.rs`) acts on. NoExecute taints are added at most one node per 10 s per
//! zone (`--node-eviction-rate` 0.1), none while most of a small zone is down, and none at all when
//! every node is down (upstream's "master disruption mode": then the server, not the nodes, is the
//! likely cause). They go as soon as the node is Ready again.
//!
//! Each node is reconciled on every change of it or its Lease and every 5 s
//! (`--node-monitor-period`); what the controller last saw of each node lives only in memory, as
//! upstream's `nodeHealthMap`: after a restart every node gets a full grace period again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, PodCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::runtime::{self, Error, Reconciler};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};

/// `--node-monitor-period`.
const MONITOR_PERIOD: Duration = Duration::from_secs(5);
/// `--node-startup-grace-period`: for a node that never posted its status.
const STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);
/// `--node-eviction-rate` and `--secondary-node-eviction-rate`: nodes tainted NoExecute per second
/// per zone, in a healthy zone and in a partly disrupted large one.
const EVICTION_QPS: f64 = 0.1;
const SECONDARY_EVICTION_QPS: f64 = 0.01;
/// `--large-cluster-size-threshold`: smaller zones stop tainting when partly disrupted.
const LARGE_CLUSTER: usize = 50;
/// `--unhealthy-zone-threshold`: the share of not-ready nodes (at least 3) that disrupts a zone.
const UNHEALTHY_ZONE: f64 = 0.55;

pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// `node.kubernetes.io/exclude-disruption`: a node left out of the zone's health.
const EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";

/// upstream's `nodeConditionToTaintKeyStatusMap`: (condition, status) → NoSchedule taint key.
const CONDITION_TAINTS: &[(&str, &str, &str)] = &[
    ("Ready", "False", NOT_READY),
    ("Ready", "Unknown", UNREACHABLE),
    ("MemoryPressure", "True", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    ("NetworkUnavailable", "True", "node.kubernetes.io/network-unavailable"),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];

/// The conditions a silent node's are turned Unknown (NetworkUnavailable is the network's).
const SILENCED: &[&str] = &["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// What was last seen of a node (upstream's `nodeHealthData`).
struct Health {
    /// When a heartbeat last arrived, by this process's clock.
    probe: Instant,
    heartbeat: Option<Time>,
    renewed: Option<Timestamp>,
}

/// A token bucket of one token (client-go's `flowcontrol` limiter with burst 1); 0 qps never fills.
struct Limiter {
    qps: f64,
    next: Instant,
}

impl Limiter {
    /// Takes the token, or says how long until there is one (`None`: never, at this rate).
    fn take(&mut self, now: Instant) -> Result<(), Option<Duration>> {
        if self.qps <= 0.0 {
            return Err(None);
        }
        if now < self.next {
            return Err(Some(self.next - now));
        }
        self.next = now + Duration::from_secs_f64(1.0 / self.qps);
        Ok(())
    }
}

#[derive(Default)]
struct State {
    health: HashMap<String, Health>,
    /// Nodes an event `RegisteredNode` was recorded for.
    known: HashSet<String>,
    limiters: HashMap<String, Limiter>,
    /// Every node of every zone is not ready: no NoExecute taints.
    disrupted: bool,
    /// Nodes whose pods could not all be marked not ready (upstream's `nodesToRetry`).
    retry: HashSet<String>,
}

pub struct NodeLifecycle {
    client: Client,
    nodes: Cache<Node>,
    leases: Cache<Lease>,
    pods: Cache<Pod>,
    recorder: Recorder,
    grace: Duration,
    state: Mutex<State>,
}

/// Starts the controller on the shared node and pod watches, with a watch of the node Leases.
pub fn spawn(
    client: &Client,
    nodes: &mut Informer<Node>,
    pods: &Informer<Pod>,
    grace: Duration,
    shutdown: &CancellationToken,
) {
    let mut leases =
        Informer::new(Api::<Lease>::namespaced(client.clone(), "kube-node-lease"), watcher::Config::default());
    let controller = Controller::for_shared_stream(nodes.subscribe(), nodes.cache())
        .watches_shared_stream(leases.subscribe(), |lease| Some(ObjectRef::new(&lease.name_any())));
    let reconciler = NodeLifecycle {
        client: client.clone(),
        nodes: nodes.cache(),
        leases: leases.cache(),
        pods: pods.cache(),
        recorder: Recorder::spawn(client.clone(), "node-controller".into(), String::new()),
        grace,
        state: Mutex::new(State::default()),
    };
    leases.spawn(shutdown.clone());
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

fn ready_status(node: &Node) -> Option<&str> {
    condition(node, "Ready").map(|c| c.status.as_str())
}

/// upstream's `GetZoneKey`: region and zone labels, the beta ones first ("" when none is set).
fn zone(node: &Node) -> String {
    let labels = node.labels();
    let label =
        |beta: &str, ga: &str| labels.get(beta).or_else(|| labels.get(ga)).map(String::as_str).unwrap_or_default();
    let region = label("failure-domain.beta.kubernetes.io/region", "topology.kubernetes.io/region");
    let zone = label("failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone");
    if region.is_empty() && zone.is_empty() { String::new() } else { format!("{region}:\u{0}:{zone}") }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// upstream's `ComputeZoneState` over the Ready statuses of a zone's nodes.
fn zone_state<'a>(ready: impl Iterator<Item = Option<&'a str>>) -> ZoneState {
    let (mut up, mut down) = (0usize, 0usize);
    for r in ready {
        if r == Some("True") { up += 1 } else { down += 1 }
    }
    if up == 0 && down > 0 {
        ZoneState::FullDisruption
    } else if down > 2 && down as f64 / (up + down) as f64 >= UNHEALTHY_ZONE {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The rate NoExecute taints are added at in a zone of `size` nodes (`setLimiterInZone`).
fn zone_qps(state: ZoneState, size: usize) -> f64 {
    match state {
        ZoneState::Normal | ZoneState::FullDisruption => EVICTION_QPS,
        ZoneState::PartialDisruption if size > LARGE_CLUSTER => SECONDARY_EVICTION_QPS,
        ZoneState::PartialDisruption => 0.0,
    }
}

/// The node's conditions after `SILENCED` turned Unknown, or `None` if nothing changes
/// (`tryUpdateNodeHealth`).
fn silenced(node: &Node, now: &Time) -> Option<Vec<NodeCondition>> {
    let mut conditions = node.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let ready_before = conditions.iter().find(|c| c.type_ == "Ready").cloned();
    for type_ in SILENCED {
        match conditions.iter_mut().find(|c| c.type_ == *type_) {
            None => conditions.push(NodeCondition {
                type_: type_.to_string(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                last_transition_time: Some(now.clone()),
            }),
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(now.clone());
            }
            Some(_) => {}
        }
    }
    let ready_after = conditions.iter().find(|c| c.type_ == "Ready").cloned();
    (ready_after != ready_before).then_some(conditions)
}

/// The NoSchedule taints the node's conditions and `spec.unschedulable` call for
/// (`doNoScheduleTaintingPass`).
fn no_schedule_taints(node: &Node) -> Vec<&'static str> {
    let mut keys: Vec<&str> = CONDITION_TAINTS
        .iter()
        .filter(|(type_, status, _)| condition(node, type_).is_some_and(|c| c.status == *status))
        .map(|(_, _, key)| *key)
        .collect();
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        keys.push(UNSCHEDULABLE);
    }
    keys
}

/// Whether the taint is one this controller keeps: a condition's or cordoning's NoSchedule one,
/// or the not-ready/unreachable NoExecute ones.
fn managed(t: &Taint) -> bool {
    match t.effect.as_str() {
        "NoSchedule" => t.key == UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key),
        "NoExecute" => t.key == NOT_READY || t.key == UNREACHABLE,
        _ => false,
    }
}

fn taint(key: &str, effect: &str, now: &Time) -> Taint {
    Taint { key: key.into(), effect: effect.into(), value: None, time_added: Some(now.clone()) }
}

/// What the NoExecute pass wants done, once the rate limit allows adding a taint.
enum NoExecute {
    Keep,
    /// The node is ready again, or every node is down: no NoExecute taint.
    Clear,
    /// This taint, in place of the other one (swapped at once when the other one is there).
    Want(&'static str),
}

fn no_execute(node: &Node, disrupted: bool) -> NoExecute {
    match ready_status(node) {
        _ if disrupted => NoExecute::Clear,
        Some("True") => NoExecute::Clear,
        Some("False") => NoExecute::Want(NOT_READY),
        Some(_) => NoExecute::Want(UNREACHABLE),
        None => NoExecute::Keep,
    }
}

impl NodeLifecycle {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refreshes what was seen of the node; true when no heartbeat came within its grace period.
    fn silent(&self, node: &Node, now: Instant) -> bool {
        let name = node.name_any();
        let ready = condition(node, "Ready");
        let heartbeat = ready.and_then(|c| c.last_heartbeat_time.clone());
        let renewed = self
            .leases
            .get(&ObjectRef::new(&name).within("kube-node-lease"))
            .and_then(|l| l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0));
        let mut state = self.state();
        let health = state.health.entry(name).or_insert_with(|| {
            // A node that never posted a status counts from its creation, others from now.
            let age = match (ready, &node.metadata.creation_timestamp) {
                (None, Some(created)) => {
                    Duration::try_from(Timestamp::now().duration_since(created.0)).unwrap_or_default()
                }
                _ => Duration::ZERO,
            };
            Health { probe: now.checked_sub(age).unwrap_or(now), heartbeat: heartbeat.clone(), renewed }
        });
        if heartbeat != health.heartbeat {
            health.heartbeat = heartbeat;
            health.probe = now;
        }
        if renewed.is_some_and(|r| health.renewed.is_none_or(|seen| seen < r)) {
            health.renewed = renewed;
            health.probe = now;
        }
        let grace = if ready.is_some() { self.grace } else { STARTUP_GRACE_PERIOD };
        now.duration_since(health.probe) > grace
    }

    /// `handleDisruption`: zone states from the cached nodes (`fresh` as this pass left it);
    /// entering or leaving the mode where every node is down. Returns whether that mode is on and
    /// the rate for `fresh`'s zone.
    fn disruption(&self, fresh: &Node, now: Instant) -> (bool, f64) {
        let nodes = self.nodes.state();
        let mut zones: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        let others = nodes.iter().map(|n| &**n).filter(|n| n.metadata.name != fresh.metadata.name);
        for n in others.chain([fresh]).filter(|n| !n.labels().contains_key(EXCLUDE_DISRUPTION)) {
            zones.entry(zone(n)).or_default().push(ready_status(n).map(str::to_string));
        }
        let states: BTreeMap<&String, (ZoneState, usize)> =
            zones.iter().map(|(z, r)| (z, (zone_state(r.iter().map(Option::as_deref)), r.len()))).collect();
        let all_down = !states.is_empty() && states.values().all(|(s, _)| *s == ZoneState::FullDisruption);
        let mut state = self.state();
        if all_down && !state.disrupted {
            tracing::warn!("node lifecycle: every node is not ready; no pods are evicted until one is back");
        } else if !all_down && state.disrupted {
            tracing::info!("node lifecycle: some nodes are ready again; pod eviction resumes");
            // Every node gets a full grace period again (upstream resets its probe timestamps).
            for h in state.health.values_mut() {
                h.probe = now;
            }
        }
        state.disrupted = all_down;
        let qps = states.get(&zone(fresh)).map_or(EVICTION_QPS, |(s, size)| zone_qps(*s, *size));
        (all_down, qps)
    }

    /// `MarkPodsNotReady`: the Ready condition of the node's pods turns False.
    async fn mark_pods_not_ready(&self, node: &str) -> Result<(), Error> {
        let now = Time(Timestamp::now());
        for pod in
            self.pods.state().iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        {
            let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
            if !conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status != "False") {
                continue;
            }
            let ready = PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                last_transition_time: Some(now.clone()),
                ..Default::default()
            };
            let patch = json!({"metadata": {"uid": pod.uid()}, "status": {"conditions": [ready]}});
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(&patch)).await {
                Ok(_) => self.recorder.record(
                    EventObject::of(&**pod),
                    EventType::Warning,
                    "NodeNotReady",
                    "NodeNotReady",
                    "Node is not ready".into(),
                ),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Reconciler for NodeLifecycle {
    type Object = Node;
    const NAME: &'static str = "node-lifecycle";

    async fn synced(&self) -> bool {
        synced(&self.leases).await && synced(&self.pods).await
    }

    async fn reconcile(&self, node: Arc<Node>) -> Result<Action, Error> {
        let name = node.name_any();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = Instant::now();
        let stamp = Time(Timestamp::now());
        {
            let mut state = self.state();
            let live: HashSet<String> = self.nodes.state().iter().map(|n| n.name_any()).collect();
            state.health.retain(|n, _| live.contains(n));
            state.known.retain(|n| live.contains(n));
            if state.known.insert(name.clone()) {
                let message = format!("Node {name} event: Registered Node {name} in Controller");
                self.recorder.record(EventObject::of(&*node), EventType::Normal, "RegisteredNode", "", message);
            }
        }
        let mut node = (*node).clone();
        // Upstream acts on the status it read (the one before its own update) for the NoExecute
        // taints: a node this pass turns Unknown is tainted on the next pass.
        let mut silenced_now = false;
        if self.silent(&node, now)
            && let Some(conditions) = silenced(&node, &stamp)
        {
            tracing::info!("node {name}: no heartbeat for {:?}; its status is now Unknown", self.grace);
            let was_ready = ready_status(&node) == Some("True");
            node.status.get_or_insert_default().conditions = Some(conditions);
            node = nodes.replace_status(&name, &PostParams::default(), &node).await?;
            silenced_now = true;
            if was_ready {
                let message = format!("Node {name} status is now: NodeNotReady");
                self.recorder.record(EventObject::of(&node), EventType::Normal, "NodeNotReady", "", message);
                self.state().retry.insert(name.clone());
            }
        }
        // The node went from Ready to Unknown here (or marking failed before): its pods are not
        // ready either.
        let retry = self.state().retry.remove(&name);
        if retry
            && ready_status(&node) != Some("True")
            && let Err(e) = self.mark_pods_not_ready(&name).await
        {
            self.state().retry.insert(name.clone());
            return Err(e);
        }

        // The taints: NoSchedule ones from the conditions, NoExecute ones rate limited.
        let existing = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let has = |key: &str, effect: &str| existing.iter().any(|t| t.key == key && t.effect == effect);
        let mut wanted: Vec<Taint> = existing.iter().filter(|t| !managed(t)).cloned().collect();
        let keep = |key: &str, effect: &str, wanted: &mut Vec<Taint>| {
            let t = existing.iter().find(|t| t.key == key && t.effect == effect).cloned();
            wanted.push(t.unwrap_or_else(|| taint(key, effect, &stamp)));
        };
        for key in no_schedule_taints(&node) {
            keep(key, "NoSchedule", &mut wanted);
        }
        let mut requeue = MONITOR_PERIOD;
        let (disrupted, qps) = self.disruption(&node, now);
        let decision = match no_execute(&node, disrupted) {
            NoExecute::Want(_) if silenced_now => NoExecute::Keep,
            other => other,
        };
        match decision {
            NoExecute::Clear => {}
            NoExecute::Keep => {
                for key in [NOT_READY, UNREACHABLE].into_iter().filter(|k| has(k, "NoExecute")) {
                    keep(key, "NoExecute", &mut wanted);
                }
            }
            NoExecute::Want(key) if has(key, "NoExecute") => keep(key, "NoExecute", &mut wanted),
            NoExecute::Want(key) => {
                let other = if key == NOT_READY { UNREACHABLE } else { NOT_READY };
                let mut state = self.state();
                let zone = zone(&node);
                let limiter = state.limiters.entry(zone).or_insert(Limiter { qps, next: now });
                // A new rate starts with an empty bucket (client-go's `SwapLimiter`).
                if limiter.qps != qps {
                    limiter.qps = qps;
                    limiter.next = if qps > 0.0 { now + Duration::from_secs_f64(1.0 / qps) } else { now };
                }
                // Swapping one NoExecute taint for the other costs nothing (upstream swaps at once).
                let allowed = if has(other, "NoExecute") { Ok(()) } else { limiter.take(now) };
                match allowed {
                    Ok(()) => {
                        tracing::info!("node {name}: tainted {key}:NoExecute");
                        wanted.push(taint(key, "NoExecute", &stamp));
                    }
                    Err(wait) => {
                        if let Some(wait) = wait {
                            requeue = requeue.min(wait);
                        }
                        if has(other, "NoExecute") {
                            keep(other, "NoExecute", &mut wanted);
                        }
                    }
                }
            }
        }
        let changed = wanted.len() != existing.len() || !wanted.iter().all(|w| existing.contains(w));
        if changed {
            let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": wanted}});
            nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(Action::requeue(requeue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn zones_are_disrupted_as_upstream_computes_it() {
        let s = |r: &[Option<&str>]| zone_state(r.iter().copied());
        assert_eq!(s(&[Some("True"), Some("Unknown")]), ZoneState::Normal);
        assert_eq!(s(&[Some("Unknown"), None]), ZoneState::FullDisruption);
        assert_eq!(s(&[Some("True"), Some("False"), Some("Unknown"), None]), ZoneState::PartialDisruption);
        assert_eq!(
            s(&[Some("True"), Some("True"), Some("False"), Some("Unknown"), None]),
            ZoneState::PartialDisruption
        );
        assert_eq!(s(&[Some("True"), Some("True"), Some("False"), Some("Unknown")]), ZoneState::Normal);
        assert_eq!(zone_qps(ZoneState::PartialDisruption, 10), 0.0);
        assert_eq!(zone_qps(ZoneState::PartialDisruption, 51), SECONDARY_EVICTION_QPS);
        assert_eq!(zone_qps(ZoneState::FullDisruption, 3), EVICTION_QPS);
    }

    #[test]
    fn a_silent_node_turns_unknown_with_upstream_reasons() {
        let now = Time(Timestamp::now());
        let n = node(json!({"metadata": {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "MemoryPressure", "status": "False"},
                {"type": "NetworkUnavailable", "status": "False"}]}}));
        let conditions = silenced(&n, &now).unwrap();
        let by = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(by("Ready").status, "Unknown");
        assert_eq!(by("Ready").reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(by("Ready").message.as_deref(), Some("Kubelet stopped posting node status."));
        assert_eq!(by("MemoryPressure").status, "Unknown");
        assert_eq!(by("NetworkUnavailable").status, "False", "the network's condition is left alone");
        assert_eq!(by("DiskPressure").reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(by("DiskPressure").message.as_deref(), Some("Kubelet never posted node status."));
        let mut again = n.clone();
        again.status.as_mut().unwrap().conditions = Some(conditions);
        assert!(silenced(&again, &now).is_none(), "already Unknown: nothing to write");
    }

    #[test]
    fn conditions_and_cordoning_make_no_schedule_taints() {
        let n = node(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}, {"type": "DiskPressure", "status": "True"},
                {"type": "MemoryPressure", "status": "False"}]}}));
        assert_eq!(no_schedule_taints(&n), [UNREACHABLE, "node.kubernetes.io/disk-pressure", UNSCHEDULABLE]);
        let t = |key: &str, effect: &str| Taint { key: key.into(), effect: effect.into(), ..Default::default() };
        assert!(managed(&t(NOT_READY, "NoExecute")) && managed(&t(UNSCHEDULABLE, "NoSchedule")));
        assert!(!managed(&t("dedicated", "NoSchedule")) && !managed(&t(UNSCHEDULABLE, "NoExecute")));
        assert!(matches!(no_execute(&n, false), NoExecute::Want(UNREACHABLE)));
        assert!(matches!(no_execute(&n, true), NoExecute::Clear));
    }

    #[test]
    fn the_limiter_lets_one_node_through_per_period() {
        let start = Instant::now();
        let mut l = Limiter { qps: 0.1, next: start };
        assert!(l.take(start).is_ok());
        assert_eq!(l.take(start + Duration::from_secs(4)), Err(Some(Duration::from_secs(6))));
        assert!(l.take(start + Duration::from_secs(10)).is_ok());
        assert_eq!(Limiter { qps: 0.0, next: start }.take(start), Err(None));
    }
}
