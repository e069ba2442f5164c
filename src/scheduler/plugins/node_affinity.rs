//! NodeAffinity: `spec.nodeSelector`, required and preferred node affinity, plus a profile's
//! `addedAffinity`.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeAffinity as Affinity, NodeSelectorTerm, PreferredSchedulingTerm};
use serde::Deserialize;

use super::node_hint;
use crate::scheduler::framework::{
    ClusterEvent, Code, CycleState, NodeScore, Plugin, Point, PreFilterResult, Status, default_normalize,
};
use crate::scheduler::types::{NodeFacts, NodeInfo, PodInfo, node_term_matches};

pub const NAME: &str = "NodeAffinity";

/// `NodeAffinityArgs`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAffinityArgs {
    /// Affinity every pod of the profile gets on top of its own.
    pub added_affinity: Option<Affinity>,
}

pub struct NodeAffinity {
    added_required: Option<Vec<NodeSelectorTerm>>,
    added_preferred: Vec<PreferredSchedulingTerm>,
}

impl NodeAffinity {
    pub fn new(args: NodeAffinityArgs) -> Result<Self, String> {
        let added = args.added_affinity.unwrap_or_default();
        let added_required = added.required_during_scheduling_ignored_during_execution.map(|r| r.node_selector_terms);
        if added_required.as_ref().is_some_and(Vec::is_empty) {
            return Err("addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Required value: must have at least one node selector term".into());
        }
        let added_preferred = added.preferred_during_scheduling_ignored_during_execution.unwrap_or_default();
        for (i, t) in added_preferred.iter().enumerate() {
            if !(1..=100).contains(&t.weight) {
                return Err(format!(
                    "addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].weight: Invalid value: {}: must be in the range 1-100",
                    t.weight
                ));
            }
        }
        Ok(NodeAffinity { added_required, added_preferred })
    }

    fn required_terms(pod: &PodInfo) -> Option<&[NodeSelectorTerm]> {
        pod.affinity
            .as_ref()?
            .node_affinity
            .as_ref()?
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .map(|r| r.node_selector_terms.as_slice())
    }

    fn preferred_terms(pod: &PodInfo) -> &[PreferredSchedulingTerm] {
        pod.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_deref())
            .unwrap_or_default()
    }

    /// Whether the pod's nodeSelector and required terms (ORed) admit `node`.
    fn pod_matches(pod: &PodInfo, node: &NodeFacts) -> bool {
        pod.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
            && Self::required_terms(pod).is_none_or(|terms| terms.iter().any(|t| node_term_matches(t, node)))
    }
}

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter, Point::PreScore, Point::Score]
    }

    /// Skips pods without node constraints; narrows the search to named nodes when every required
    /// term names nodes (`matchFields` on `metadata.name`).
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
    ) -> (Status, PreFilterResult) {
        let required = Self::required_terms(pod);
        if required.is_none() && self.added_required.is_none() && pod.node_selector.is_empty() {
            return (Status::skip(), None);
        }
        let Some(terms) = required.filter(|t| !t.is_empty()) else { return (Status::success(), None) };
        let mut names = BTreeSet::new();
        for t in terms {
            let mut term_names: Option<BTreeSet<String>> = None;
            for r in t.match_fields.iter().flatten().filter(|r| r.key == "metadata.name" && r.operator == "In") {
                let set: BTreeSet<String> = r.values.iter().flatten().cloned().collect();
                term_names = Some(match term_names {
                    None => set,
                    Some(prev) => prev.intersection(&set).cloned().collect(),
                });
            }
            // A term without a node name admits every node: the terms are ORed.
            let Some(term_names) = term_names else { return (Status::success(), None) };
            names.extend(term_names);
        }
        if names.is_empty() {
            return (Status::unresolvable("pod affinity terms conflict"), None);
        }
        (Status::success(), Some(names))
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if let Some(terms) = &self.added_required
            && !terms.iter().any(|t| node_term_matches(t, &node.node))
        {
            return Status::new(
                Code::UnschedulableAndUnresolvable,
                "node(s) didn't match scheduler-enforced node affinity",
            );
        }
        if !Self::pod_matches(pod, &node.node) {
            return Status::unresolvable("node(s) didn't match Pod's node affinity/selector");
        }
        Status::success()
    }

    fn pre_score(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _all: &[Arc<NodeInfo>],
    ) -> Status {
        if Self::preferred_terms(pod).is_empty() && self.added_preferred.is_empty() {
            return Status::skip();
        }
        Status::success()
    }

    /// The sum of the weights of the preferred terms the node matches.
    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        Ok(Self::preferred_terms(pod)
            .iter()
            .chain(&self.added_preferred)
            .filter(|t| node_term_matches(&t.preference, &node.node))
            .map(|t| i64::from(t.weight))
            .sum())
    }

    fn normalize_score(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore<'_>]) -> Status {
        default_normalize(scores, false);
        Status::success()
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        node_hint(self, pod, event, false)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> PodInfo {
        PodInfo::from_json(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
    }

    fn node(name: &str, labels: serde_json::Value) -> NodeInfo {
        NodeInfo::from_json(json!({"metadata": {"name": name, "labels": labels}}))
    }

    fn plugin() -> NodeAffinity {
        NodeAffinity::new(NodeAffinityArgs::default()).unwrap()
    }

    #[test]
    fn node_selector_and_required_terms() {
        let ssd = node("a", json!({"storage": "ssd", "zone": "z1"}));
        let hdd = node("b", json!({"storage": "hdd", "zone": "z2"}));
        let state = CycleState::default();
        let p = pod(json!({"containers": [], "nodeSelector": {"storage": "ssd"}}));
        assert!(plugin().filter(&state, &p, &ssd).is_success());
        let s = plugin().filter(&state, &p, &hdd);
        assert_eq!(s.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(s.message(), "node(s) didn't match Pod's node affinity/selector");

        // Terms are ORed; expressions within a term are ANDed.
        let p = pod(
            json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]},
                                      {"key": "storage", "operator": "NotIn", "values": ["ssd"]}]}]}}}}),
        );
        assert!(!plugin().filter(&state, &p, &ssd).is_success());
        assert!(plugin().filter(&state, &p, &hdd).is_success());
    }

    #[test]
    fn pre_filter_skips_or_narrows() {
        let (s, _) = plugin().pre_filter(&mut CycleState::default(), &pod(json!({"containers": []})), &[]);
        assert_eq!(s.code, Code::Skip);
        let p = pod(
            json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]}}}}),
        );
        let (s, names) = plugin().pre_filter(&mut CycleState::default(), &p, &[]);
        assert!(s.is_success());
        assert_eq!(names.unwrap().into_iter().collect::<Vec<_>>(), ["n1", "n2"]);
    }

    #[test]
    fn preferred_terms_sum_weights_then_normalize() {
        let p = pod(
            json!({"containers": [], "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}},
            {"weight": 30, "preference": {"matchExpressions": [{"key": "storage", "operator": "Exists"}]}}]}}}),
        );
        let state = CycleState::default();
        let nodes = [
            node("a", json!({"zone": "z1", "storage": "ssd"})),
            node("b", json!({"storage": "hdd"})),
            node("c", json!({})),
        ];
        let raw: Vec<i64> = nodes.iter().map(|n| plugin().score(&state, &p, n).unwrap()).collect();
        assert_eq!(raw, [50, 30, 0]);
        let mut scores: Vec<NodeScore> =
            raw.iter().zip(&nodes).map(|(s, n)| NodeScore { name: n.name(), score: *s }).collect();
        plugin().normalize_score(&state, &p, &mut scores);
        assert_eq!(scores.iter().map(|s| s.score).collect::<Vec<_>>(), [100, 60, 0]);
    }

    #[test]
    fn added_affinity_is_enforced() {
        let args: NodeAffinityArgs =
            serde_json::from_value(json!({"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "edge", "operator": "Exists"}]}]}}}))
            .unwrap();
        let pl = NodeAffinity::new(args).unwrap();
        let s = pl.filter(&CycleState::default(), &pod(json!({"containers": []})), &node("a", json!({})));
        assert_eq!(s.message(), "node(s) didn't match scheduler-enforced node affinity");
        assert!(
            pl.filter(&CycleState::default(), &pod(json!({"containers": []})), &node("a", json!({"edge": ""})))
                .is_success()
        );
    }
}
