//! The small node-local plugins: SchedulingGates, PrioritySort, NodeUnschedulable, NodeName,
//! NodePorts and TaintToleration.

use std::sync::LazyLock;

use k8s_openapi::api::core::v1::Taint;

use super::node_hint;
use crate::scheduler::framework::{
    ClusterEvent, Code, CycleState, NodeScore, Plugin, Point, PreFilterResult, Status, default_normalize,
};
use crate::scheduler::types::{NodeInfo, PodInfo, tolerates, toleration_matches};

/// Holds pods with `spec.schedulingGates` out of the active queue.
pub struct SchedulingGates;

impl Plugin for SchedulingGates {
    fn name(&self) -> &'static str {
        "SchedulingGates"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreEnqueue]
    }

    fn pre_enqueue(&self, pod: &PodInfo) -> Status {
        if pod.scheduling_gates.is_empty() {
            return Status::success();
        }
        Status::unresolvable(format!("waiting for scheduling gates: [{}]", pod.scheduling_gates.join(" ")))
    }

    /// Only the pod's own update (gates removed) can release it; the queue re-checks on updates.
    fn requeue(&self, _pod: &PodInfo, _event: &ClusterEvent) -> bool {
        false
    }
}

/// Orders the active queue: higher `spec.priority` first, then earlier enqueue time. The queue
/// implements the ordering itself; this plugin is what configurations name.
pub struct PrioritySort;

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        "PrioritySort"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::QueueSort]
    }
}

/// Rejects cordoned nodes (`spec.unschedulable`) unless the pod tolerates their taint.
pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter]
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        // Built once: this runs for every cordoned node in every scheduling cycle.
        static TAINT: LazyLock<Taint> = LazyLock::new(|| Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        if node.node.unschedulable && !tolerates(&pod.tolerations, &TAINT) {
            return Status::unresolvable("node(s) were unschedulable");
        }
        Status::success()
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_hint(self, pod, event, false)
    }
}

/// Honours a `spec.nodeName` set before scheduling.
pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter]
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if pod.node_name.is_empty() || pod.node_name == node.name() {
            return Status::success();
        }
        Status::unresolvable("node(s) didn't match the requested node name")
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_hint(self, pod, event, false)
    }
}

/// Rejects nodes where a requested host port is already taken.
pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter]
    }

    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[std::sync::Arc<NodeInfo>],
    ) -> (Status, PreFilterResult) {
        if pod.host_ports.is_empty() {
            return (Status::skip(), None);
        }
        (Status::success(), None)
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if pod.host_ports.iter().any(|want| node.used_ports.iter().any(|used| used.conflicts(want))) {
            return Status::unschedulable("node(s) didn't have free ports for the requested pod ports");
        }
        Status::success()
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_hint(self, pod, event, true)
    }
}

/// Keeps pods off nodes with taints they do not tolerate, and prefers nodes with fewer untolerated
/// `PreferNoSchedule` taints.
pub struct TaintToleration;

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter, Point::PreScore, Point::Score]
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let untolerated = node
            .node
            .taints
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .find(|t| !tolerates(&pod.tolerations, t));
        match untolerated {
            None => Status::success(),
            Some(t) => Status::new(
                Code::UnschedulableAndUnresolvable,
                format!("node(s) had untolerated taint {{{}: {}}}", t.key, t.value.as_deref().unwrap_or_default()),
            ),
        }
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        // Only tolerations whose effect is PreferNoSchedule or empty count here.
        let prefer = || {
            pod.tolerations
                .iter()
                .filter(|t| t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "PreferNoSchedule"))
        };
        let count = node
            .node
            .taints
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule" && !prefer().any(|tol| toleration_matches(tol, t)))
            .count();
        Ok(count as i64)
    }

    fn normalize_score(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore<'_>]) -> Status {
        default_normalize(scores, true);
        Status::success()
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_hint(self, pod, event, false)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> PodInfo {
        PodInfo::from_json(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
    }

    fn node(v: serde_json::Value) -> NodeInfo {
        NodeInfo::from_json(v)
    }

    #[test]
    fn gates_hold_pods() {
        let gated = pod(json!({"containers": [], "schedulingGates": [{"name": "a"}, {"name": "b"}]}));
        let s = SchedulingGates.pre_enqueue(&gated);
        assert_eq!(s.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(s.message(), "waiting for scheduling gates: [a b]");
        assert!(SchedulingGates.pre_enqueue(&pod(json!({"containers": []}))).is_success());
    }

    #[test]
    fn cordoned_node_needs_toleration() {
        let n = node(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}}));
        let plain = pod(json!({"containers": []}));
        let s = NodeUnschedulable.filter(&CycleState::default(), &plain, &n);
        assert_eq!((s.code, s.message().as_str()), (Code::UnschedulableAndUnresolvable, "node(s) were unschedulable"));
        let tolerant = pod(json!({"containers": [], "tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(NodeUnschedulable.filter(&CycleState::default(), &tolerant, &n).is_success());
    }

    #[test]
    fn node_name_must_match() {
        let n = node(json!({"metadata": {"name": "n1"}}));
        assert!(NodeName.filter(&CycleState::default(), &pod(json!({"containers": []})), &n).is_success());
        let s = NodeName.filter(&CycleState::default(), &pod(json!({"containers": [], "nodeName": "n2"})), &n);
        assert_eq!(s.message(), "node(s) didn't match the requested node name");
    }

    #[test]
    fn host_ports_conflict() {
        let mut n = node(json!({"metadata": {"name": "n1"}}));
        let web = |ip: &str| {
            pod(
                json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]}]}),
            )
        };
        n.add_pod(Arc::new(web("10.0.0.1")));
        let state = CycleState::default();
        assert!(!NodePorts.filter(&state, &web(""), &n).is_success());
        assert!(!NodePorts.filter(&state, &web("10.0.0.1"), &n).is_success());
        assert!(NodePorts.filter(&state, &web("10.0.0.2"), &n).is_success());
        let (s, _) = NodePorts.pre_filter(&mut CycleState::default(), &pod(json!({"containers": []})), &[]);
        assert_eq!(s.code, Code::Skip);
    }

    #[test]
    fn taints_filter_and_score() {
        let n = node(json!({"metadata": {"name": "n"}, "spec": {"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"}]}}));
        let state = CycleState::default();
        let s = TaintToleration.filter(&state, &pod(json!({"containers": []})), &n);
        assert_eq!(s.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(s.message(), "node(s) had untolerated taint {dedicated: gpu}");
        let tolerant = pod(json!({"containers": [], "tolerations": [{"key": "dedicated", "value": "gpu"}]}));
        assert!(TaintToleration.filter(&state, &tolerant, &n).is_success());
        assert_eq!(TaintToleration.score(&state, &tolerant, &n), Ok(1));
        // A NoSchedule toleration does not count against PreferNoSchedule taints.
        let other = pod(json!({"containers": [], "tolerations": [{"key": "soft", "effect": "NoSchedule"}]}));
        assert_eq!(TaintToleration.score(&state, &other, &n), Ok(1));
        let soft = pod(json!({"containers": [], "tolerations": [{"key": "soft", "operator": "Exists"}]}));
        assert_eq!(TaintToleration.score(&state, &soft, &n), Ok(0));
        let mut scores = vec![NodeScore { name: "a", score: 0 }, NodeScore { name: "b", score: 2 }];
        TaintToleration.normalize_score(&state, &soft, &mut scores);
        assert_eq!(scores.iter().map(|s| s.score).collect::<Vec<_>>(), [100, 0]);
    }

    #[test]
    fn hints_rerun_the_filter_on_the_changed_node() {
        let pod = pod(json!({"containers": []}));
        let cordoned = Arc::new(node(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}})));
        let open = Arc::new(node(json!({"metadata": {"name": "n"}})));
        assert!(!NodeUnschedulable.requeue(&pod, &ClusterEvent::NodeChanged(cordoned)));
        assert!(NodeUnschedulable.requeue(&pod, &ClusterEvent::NodeChanged(open.clone())));
        let other = Arc::new(PodInfo { uid: "x".into(), ..Default::default() });
        assert!(!NodeUnschedulable.requeue(&pod, &ClusterEvent::AssignedPodRemoved { pod: other, node: open }));
    }
}
