//! PodTopologySpread: `whenUnsatisfiable: DoNotSchedule` constraints as a filter and
//! `ScheduleAnyway` constraints as a score, after upstream's
//! `pkg/scheduler/framework/plugins/podtopologyspread` (common.go, filtering.go, scoring.go, plugin.go).
//!
//! Only a pod's own `topologySpreadConstraints` apply. Upstream gives pods without constraints
//! default ones (system defaults, or `defaultConstraints` with `defaultingType: List`) whose selector
//! is derived from the Services, ReplicationControllers, ReplicaSets and StatefulSets that select
//! the pod; this cluster serves none of those, so that selector is always empty and upstream then
//! drops the default constraints. Default constraints are therefore validated but never applied.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::{Deserialize, Serialize};

use crate::scheduler::framework::{
    ClusterEvent, CycleState, MAX_NODE_SCORE, NodeScore, Plugin, Point, PreFilterResult, Status,
};
use crate::scheduler::types::{
    Labels, NodeFacts, NodeInfo, PodInfo, label_selector_matches, node_term_matches, tolerates,
};

/// The plugin's name in profiles and statuses.
pub const NAME: &str = "PodTopologySpread";

/// Placing the pod on the node would exceed a constraint's `maxSkew`.
pub const ERR_REASON_CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
/// The node lacks a constraint's topology key.
pub const ERR_REASON_NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const PRE_FILTER_KEY: &str = "PreFilterPodTopologySpread";
const PRE_SCORE_KEY: &str = "PreScorePodTopologySpread";
const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const DO_NOT_SCHEDULE: &str = "DoNotSchedule";
const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";

/// `PodTopologySpreadArgs` of `KubeSchedulerConfiguration`.
///
/// Default constraints only ever apply with a selector derived from the workloads that own the
/// pod, which this cluster does not serve, so they are validated but have no effect.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodTopologySpreadArgs {
    /// Constraints for pods without their own (`defaultingType: List` only).
    pub default_constraints: Vec<TopologySpreadConstraint>,
    /// `System` (upstream's built-in defaults) or `List` (`defaultConstraints`).
    pub defaulting_type: String,
}

impl Default for PodTopologySpreadArgs {
    fn default() -> Self {
        PodTopologySpreadArgs { default_constraints: Vec::new(), defaulting_type: "System".into() }
    }
}

/// The PodTopologySpread plugin.
#[derive(Debug)]
pub struct PodTopologySpread;

impl PodTopologySpread {
    /// Validates `args` as upstream's `ValidatePodTopologySpreadArgs` (topology keys are only
    /// checked for being non-empty).
    pub fn new(args: PodTopologySpreadArgs) -> Result<Self, String> {
        let mut errs = Vec::new();
        match args.defaulting_type.as_str() {
            "List" => {}
            "System" if args.default_constraints.is_empty() => {}
            "System" => {
                errs.push(r#"defaultingType: Invalid value: "System": when .defaultConstraints are not empty"#.into())
            }
            other => errs
                .push(format!(r#"defaultingType: Unsupported value: "{other}": supported values: "List", "System""#)),
        }
        for (i, c) in args.default_constraints.iter().enumerate() {
            let p = format!("defaultConstraints[{i}]");
            if c.max_skew <= 0 {
                errs.push(format!("{p}.maxSkew: Invalid value: {}: not in valid range (0, inf)", c.max_skew));
            }
            if c.topology_key.is_empty() {
                errs.push(format!("{p}.topologyKey: Required value: can not be empty"));
            }
            match c.when_unsatisfiable.as_str() {
                DO_NOT_SCHEDULE | SCHEDULE_ANYWAY => {}
                "" => errs.push(format!("{p}.whenUnsatisfiable: Required value: can not be empty")),
                other => errs.push(format!(
                    r#"{p}.whenUnsatisfiable: Unsupported value: "{other}": supported values: "DoNotSchedule", "ScheduleAnyway""#
                )),
            }
            if c.label_selector.is_some() {
                errs.push(format!(
                    "{p}.labelSelector: Forbidden: constraint must not define a selector, as they deduced for each pod"
                ));
            }
            let repeated = args.default_constraints[..i]
                .iter()
                .any(|o| o.topology_key == c.topology_key && o.when_unsatisfiable == c.when_unsatisfiable);
            if repeated {
                errs.push(format!(r#"{p}: Duplicate value: "{{{}, {}}}""#, c.topology_key, c.when_unsatisfiable));
            }
        }
        match errs.len() {
            0 => Ok(PodTopologySpread),
            1 => Err(errs.remove(0)),
            _ => Err(format!("[{}]", errs.join(", "))),
        }
    }
}

/// A spread constraint with defaults applied and `matchLabelKeys` merged into its selector.
#[derive(Clone, Debug)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    /// `None` selects nothing.
    selector: Option<LabelSelector>,
    min_domains: usize,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node selector and required
    /// node affinity admit count.
    honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default Ignore): nodes with untolerated NoSchedule/NoExecute
    /// taints don't count.
    honor_taints: bool,
}

impl Constraint {
    /// Whether `node` counts towards this constraint's domains for `pod`.
    fn includes(&self, pod: &PodInfo, node: &NodeFacts) -> bool {
        (!self.honor_node_affinity || matches_required_node_affinity(pod, node))
            && (!self.honor_taints || tolerates_hard_taints(pod, node))
    }

    fn selects(&self, labels: &Labels) -> bool {
        label_selector_matches(self.selector.as_ref(), labels)
    }

    /// Live pods in `namespace` on the node that the selector matches; none for an empty selector,
    /// as upstream's `countPodsMatchSelector`.
    fn count_matching(&self, node: &NodeInfo, namespace: &str) -> i64 {
        let Some(sel) = self.selector.as_ref() else { return 0 };
        if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
        {
            return 0;
        }
        let matching = node
            .pods
            .iter()
            .filter(|p| !p.deleting && !p.finished && p.namespace == namespace && self.selects(&p.labels));
        matching.count() as i64
    }
}

/// The pod's constraints with `whenUnsatisfiable == action`.
fn constraints(pod: &PodInfo, action: &str) -> Vec<Constraint> {
    pod.topology_spread_constraints
        .iter()
        .filter(|c| c.when_unsatisfiable == action)
        .map(|c| {
            let mut selector = c.label_selector.clone();
            // `key In (pod's value)` for each matchLabelKeys key the pod has; a nil selector stays
            // nil, as upstream's mergeLabelSetWithSelector. Repeating a requirement the API server
            // already merged changes nothing.
            if let Some(sel) = selector.as_mut() {
                let extra = c.match_label_keys.iter().flatten().filter_map(|k| {
                    let v = pod.labels.get(k)?;
                    Some(LabelSelectorRequirement {
                        key: k.clone(),
                        operator: "In".into(),
                        values: Some(vec![v.clone()]),
                    })
                });
                let extra: Vec<_> = extra.collect();
                if !extra.is_empty() {
                    sel.match_expressions.get_or_insert_default().extend(extra);
                }
            }
            Constraint {
                max_skew: c.max_skew.into(),
                topology_key: c.topology_key.clone(),
                selector,
                min_domains: c.min_domains.map_or(1, |m| usize::try_from(m).unwrap_or(0)),
                honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            }
        })
        .collect()
}

/// Upstream's `nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)`: the node selector and the
/// required node affinity terms (any of them).
fn matches_required_node_affinity(pod: &PodInfo, node: &NodeFacts) -> bool {
    let required = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    pod.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
        && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| node_term_matches(t, node)))
}

/// Whether the pod tolerates every NoSchedule and NoExecute taint of the node.
fn tolerates_hard_taints(pod: &PodInfo, node: &NodeFacts) -> bool {
    node.taints
        .iter()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .all(|t| tolerates(&pod.tolerations, t))
}

fn has_all_keys(node: &NodeFacts, constraints: &[Constraint]) -> bool {
    constraints.iter().all(|c| node.labels.contains_key(&c.topology_key))
}

/// Matching pods per domain of each DoNotSchedule constraint, from PreFilter for Filter.
struct PreFilterState {
    constraints: Vec<Constraint>,
    /// Per constraint: topology value → matching pods, for every eligible domain.
    counts: Vec<HashMap<String, i64>>,
    /// Per constraint: the smallest count over its domains (0 when there are none).
    min_counts: Vec<i64>,
}

/// What Score and NormalizeScore need for the ScheduleAnyway constraints.
struct PreScoreState {
    constraints: Vec<Constraint>,
    /// Feasible nodes missing a topology key: scored 0.
    ignored: HashSet<String>,
    /// Per constraint: topology value (of a feasible node) → matching pods; empty for hostname.
    counts: Vec<HashMap<String, i64>>,
    /// Per constraint: `ln(domains + 2)`.
    weights: Vec<f64>,
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter, Point::PreScore, Point::Score]
    }

    /// Counts matching pods per domain over the nodes that have every topology key and pass the
    /// constraint's node inclusion policies (upstream's `calPreFilterState`).
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> (Status, PreFilterResult) {
        let constraints = constraints(pod, DO_NOT_SCHEDULE);
        if constraints.is_empty() {
            return (Status::skip(), None);
        }
        let mut counts = vec![HashMap::<String, i64>::new(); constraints.len()];
        for node in nodes.iter().filter(|n| has_all_keys(&n.node, &constraints)) {
            for (c, domains) in constraints.iter().zip(counts.iter_mut()) {
                if !c.includes(pod, &node.node) {
                    continue;
                }
                let value = &node.node.labels[&c.topology_key];
                *domains.entry(value.clone()).or_insert(0) += c.count_matching(node, &pod.namespace);
            }
        }
        let min_counts = counts.iter().map(|d| d.values().copied().min().unwrap_or(0)).collect();
        state.write(PRE_FILTER_KEY, PreFilterState { constraints, counts, min_counts });
        (Status::success(), None)
    }

    /// `matching pods in the node's domain + (1 if the pod matches itself) − global minimum` must
    /// not exceed `maxSkew`; the minimum is 0 while there are fewer domains than `minDomains`.
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_KEY) else {
            return Status::error(format!("reading {PRE_FILTER_KEY:?} from cycleState: not found"));
        };
        for ((c, domains), min) in s.constraints.iter().zip(&s.counts).zip(&s.min_counts) {
            let Some(value) = node.node.labels.get(&c.topology_key) else {
                return Status::unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH);
            };
            let min = if domains.len() < c.min_domains { 0 } else { *min };
            let self_match = i64::from(c.selects(&pod.labels));
            let matching = domains.get(value).copied().unwrap_or(0);
            if matching + self_match - min > c.max_skew {
                return Status::unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH);
            }
        }
        Status::success()
    }

    /// Domains come from the feasible nodes that have every topology key (the others are ignored);
    /// their pod counts from every node of the snapshot that passes the inclusion policies.
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        all_nodes: &[Arc<NodeInfo>],
    ) -> Status {
        if all_nodes.is_empty() {
            return Status::skip();
        }
        let constraints = constraints(pod, SCHEDULE_ANYWAY);
        if constraints.is_empty() {
            return Status::skip();
        }
        let mut ignored = HashSet::new();
        let mut counts = vec![HashMap::<String, i64>::new(); constraints.len()];
        for node in nodes {
            if !has_all_keys(&node.node, &constraints) {
                ignored.insert(node.name().to_string());
                continue;
            }
            for (c, domains) in constraints.iter().zip(counts.iter_mut()) {
                // Hostname domains are counted per node during Score.
                if c.topology_key != LABEL_HOSTNAME {
                    domains.entry(node.node.labels[&c.topology_key].clone()).or_insert(0);
                }
            }
        }
        let weights = constraints
            .iter()
            .zip(&counts)
            .map(|(c, domains)| {
                let size = if c.topology_key == LABEL_HOSTNAME { nodes.len() - ignored.len() } else { domains.len() };
                ((size + 2) as f64).ln()
            })
            .collect();
        for node in all_nodes.iter().filter(|n| has_all_keys(&n.node, &constraints)) {
            for (c, domains) in constraints.iter().zip(counts.iter_mut()) {
                if !c.includes(pod, &node.node) {
                    continue;
                }
                if let Some(n) = domains.get_mut(&node.node.labels[&c.topology_key]) {
                    *n += c.count_matching(node, &pod.namespace);
                }
            }
        }
        state.write(PRE_SCORE_KEY, PreScoreState { constraints, ignored, counts, weights });
        Status::success()
    }

    /// `round(Σ count·weight + maxSkew − 1)` over the constraints; 0 for ignored nodes.
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_KEY) else {
            return Err(Status::error(format!("reading {PRE_SCORE_KEY:?} from cycleState: not found")));
        };
        if s.ignored.contains(node.name()) {
            return Ok(0);
        }
        let mut score = 0.0;
        for ((c, domains), weight) in s.constraints.iter().zip(&s.counts).zip(&s.weights) {
            let Some(value) = node.node.labels.get(&c.topology_key) else { continue };
            let count = if c.topology_key == LABEL_HOSTNAME {
                c.count_matching(node, &pod.namespace)
            } else {
                domains.get(value).copied().unwrap_or(0)
            };
            score += count as f64 * weight + (c.max_skew - 1) as f64;
        }
        Ok(score.round() as i64)
    }

    /// Fewer matching pods score higher: `100·(max + min − s)/max`, all 100 when `max` is 0;
    /// ignored nodes get 0.
    fn normalize_score(&self, state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore<'_>]) -> Status {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_KEY) else {
            return Status::error(format!("reading {PRE_SCORE_KEY:?} from cycleState: not found"));
        };
        let counted = || scores.iter().filter(|n| !s.ignored.contains(n.name)).map(|n| n.score);
        let min = counted().min().unwrap_or(i64::MAX);
        let max = counted().max().unwrap_or(0).max(0);
        for n in scores.iter_mut() {
            n.score = if s.ignored.contains(n.name) {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - n.score) / max
            };
        }
        Status::success()
    }

    /// Pod events in the pod's namespace (a changed pod may have left a selector), removals only
    /// when the removed pod was counted; new nodes with every topology key; any node change.
    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        let constraints = constraints(pod, DO_NOT_SCHEDULE);
        match event {
            // Only nodes in the constraints' domains count toward skew.
            ClusterEvent::NodeAdded(node) | ClusterEvent::NodeRemoved(node) => has_all_keys(&node.node, &constraints),
            ClusterEvent::NodeChanged(_) => true,
            ClusterEvent::StorageChanged => false,
            ClusterEvent::AssignedPodAdded { pod: p, .. } => p.namespace == pod.namespace,
            ClusterEvent::AssignedPodRemoved { pod: p, .. } => {
                p.namespace == pod.namespace && constraints.iter().any(|c| c.selects(&p.labels))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value, taints: Value) -> NodeInfo {
        let n = json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}});
        NodeInfo::from_json(n)
    }

    fn pod_with(name: &str, labels: Value, spec: Value) -> PodInfo {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels},
            "spec": {"containers": [{"name": "c"}]},
        });
        if let (Some(dst), Value::Object(extra)) = (p["spec"].as_object_mut(), spec) {
            dst.extend(extra);
        }
        PodInfo::from_json(p)
    }

    fn web(name: &str) -> PodInfo {
        pod_with(name, json!({"app": "web"}), json!({}))
    }

    /// Adds `n` pods like `template` to the node.
    fn place(node: &mut NodeInfo, n: usize, template: &PodInfo) {
        for i in 0..n {
            let name = format!("{}-{}-{i}", template.name, node.name());
            let p = PodInfo { uid: name.clone(), name, ..template.on_node(node.name()) };
            node.add_pod(Arc::new(p));
        }
    }

    fn constraint(key: &str, max_skew: i32, when: &str, extra: Value) -> Value {
        let mut c = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "web"}}});
        if let (Some(dst), Value::Object(extra)) = (c.as_object_mut(), extra) {
            dst.extend(extra);
        }
        c
    }

    fn incoming(constraints: Value, spec: Value) -> PodInfo {
        let mut spec = spec;
        spec["topologySpreadConstraints"] = constraints;
        pod_with("new", json!({"app": "web", "pod-template-hash": "v2"}), spec)
    }

    fn arcs(nodes: Vec<NodeInfo>) -> Vec<Arc<NodeInfo>> {
        nodes.into_iter().map(Arc::new).collect()
    }

    /// Filter outcome per node: `None` passes, else the code (after PreFilter over all nodes).
    fn filter(pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> Vec<Option<Code>> {
        let pl = PodTopologySpread::new(PodTopologySpreadArgs::default()).unwrap();
        let mut state = CycleState::default();
        let (s, _) = pl.pre_filter(&mut state, pod, nodes);
        if s.code == Code::Skip {
            return vec![None; nodes.len()];
        }
        assert!(s.is_success(), "{s}");
        nodes
            .iter()
            .map(|n| {
                let s = pl.filter(&state, pod, n);
                if !s.is_success() {
                    let want = match s.code {
                        Code::Unschedulable => ERR_REASON_CONSTRAINTS_NOT_MATCH,
                        _ => ERR_REASON_NODE_LABEL_NOT_MATCH,
                    };
                    assert_eq!(s.message(), want);
                }
                (!s.is_success()).then_some(s.code)
            })
            .collect()
    }

    const SKEW: Option<Code> = Some(Code::Unschedulable);
    const LABEL: Option<Code> = Some(Code::UnschedulableAndUnresolvable);

    /// n1, n2 in zone a (2 + 1 web pods), n3 in zone b (1), n4 in zone c (0), n5 without a zone.
    fn cluster() -> Vec<NodeInfo> {
        let mut nodes = vec![
            node("n1", json!({"zone": "a", "disk": "ssd"}), Value::Null),
            node("n2", json!({"zone": "a", "disk": "ssd"}), Value::Null),
            node("n3", json!({"zone": "b", "disk": "ssd"}), Value::Null),
            node("n4", json!({"zone": "c"}), json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])),
            node("n5", json!({}), Value::Null),
        ];
        place(&mut nodes[0], 2, &web("web"));
        place(&mut nodes[1], 1, &web("web"));
        place(&mut nodes[2], 1, &web("web"));
        // None of these count: terminating, other namespace, other labels.
        let mut gone = web("gone");
        gone.deleting = true;
        place(&mut nodes[3], 3, &gone);
        place(&mut nodes[3], 3, &PodInfo { namespace: "other".into(), ..web("foreign") });
        place(&mut nodes[3], 3, &pod_with("db", json!({"app": "db"}), json!({})));
        nodes
    }

    #[test]
    fn hard_spread_over_zones() {
        let nodes = arcs(cluster());
        // Zones a=3, b=1, c=0: min 0; placing adds 1 to the chosen zone.
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({}))]), json!({}));
        assert_eq!(filter(&pod, &nodes), [SKEW, SKEW, SKEW, None, LABEL]);
        let pod = incoming(json!([constraint("zone", 2, DO_NOT_SCHEDULE, json!({}))]), json!({}));
        assert_eq!(filter(&pod, &nodes), [SKEW, SKEW, None, None, LABEL]);
        // Selecting the db pods instead (a=0, b=0, c=3) and not the pod itself: only zone c, at
        // 3 + 0 − 0, is too far ahead.
        let other = constraint("zone", 1, DO_NOT_SCHEDULE, json!({"labelSelector": {"matchLabels": {"app": "db"}}}));
        assert_eq!(filter(&incoming(json!([other]), json!({})), &nodes), [None, None, None, SKEW, LABEL]);
    }

    #[test]
    fn node_inclusion_policies() {
        let nodes = arcs(cluster());
        let ssd = json!({"nodeSelector": {"disk": "ssd"}});
        // n4 fails the node selector, so zone c is not a domain: min is b's 1.
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({}))]), ssd.clone());
        assert_eq!(filter(&pod, &nodes), [SKEW, SKEW, None, None, LABEL]);
        // nodeAffinityPolicy: Ignore counts zone c again.
        let ignore = constraint("zone", 1, DO_NOT_SCHEDULE, json!({"nodeAffinityPolicy": "Ignore"}));
        assert_eq!(filter(&incoming(json!([ignore]), ssd), &nodes), [SKEW, SKEW, SKEW, None, LABEL]);
        // nodeTaintsPolicy: Honor drops n4 for its untolerated taint …
        let honor = constraint("zone", 1, DO_NOT_SCHEDULE, json!({"nodeTaintsPolicy": "Honor"}));
        assert_eq!(filter(&incoming(json!([honor.clone()]), json!({})), &nodes), [SKEW, SKEW, None, None, LABEL]);
        // … unless the pod tolerates it.
        let tolerations = json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]});
        assert_eq!(filter(&incoming(json!([honor]), tolerations), &nodes), [SKEW, SKEW, SKEW, None, LABEL]);
    }

    #[test]
    fn min_domains_treats_the_minimum_as_zero() {
        let mut nodes =
            vec![node("n1", json!({"zone": "a"}), Value::Null), node("n2", json!({"zone": "b"}), Value::Null)];
        place(&mut nodes[0], 2, &web("web"));
        place(&mut nodes[1], 2, &web("web"));
        let nodes = arcs(nodes);
        // Two domains with 2 each: 2 + 1 − 2 = 1 ≤ 1.
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({"minDomains": 2}))]), json!({}));
        assert_eq!(filter(&pod, &nodes), [None, None]);
        // Fewer domains than minDomains: 2 + 1 − 0 > 1.
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({"minDomains": 3}))]), json!({}));
        assert_eq!(filter(&pod, &nodes), [SKEW, SKEW]);
    }

    #[test]
    fn match_label_keys_narrow_the_selector() {
        let mut nodes =
            vec![node("n1", json!({"zone": "a"}), Value::Null), node("n2", json!({"zone": "b"}), Value::Null)];
        place(&mut nodes[0], 2, &pod_with("old", json!({"app": "web", "pod-template-hash": "v1"}), json!({})));
        let nodes = arcs(nodes);
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({}))]), json!({}));
        assert_eq!(filter(&pod, &nodes), [SKEW, None]);
        // Only pods of the same revision (v2) count now.
        let keys = constraint("zone", 1, DO_NOT_SCHEDULE, json!({"matchLabelKeys": ["pod-template-hash", "absent"]}));
        assert_eq!(filter(&incoming(json!([keys]), json!({})), &nodes), [None, None]);
    }

    #[test]
    fn no_constraints_skip() {
        let pl = PodTopologySpread::new(PodTopologySpreadArgs::default()).unwrap();
        let nodes = arcs(cluster());
        let mut state = CycleState::default();
        assert_eq!(pl.pre_filter(&mut state, &web("w"), &nodes).0.code, Code::Skip);
        assert_eq!(pl.pre_score(&mut state, &web("w"), &nodes, &nodes).code, Code::Skip);
        // Soft constraints only: nothing to filter.
        let soft = incoming(json!([constraint("zone", 1, SCHEDULE_ANYWAY, json!({}))]), json!({}));
        assert_eq!(pl.pre_filter(&mut state, &soft, &nodes).0.code, Code::Skip);
    }

    /// Raw and normalized scores of the `feasible` nodes.
    fn scores(pod: &PodInfo, all: &[Arc<NodeInfo>], feasible: &[Arc<NodeInfo>]) -> (Vec<i64>, Vec<i64>) {
        let pl = PodTopologySpread::new(PodTopologySpreadArgs::default()).unwrap();
        let mut state = CycleState::default();
        pl.pre_filter(&mut state, pod, all);
        assert!(pl.pre_score(&mut state, pod, feasible, all).is_success());
        let mut list: Vec<_> =
            feasible.iter().map(|n| NodeScore { name: n.name(), score: pl.score(&state, pod, n).unwrap() }).collect();
        let raw = list.iter().map(|s| s.score).collect();
        assert!(pl.normalize_score(&state, pod, &mut list).is_success());
        (raw, list.iter().map(|s| s.score).collect())
    }

    #[test]
    fn soft_spread_scores() {
        let host = |n: &str, zone: Option<&str>| {
            let mut labels = json!({"kubernetes.io/hostname": n});
            if let Some(z) = zone {
                labels["zone"] = json!(z);
            }
            node(n, labels, Value::Null)
        };
        let mut nodes = vec![host("n1", Some("a")), host("n2", Some("a")), host("n3", Some("b")), host("n4", None)];
        nodes.push(host("n5", Some("c")));
        place(&mut nodes[0], 2, &web("web"));
        place(&mut nodes[1], 1, &web("web"));
        place(&mut nodes[3], 5, &web("web"));
        place(&mut nodes[4], 4, &web("web"));
        let nodes = arcs(nodes);
        let pod = incoming(
            json!([
                constraint("zone", 1, SCHEDULE_ANYWAY, json!({})),
                constraint("kubernetes.io/hostname", 2, SCHEDULE_ANYWAY, json!({}))
            ]),
            json!({}),
        );
        // n5 is infeasible (zone c is no domain); n4 lacks a zone and is ignored.
        // Zone: domains {a, b}, w = ln 4 ≈ 1.386, a = 3, b = 0.
        // Hostname: 3 scored nodes, w = ln 5 ≈ 1.609, plus maxSkew − 1 = 1.
        // n1: 3·1.386 + 2·1.609 + 1 ≈ 8.38 → 8; n2: 4.159 + 1.609 + 1 ≈ 6.77 → 7; n3: 0 + 0 + 1 = 1.
        // Normalized 100·(8 + 1 − s)/8: 12, 25, 100; ignored n4: 0.
        assert_eq!(scores(&pod, &nodes, &nodes[..4]), (vec![8, 7, 1, 0], vec![12, 25, 100, 0]));

        // No matching pods at all: every scored node gets 100.
        let nodes = arcs(vec![host("n1", Some("a")), host("n2", Some("b"))]);
        let pod = incoming(json!([constraint("zone", 1, SCHEDULE_ANYWAY, json!({}))]), json!({}));
        assert_eq!(scores(&pod, &nodes, &nodes), (vec![0, 0], vec![100, 100]));
    }

    #[test]
    fn soft_spread_counts_only_included_nodes() {
        let mut nodes = vec![
            node("n1", json!({"zone": "a", "disk": "ssd"}), Value::Null),
            node("n2", json!({"zone": "b", "disk": "ssd"}), Value::Null),
            node("n3", json!({"zone": "b"}), Value::Null),
        ];
        place(&mut nodes[0], 1, &web("web"));
        place(&mut nodes[2], 6, &web("web"));
        let nodes = arcs(nodes);
        let pod = incoming(
            json!([constraint("zone", 3, SCHEDULE_ANYWAY, json!({}))]),
            json!({"nodeSelector": {"disk": "ssd"}}),
        );
        // n3 fails the node selector: its pods don't count for zone b. w = ln 4.
        // n1: 1.386 + 2 ≈ 3.39 → 3; n2: 0 + 2 = 2. Normalized 100·(3 + 2 − s)/3: 66, 100.
        assert_eq!(scores(&pod, &nodes, &nodes[..2]), (vec![3, 2], vec![66, 100]));
    }

    #[test]
    fn args_defaults_and_validation() {
        let args: PodTopologySpreadArgs = serde_json::from_value(json!({})).unwrap();
        assert_eq!(args, PodTopologySpreadArgs::default());
        assert_eq!(args.defaulting_type, "System");
        let list: PodTopologySpreadArgs =
            serde_json::from_value(json!({"defaultingType": "List", "defaultConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]}))
            .unwrap();
        assert!(PodTopologySpread::new(list.clone()).is_ok());
        let system = PodTopologySpreadArgs { defaulting_type: "System".into(), ..list.clone() };
        let err = PodTopologySpread::new(system).unwrap_err();
        assert_eq!(err, r#"defaultingType: Invalid value: "System": when .defaultConstraints are not empty"#);
        let bad: PodTopologySpreadArgs =
            serde_json::from_value(json!({"defaultingType": "List", "defaultConstraints": [
            {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"a": "b"}}}]}))
            .unwrap();
        let err = PodTopologySpread::new(bad).unwrap_err();
        assert!(err.starts_with("[defaultConstraints[0].maxSkew: Invalid value: 0"), "{err}");
        assert!(err.contains("defaultConstraints[1].labelSelector: Forbidden"), "{err}");
        assert!(err.contains(r#"defaultConstraints[1]: Duplicate value: "{zone, ScheduleAnyway}""#), "{err}");
        let odd = PodTopologySpreadArgs { defaulting_type: "Sometimes".into(), ..Default::default() };
        assert!(PodTopologySpread::new(odd).unwrap_err().starts_with("defaultingType: Unsupported value"));
    }

    #[test]
    fn requeue_hints() {
        let pl = PodTopologySpread::new(PodTopologySpreadArgs::default()).unwrap();
        let nodes = arcs(cluster());
        let pod = incoming(json!([constraint("zone", 1, DO_NOT_SCHEDULE, json!({}))]), json!({}));
        let removed = |p: PodInfo| ClusterEvent::AssignedPodRemoved { pod: Arc::new(p), node: nodes[0].clone() };
        let added = |p: PodInfo| ClusterEvent::AssignedPodAdded { pod: Arc::new(p) };
        assert!(pl.requeue(&pod, &removed(web("w"))));
        assert!(!pl.requeue(&pod, &removed(pod_with("db", json!({"app": "db"}), json!({})))));
        assert!(!pl.requeue(&pod, &removed(PodInfo { namespace: "other".into(), ..web("w") })));
        assert!(pl.requeue(&pod, &added(pod_with("db", json!({"app": "db"}), json!({})))));
        assert!(!pl.requeue(&pod, &added(PodInfo { namespace: "other".into(), ..web("w") })));
        assert!(pl.requeue(&pod, &ClusterEvent::NodeAdded(nodes[0].clone())));
        assert!(!pl.requeue(&pod, &ClusterEvent::NodeAdded(nodes[4].clone())));
        assert!(pl.requeue(&pod, &ClusterEvent::NodeChanged(nodes[4].clone())));
        assert!(pl.requeue(&pod, &ClusterEvent::NodeRemoved(nodes[0].clone())));
        assert!(!pl.requeue(&pod, &ClusterEvent::NodeRemoved(nodes[4].clone())));
    }
}
