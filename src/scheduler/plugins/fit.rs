//! NodeResourcesFit: whether a node has room for the pod's requests, and how full the node would be
//! with it (kube-scheduler v1.36 `noderesources/fit.go`, `least_allocated.go`, `most_allocated.go`,
//! `requested_to_capacity_ratio.go`, `resource_allocation.go`).

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::registry::validation::{ErrorType, FieldError, is_qualified_name};
use crate::scheduler::framework::{ClusterEvent, Code, CycleState, MAX_NODE_SCORE, Plugin, Point, Status};
use crate::scheduler::types::{NodeInfo, PodInfo};

/// The plugin name in profiles.
/// Resources a scoring strategy weighs at most.
const MAX_SCORED: usize = 16;

pub const NAME: &str = "NodeResourcesFit";

/// `scoringStrategy.type`: favor nodes with the most room left (the default).
pub const LEAST_ALLOCATED: &str = "LeastAllocated";
/// `scoringStrategy.type`: favor the fullest nodes (bin packing).
pub const MOST_ALLOCATED: &str = "MostAllocated";
/// `scoringStrategy.type`: score utilization along a configured curve.
pub const REQUESTED_TO_CAPACITY_RATIO: &str = "RequestedToCapacityRatio";

/// Highest score of a `requestedToCapacityRatio` shape point (upstream's `MaxCustomPriorityScore`).
const MAX_CUSTOM_PRIORITY_SCORE: i64 = 10;

/// A resource and its weight in a score (upstream's `ResourceSpec`). A weight of 0 means 1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSpec {
    pub name: String,
    #[serde(default)]
    pub weight: i64,
}

impl ResourceSpec {
    /// A resource spec with the given weight.
    pub fn new(name: &str, weight: i64) -> Self {
        ResourceSpec { name: name.to_string(), weight }
    }
}

/// The resources scored when none are configured: cpu and memory, weight 1 each.
pub fn default_resources() -> Vec<ResourceSpec> {
    vec![ResourceSpec::new("cpu", 1), ResourceSpec::new("memory", 1)]
}

/// Upstream's v1 defaulting of resource lists: empty means the default set, weight 0 means 1.
pub(crate) fn defaulted(resources: Vec<ResourceSpec>) -> Vec<ResourceSpec> {
    if resources.is_empty() {
        return default_resources();
    }
    resources.into_iter().map(|r| if r.weight == 0 { ResourceSpec { weight: 1, ..r } } else { r }).collect()
}

/// `NodeResourcesFitArgs`. Missing fields take upstream's defaults.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FitArgs {
    /// Extended resources the filter does not check.
    pub ignored_resources: Vec<String>,
    /// Extended resource groups (`example.com` for `example.com/foo`) the filter does not check.
    pub ignored_resource_groups: Vec<String>,
    pub scoring_strategy: ScoringStrategy,
}

impl Default for FitArgs {
    fn default() -> Self {
        FitArgs {
            ignored_resources: Vec::new(),
            ignored_resource_groups: Vec::new(),
            scoring_strategy: ScoringStrategy {
                strategy_type: LEAST_ALLOCATED.to_string(),
                resources: default_resources(),
                requested_to_capacity_ratio: None,
            },
        }
    }
}

/// `scoringStrategy`: how Score rates a node.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoringStrategy {
    /// `LeastAllocated`, `MostAllocated` or `RequestedToCapacityRatio`.
    #[serde(default, rename = "type")]
    pub strategy_type: String,
    #[serde(default)]
    pub resources: Vec<ResourceSpec>,
    #[serde(default)]
    pub requested_to_capacity_ratio: Option<RequestedToCapacityRatioParam>,
}

/// The score curve of the `RequestedToCapacityRatio` strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RequestedToCapacityRatioParam {
    pub shape: Vec<UtilizationShapePoint>,
}

/// One point of the curve: utilization in percent (0..=100) → score (0..=10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UtilizationShapePoint {
    pub utilization: i32,
    pub score: i32,
}

/// Joins field errors as upstream's `ErrorList.ToAggregate().Error()`: duplicates dropped, several
/// wrapped in brackets.
pub(crate) fn aggregate(errs: &[FieldError]) -> Result<(), String> {
    let mut msgs: Vec<String> = Vec::new();
    for msg in errs.iter().map(ToString::to_string) {
        if !msgs.contains(&msg) {
            msgs.push(msg);
        }
    }
    match msgs.len() {
        0 => Ok(()),
        1 => Err(msgs.remove(0)),
        _ => Err(format!("[{}]", msgs.join(", "))),
    }
}

/// An `Invalid value` error for a number (upstream prints numbers unquoted).
pub(crate) fn invalid_number(field: String, value: i64, detail: &str) -> FieldError {
    FieldError { kind: ErrorType::Invalid, field, detail: format!("Invalid value: {value}: {detail}") }
}

/// upstream's `validateFunctionShape`.
fn validate_shape(shape: &[UtilizationShapePoint], path: &str, errs: &mut Vec<FieldError>) {
    if shape.is_empty() {
        errs.push(FieldError::required(path, "at least one point must be specified"));
        return;
    }
    if let Some(i) = (1..shape.len()).find(|&i| shape[i - 1].utilization >= shape[i].utilization) {
        let field = format!("{path}[{i}].utilization");
        errs.push(invalid_number(field, shape[i].utilization.into(), "values must be sorted in increasing order"));
    }
    for (i, p) in shape.iter().enumerate() {
        if !(0..=100).contains(&p.utilization) {
            errs.push(invalid_number(
                format!("{path}[{i}].utilization"),
                p.utilization.into(),
                "not in valid range [0, 100]",
            ));
        }
        if !(0..=MAX_CUSTOM_PRIORITY_SCORE).contains(&i64::from(p.score)) {
            let detail = format!("not in valid range [0, {MAX_CUSTOM_PRIORITY_SCORE}]");
            errs.push(invalid_number(format!("{path}[{i}].score"), p.score.into(), &detail));
        }
    }
}

/// upstream's `ValidateNodeResourcesFitArgs` (after v1 defaulting).
fn validate(args: &FitArgs) -> Result<(), String> {
    let mut errs = Vec::new();
    for (i, res) in args.ignored_resources.iter().enumerate() {
        errs.extend(
            is_qualified_name(res).into_iter().map(|e| FieldError::invalid(format!("ignoredResources[{i}]"), res, e)),
        );
    }
    for (i, group) in args.ignored_resource_groups.iter().enumerate() {
        let field = format!("ignoredResourceGroups[{i}]");
        if group.contains('/') {
            errs.push(FieldError::invalid(&field, group, "resource group name can't contain '/'"));
        }
        errs.extend(is_qualified_name(group).into_iter().map(|e| FieldError::invalid(&field, group, e)));
    }
    let s = &args.scoring_strategy;
    let supported = [LEAST_ALLOCATED, MOST_ALLOCATED, REQUESTED_TO_CAPACITY_RATIO];
    if !supported.contains(&s.strategy_type.as_str()) {
        errs.push(FieldError::not_supported("scoringStrategy.type", &s.strategy_type, &supported));
    }
    for (i, r) in s.resources.iter().enumerate() {
        if !(1..=100).contains(&r.weight) {
            let detail = format!("resource weight of {} not in valid range (0, 100]", r.name);
            errs.push(invalid_number(format!("scoringStrategy.resources[{i}].weight"), r.weight, &detail));
        }
    }
    let ratio_path = "scoringStrategy.requestedToCapacityRatio";
    match (&s.requested_to_capacity_ratio, s.strategy_type == REQUESTED_TO_CAPACITY_RATIO) {
        (None, true) => {
            errs.push(FieldError::required(ratio_path, "must be specified when type is RequestedToCapacityRatio"))
        }
        (Some(r), true) => validate_shape(&r.shape, &format!("{ratio_path}.shape"), &mut errs),
        (Some(_), false) => {
            errs.push(FieldError::forbidden(ratio_path, "must be nil when type is not RequestedToCapacityRatio"))
        }
        (None, false) => {}
    }
    aggregate(&errs)
}

/// A configured resource on one node, as upstream's `calculateResourceAllocatableRequest` sees it.
pub(crate) struct Usage {
    pub allocatable: i64,
    /// What the pods already on the node request.
    pub used: i64,
    /// What the pod being scheduled requests.
    pub request: i64,
}

/// The amounts of resource `name` that scoring compares, or `None` when the resource is left out:
/// the node offers none of it, or it is an extended resource the pod does not request. Without
/// `use_requested`, CPU and memory count 100m / 200 MiB for containers that request none.
pub(crate) fn usage(pod: &PodInfo, node: &NodeInfo, name: &str, use_requested: bool) -> Option<Usage> {
    let alloc = &node.node.allocatable;
    let (allocatable, used, request) = match name {
        "cpu" if use_requested => (alloc.milli_cpu, node.requested.milli_cpu, pod.requests.milli_cpu),
        "cpu" => (alloc.milli_cpu, node.non_zero_milli_cpu, pod.non_zero_milli_cpu),
        "memory" if use_requested => (alloc.memory, node.requested.memory, pod.requests.memory),
        "memory" => (alloc.memory, node.non_zero_memory, pod.non_zero_memory),
        "ephemeral-storage" => {
            (alloc.ephemeral_storage, node.requested.ephemeral_storage, pod.requests.ephemeral_storage)
        }
        // The pod count is not a scored resource upstream.
        "pods" => return None,
        _ => {
            let request = pod.requests.get(name);
            if request == 0 {
                return None;
            }
            (alloc.get(name), node.requested.get(name), request)
        }
    };
    (allocatable != 0).then_some(Usage { allocatable, used, request })
}

/// `requested * 100 / capacity` without overflow (capacity > 0).
fn percent(requested: i64, capacity: i64) -> i64 {
    (i128::from(requested) * i128::from(MAX_NODE_SCORE) / i128::from(capacity)) as i64
}

/// upstream's `BuildBrokenLinearFunction` over (utilization, score) points.
fn broken_linear(shape: &[(i64, i64)], p: i64) -> i64 {
    for (i, &(u, s)) in shape.iter().enumerate() {
        if p <= u {
            let Some(&(pu, ps)) = i.checked_sub(1).map(|j| &shape[j]) else { return s };
            return ps + (s - ps) * (p - pu) / (u - pu);
        }
    }
    shape.last().map_or(0, |&(_, s)| s)
}

/// How Score rates a node.
#[derive(Clone, Debug)]
enum Strategy {
    Least,
    Most,
    /// Shape points with scores scaled to 0..=100.
    Ratio(Vec<(i64, i64)>),
}

impl Strategy {
    /// The node score from (requested incl. the pod, allocatable, weight) per scored resource.
    fn score(&self, scored: &[(i64, i64, i64)]) -> i64 {
        let weighted = |per_resource: fn(i64, i64) -> i64| {
            let (sum, weights) = scored
                .iter()
                .fold((0, 0), |(sum, weights), &(req, cap, w)| (sum + per_resource(req, cap) * w, weights + w));
            if weights == 0 { 0 } else { sum / weights }
        };
        match self {
            Strategy::Least => weighted(|req, cap| if req > cap { 0 } else { percent(cap - req, cap) }),
            Strategy::Most => weighted(|req, cap| percent(req.min(cap), cap)),
            Strategy::Ratio(shape) => {
                let (mut sum, mut weights) = (0, 0);
                for &(req, cap, w) in scored {
                    let utilization = if req >= cap { MAX_NODE_SCORE } else { percent(req.max(0), cap) };
                    let score = broken_linear(shape, utilization);
                    // Resources scoring 0 do not count, not even in the weight sum.
                    if score > 0 {
                        sum += score * w;
                        weights += w;
                    }
                }
                if weights == 0 { 0 } else { (sum as f64 / weights as f64).round() as i64 }
            }
        }
    }
}

/// Whether `name` is an extended resource (`example.com/foo`), the only kind that may be ignored.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// NodeResourcesFit: Filter rejects nodes without room for the pod's requests; Score rates nodes by
/// how allocated they would be, per the configured strategy (scoring counts CPU and memory with the
/// 100m / 200 MiB defaults for containers that request none, as upstream).
#[derive(Clone, Debug)]
pub struct Fit {
    ignored_resources: BTreeSet<String>,
    ignored_resource_groups: BTreeSet<String>,
    resources: Vec<ResourceSpec>,
    strategy: Strategy,
}

impl Fit {
    /// Applies upstream's defaults, then validates like `ValidateNodeResourcesFitArgs`; the error
    /// names the offending field.
    pub fn new(mut args: FitArgs) -> Result<Fit, String> {
        let resources = std::mem::take(&mut args.scoring_strategy.resources);
        args.scoring_strategy.resources = defaulted(resources);
        validate(&args)?;
        let s = args.scoring_strategy;
        let strategy = match (s.strategy_type.as_str(), s.requested_to_capacity_ratio) {
            (LEAST_ALLOCATED, _) => Strategy::Least,
            (MOST_ALLOCATED, _) => Strategy::Most,
            (_, ratio) => {
                let scale = MAX_NODE_SCORE / MAX_CUSTOM_PRIORITY_SCORE;
                let shape = ratio.unwrap_or_default().shape;
                Strategy::Ratio(shape.iter().map(|p| (i64::from(p.utilization), i64::from(p.score) * scale)).collect())
            }
        };
        Ok(Fit {
            ignored_resources: args.ignored_resources.into_iter().collect(),
            ignored_resource_groups: args.ignored_resource_groups.into_iter().collect(),
            resources: s.resources,
            strategy,
        })
    }

    fn ignored(&self, name: &str) -> bool {
        is_extended_resource(name)
            && (self.ignored_resources.contains(name)
                || name.split('/').next().is_some_and(|group| self.ignored_resource_groups.contains(group)))
    }
}

impl Plugin for Fit {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter, Point::Score]
    }

    /// upstream's `fitsRequest`: every shortfall is a reason; UnschedulableAndUnresolvable when
    /// some request exceeds the node's whole allocatable (preemption cannot help).
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let alloc = &node.node.allocatable;
        let mut reasons = Vec::new();
        let mut unresolvable = false;
        if node.pods.len() as i64 + 1 > alloc.pods {
            reasons.push("Too many pods".into());
        }
        let req = &pod.requests;
        if !req.is_zero() {
            let core = [
                ("cpu", req.milli_cpu, alloc.milli_cpu, node.requested.milli_cpu),
                ("memory", req.memory, alloc.memory, node.requested.memory),
                ("ephemeral-storage", req.ephemeral_storage, alloc.ephemeral_storage, node.requested.ephemeral_storage),
            ];
            let scalar = req
                .scalar
                .iter()
                .filter(|(name, _)| !self.ignored(name))
                .map(|(name, &q)| (name.as_str(), q, alloc.get(name), node.requested.get(name)));
            for (name, quantity, allocatable, used) in core.into_iter().chain(scalar) {
                if quantity > 0 && quantity > allocatable - used {
                    reasons.push(format!("Insufficient {name}").into());
                    unresolvable |= quantity > allocatable;
                }
            }
        }
        if reasons.is_empty() {
            return Status::success();
        }
        let code = if unresolvable { Code::UnschedulableAndUnresolvable } else { Code::Unschedulable };
        Status { code, reasons, plugin: "" }
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        // On the stack: this runs for every feasible node of every pod.
        let mut scored = [(0i64, 0i64, 0i64); MAX_SCORED];
        let mut n = 0;
        for (r, u) in self.resources.iter().filter_map(|r| usage(pod, node, &r.name, false).map(|u| (r, u))) {
            if n == MAX_SCORED {
                break;
            }
            scored[n] = (u.used + u.request, u.allocatable, r.weight);
            n += 1;
        }
        Ok(self.strategy.score(&scored[..n]))
    }

    /// A node that appeared, changed or lost a pod may now fit the pod; a pod arriving cannot help.
    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        match event {
            ClusterEvent::NodeAdded(n)
            | ClusterEvent::NodeChanged(n)
            | ClusterEvent::AssignedPodRemoved { node: n, .. } => {
                self.filter(&CycleState::default(), pod, n).is_success()
            }
            ClusterEvent::AssignedPodAdded { .. } | ClusterEvent::NodeRemoved(_) | ClusterEvent::StorageChanged => {
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;

    fn pod(name: &str, requests: Value) -> PodInfo {
        let p = json!({"metadata": {"name": name, "uid": name}, "spec": {"containers": [
            {"name": "c", "image": "app", "resources": {"requests": requests}}]}});
        PodInfo::from_json(p)
    }

    fn node(name: &str, allocatable: Value, pods: &[PodInfo]) -> NodeInfo {
        let n = json!({"metadata": {"name": name}, "status": {"allocatable": allocatable}});
        let mut info = NodeInfo::from_json(n);
        for p in pods {
            info.add_pod(Arc::new(p.on_node(name)));
        }
        info
    }

    fn fit(args: Value) -> Fit {
        Fit::new(serde_json::from_value(args).unwrap()).unwrap()
    }

    fn new_err(args: Value) -> String {
        Fit::new(serde_json::from_value(args).unwrap()).unwrap_err()
    }

    fn score(f: &Fit, p: &PodInfo, n: &NodeInfo) -> i64 {
        f.score(&CycleState::default(), p, n).unwrap()
    }

    fn gpu_nodes() -> (PodInfo, NodeInfo, NodeInfo) {
        let req = json!({"cpu": "1000m", "memory": "2Gi", "nvidia.com/gpu": "1"});
        let alloc = json!({"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2", "pods": "110"});
        let n1 = node("n1", alloc.clone(), &[pod("existing", req.clone())]);
        (pod("p", req), n1, node("n2", alloc, &[]))
    }

    #[test]
    fn most_allocated_with_weighted_gpu() {
        let f = fit(json!({"scoringStrategy": {"type": "MostAllocated", "resources": [
            {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 5}]}}));
        let (p, n1, n2) = gpu_nodes();
        // n1: cpu 2000/4000 = 50, memory 4Gi/8Gi = 50, gpu 2/2 = 100 → (50 + 50 + 500) / 7 = 85.
        assert_eq!(score(&f, &p, &n1), 85);
        // n2: 25, 25, gpu 1/2 = 50 → (25 + 25 + 250) / 7 = 42.
        assert_eq!(score(&f, &p, &n2), 42);
    }

    #[test]
    fn least_allocated_by_default() {
        let f = Fit::new(FitArgs::default()).unwrap();
        let (p, n1, n2) = gpu_nodes();
        // n1: (4000 - 2000) * 100 / 4000 = 50 for cpu and memory; n2: 75 each.
        assert_eq!(score(&f, &p, &n1), 50);
        assert_eq!(score(&f, &p, &n2), 75);
    }

    #[test]
    fn best_effort_pods_score_with_default_requests() {
        let f = Fit::new(FitArgs::default()).unwrap();
        let n = node("n", json!({"cpu": "1", "memory": "1000Mi", "pods": "10"}), &[]);
        // cpu: (1000 - 100) * 100 / 1000 = 90; memory: (1000 - 200) Mi * 100 / 1000 Mi = 80.
        assert_eq!(score(&f, &pod("p", json!({})), &n), 85);
        // A best-effort pod already there counts the same defaults: cpu 80, memory 60.
        let n = node("n", json!({"cpu": "1", "memory": "1000Mi", "pods": "10"}), &[pod("be", json!({}))]);
        assert_eq!(score(&f, &pod("p", json!({})), &n), 70);
    }

    #[test]
    fn unrequested_extended_resources_and_empty_allocatable_are_skipped() {
        let f = fit(json!({"scoringStrategy": {"type": "MostAllocated", "resources": [
            {"name": "cpu", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 5},
            {"name": "ephemeral-storage", "weight": 3}]}}));
        let n = node("n", json!({"cpu": "4", "nvidia.com/gpu": "2"}), &[]);
        // Neither gpu (not requested) nor ephemeral-storage (allocatable 0) counts: cpu 1000/4000 = 25.
        assert_eq!(score(&f, &pod("p", json!({"cpu": "1"})), &n), 25);
    }

    #[test]
    fn requested_to_capacity_ratio_scores() {
        let f = fit(json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
            "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}],
            "requestedToCapacityRatio": {"shape": [
                {"utilization": 0, "score": 0}, {"utilization": 50, "score": 10},
                {"utilization": 100, "score": 5}]}}}));
        let n = node("n", json!({"cpu": "4", "memory": "8Gi"}), &[pod("e", json!({"cpu": "1", "memory": "5Gi"}))]);
        // cpu: 1500 * 100 / 4000 = 37 → 0 + 100 * 37 / 50 = 74.
        // memory: 6Gi/8Gi = 75 → 100 + (50 - 100) * 25 / 50 = 75. round(149 / 2) = 75.
        assert_eq!(score(&f, &pod("p", json!({"cpu": "500m", "memory": "1Gi"})), &n), 75);
        // Over capacity counts as 100% utilization: 50 for both.
        assert_eq!(score(&f, &pod("p", json!({"cpu": "4", "memory": "4Gi"})), &n), 50);

        // Bin packing; a resource scoring 0 drops out of the weight sum.
        let f = fit(json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
            "requestedToCapacityRatio": {"shape": [
                {"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]}}}));
        let n = node("n", json!({"cpu": "4", "memory": "8Gi"}), &[]);
        assert_eq!(score(&f, &pod("p", json!({"cpu": "2", "memory": "0"})), &n), 50);
    }

    #[test]
    fn filter_reports_too_many_pods() {
        let f = Fit::new(FitArgs::default()).unwrap();
        let n = node("n", json!({"cpu": "4", "memory": "8Gi", "pods": "1"}), &[pod("e", json!({}))]);
        let s = f.filter(&CycleState::default(), &pod("p", json!({})), &n);
        assert_eq!((s.code, s.reasons), (Code::Unschedulable, vec![std::borrow::Cow::from("Too many pods")]));
    }

    #[test]
    fn filter_reports_every_shortfall() {
        let f = Fit::new(FitArgs::default()).unwrap();
        let alloc = json!({"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi", "pods": "10"});
        let n = node("n", alloc, &[pod("e", json!({"cpu": "1500m", "memory": "3Gi"}))]);
        let state = CycleState::default();
        let s = f.filter(&state, &pod("p", json!({"cpu": "1", "memory": "2Gi", "ephemeral-storage": "1Gi"})), &n);
        assert_eq!(s.code, Code::Unschedulable);
        assert_eq!(s.reasons, ["Insufficient cpu", "Insufficient memory"]);
        // Asking for more than the whole node cannot be fixed by preemption.
        let s = f.filter(&state, &pod("p", json!({"cpu": "3", "memory": "2Gi", "example.com/foo": "1"})), &n);
        assert_eq!(s.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(s.reasons, ["Insufficient cpu", "Insufficient memory", "Insufficient example.com/foo"]);
        // A pod requesting nothing fits a full node; zero requests are never short.
        assert!(f.filter(&state, &pod("p", json!({})), &n).is_success());
        assert!(f.filter(&state, &pod("p", json!({"cpu": "0", "example.com/foo": "0"})), &n).is_success());
        assert!(f.filter(&state, &pod("p", json!({"cpu": "500m", "memory": "1Gi"})), &n).is_success());
    }

    #[test]
    fn filter_skips_ignored_extended_resources() {
        let n = node("n", json!({"cpu": "4", "memory": "8Gi", "pods": "10"}), &[]);
        let p = pod("p", json!({"cpu": "1", "example.com/foo": "1"}));
        let state = CycleState::default();
        assert!(!Fit::new(FitArgs::default()).unwrap().filter(&state, &p, &n).is_success());
        assert!(fit(json!({"ignoredResources": ["example.com/foo"]})).filter(&state, &p, &n).is_success());
        assert!(fit(json!({"ignoredResourceGroups": ["example.com"]})).filter(&state, &p, &n).is_success());
        // Only extended resources may be ignored.
        let p = pod("p", json!({"hugepages-2Mi": "2Mi"}));
        assert!(!fit(json!({"ignoredResources": ["hugepages-2Mi"]})).filter(&state, &p, &n).is_success());
    }

    #[test]
    fn requeue_when_the_node_would_now_fit() {
        let f = Fit::new(FitArgs::default()).unwrap();
        let p = pod("p", json!({"cpu": "2"}));
        let small = Arc::new(node("n", json!({"cpu": "1", "pods": "10"}), &[]));
        let big = Arc::new(node("n", json!({"cpu": "4", "pods": "10"}), &[]));
        assert!(!f.requeue(&p, &ClusterEvent::NodeAdded(small.clone())));
        assert!(f.requeue(&p, &ClusterEvent::NodeChanged(big.clone())));
        let other = Arc::new(pod("o", json!({"cpu": "1"})));
        assert!(f.requeue(&p, &ClusterEvent::AssignedPodRemoved { pod: other.clone(), node: big.clone() }));
        assert!(!f.requeue(&p, &ClusterEvent::AssignedPodRemoved { pod: other.clone(), node: small }));
        assert!(!f.requeue(&p, &ClusterEvent::AssignedPodAdded { pod: other }));
    }

    #[test]
    fn args_default_like_upstream() {
        let args: FitArgs = serde_json::from_value(json!({})).unwrap();
        assert_eq!(args, FitArgs::default());
        // Empty resources mean cpu and memory; weight 0 means 1.
        let f = fit(json!({"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu"}]}}));
        assert_eq!(f.resources, [ResourceSpec::new("cpu", 1)]);
        let f = fit(json!({"scoringStrategy": {"type": "MostAllocated"}}));
        assert_eq!(f.resources, default_resources());
    }

    #[test]
    fn args_validation_names_the_field() {
        assert_eq!(
            new_err(
                json!({"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 101}]}})
            ),
            "scoringStrategy.resources[0].weight: Invalid value: 101: \
             resource weight of cpu not in valid range (0, 100]"
        );
        assert_eq!(
            new_err(json!({"scoringStrategy": {"type": "Balanced"}})),
            "scoringStrategy.type: Unsupported value: \"Balanced\": supported values: \"LeastAllocated\", \
             \"MostAllocated\", \"RequestedToCapacityRatio\""
        );
        assert_eq!(
            new_err(json!({"scoringStrategy": {"type": "RequestedToCapacityRatio"}})),
            "scoringStrategy.requestedToCapacityRatio: Required value: \
             must be specified when type is RequestedToCapacityRatio"
        );
        assert_eq!(
            new_err(json!({"scoringStrategy": {"type": "LeastAllocated", "requestedToCapacityRatio": {"shape": []}}})),
            "scoringStrategy.requestedToCapacityRatio: Forbidden: must be nil when type is not RequestedToCapacityRatio"
        );
        let ratio = |shape: Value| {
            new_err(json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
                    "requestedToCapacityRatio": {"shape": shape}}}))
        };
        assert_eq!(
            ratio(json!([])),
            "scoringStrategy.requestedToCapacityRatio.shape: Required value: at least one point must be specified"
        );
        assert_eq!(
            ratio(json!([{"utilization": 50, "score": 1}, {"utilization": 50, "score": 2}])),
            "scoringStrategy.requestedToCapacityRatio.shape[1].utilization: Invalid value: 50: \
             values must be sorted in increasing order"
        );
        assert_eq!(
            ratio(json!([{"utilization": 101, "score": 11}])),
            "[scoringStrategy.requestedToCapacityRatio.shape[0].utilization: Invalid value: 101: \
             not in valid range [0, 100], \
             scoringStrategy.requestedToCapacityRatio.shape[0].score: Invalid value: 11: not in valid range [0, 10]]"
        );
        assert_eq!(
            new_err(json!({"ignoredResourceGroups": ["example.com/foo"]})),
            "ignoredResourceGroups[0]: Invalid value: \"example.com/foo\": resource group name can't contain '/'"
        );
        assert!(
            new_err(json!({"ignoredResources": ["-bad"]}))
                .starts_with("ignoredResources[0]: Invalid value: \"-bad\": ")
        );
    }
}
