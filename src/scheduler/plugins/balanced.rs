//! NodeResourcesBalancedAllocation: favors nodes whose resource usage becomes more balanced with the
//! pod (kube-scheduler v1.36 `noderesources/balanced_allocation.go`).
//!
//! Score follows kubernetes/kubernetes#135573 (merged December 2025, first released in v1.36), which
//! scores the *change* in balance: with `S = int64((1 − std) · 100)` of the requested fractions,
//! `score = 50 + (50 + S_with_pod − S_without_pod) / 2` (no change 75, range 50–100). The formula
//! and the `(requested, allocated, allocatable)` scorer signature come from upstream's
//! `noderesources/AGENTS.md` and a walkthrough quoting master of March 2026; the Go source itself
//! was not available. That both `S` terms are truncated to integers before the subtraction is
//! inferred from the quoted line type-checking against `fwk.MaxNodeScore` (an `int64`): high
//! confidence in the formula, medium in that rounding detail.

use std::sync::Arc;

use serde::Deserialize;

use super::fit::{ResourceSpec, aggregate, default_resources, defaulted, invalid_number, usage};
use crate::registry::validation::FieldError;
use crate::scheduler::framework::{CycleState, MAX_NODE_SCORE, Plugin, Point, Status};
use crate::scheduler::types::{NodeInfo, PodInfo};

/// The plugin name in profiles.
pub const NAME: &str = "NodeResourcesBalancedAllocation";

/// `NodeResourcesBalancedAllocationArgs`. Missing fields take upstream's defaults.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BalancedAllocationArgs {
    /// The resources to balance; weights must be 1 (0 is read as 1).
    pub resources: Vec<ResourceSpec>,
}

impl Default for BalancedAllocationArgs {
    fn default() -> Self {
        BalancedAllocationArgs { resources: default_resources() }
    }
}

/// upstream's `ValidateNodeResourcesBalancedAllocationArgs`.
fn validate(args: &BalancedAllocationArgs) -> Result<(), String> {
    let mut errs = Vec::new();
    for (i, r) in args.resources.iter().enumerate() {
        if args.resources[..i].iter().any(|o| o.name == r.name) {
            errs.push(FieldError::duplicate(format!("resources[{i}].name"), &r.name));
        }
        if r.weight != 1 {
            errs.push(invalid_number(format!("resources[{i}].weight"), r.weight, "must be 1"));
        }
    }
    aggregate(&errs)
}

/// `int64((1 − std) · 100)` of the fractions (each capped at 1): std is |f1 − f2| / 2 for two
/// resources and the population standard deviation for more.
/// Resources BalancedAllocation weighs at most (upstream allows cpu, memory and a few extended ones).
const MAX_RESOURCES: usize = 16;

fn balance(fractions: &[f64]) -> i64 {
    let n = fractions.len() as f64;
    let std = match fractions {
        [a, b] => ((a - b) / 2.0).abs(),
        [_, _, _, ..] => {
            let mean = fractions.iter().sum::<f64>() / n;
            (fractions.iter().map(|f| (f - mean) * (f - mean)).sum::<f64>() / n).sqrt()
        }
        _ => 0.0,
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

/// NodeResourcesBalancedAllocation, scoring with actual requests (no 100m / 200 MiB defaults).
#[derive(Clone, Debug)]
pub struct BalancedAllocation {
    resources: Vec<ResourceSpec>,
}

impl BalancedAllocation {
    /// Applies upstream's defaults, then validates; the error names the offending field.
    pub fn new(args: BalancedAllocationArgs) -> Result<BalancedAllocation, String> {
        let args = BalancedAllocationArgs { resources: defaulted(args.resources) };
        validate(&args)?;
        Ok(BalancedAllocation { resources: args.resources })
    }

    /// Whether the pod requests none of the configured resources.
    fn best_effort(&self, pod: &PodInfo) -> bool {
        self.resources.iter().all(|r| pod.requests.get(&r.name) == 0)
    }
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreScore, Point::Score]
    }

    /// Skips pods that request none of the resources, so they do not pile onto one node (upstream #129138).
    fn pre_score(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _all: &[Arc<NodeInfo>],
    ) -> Status {
        if self.best_effort(pod) { Status::skip() } else { Status::success() }
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        if self.best_effort(pod) {
            return Ok(0);
        }
        // Fractions on the stack: this runs for every feasible node of every pod.
        let (mut with_pod, mut without_pod) = ([0f64; MAX_RESOURCES], [0f64; MAX_RESOURCES]);
        let mut n = 0;
        for u in self.resources.iter().filter_map(|r| usage(pod, node, &r.name, true)).take(MAX_RESOURCES) {
            let fraction = |requested: i64| (requested as f64 / u.allocatable as f64).min(1.0);
            with_pod[n] = fraction(u.used + u.request);
            without_pod[n] = fraction(u.used);
            n += 1;
        }
        let half = MAX_NODE_SCORE / 2;
        Ok(half + (half + balance(&with_pod[..n]) - balance(&without_pod[..n])) / 2)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::scheduler::framework::Code;

    fn pod(name: &str, requests: Value) -> PodInfo {
        let p = json!({"metadata": {"name": name, "uid": name}, "spec": {"containers": [
            {"name": "c", "image": "app", "resources": {"requests": requests}}]}});
        PodInfo::from_json(p)
    }

    fn node(allocatable: Value, pods: &[PodInfo]) -> NodeInfo {
        let n = json!({"metadata": {"name": "n"}, "status": {"allocatable": allocatable}});
        let mut info = NodeInfo::from_json(n);
        for p in pods {
            info.add_pod(Arc::new(p.on_node("n")));
        }
        info
    }

    fn score(b: &BalancedAllocation, p: &PodInfo, n: &NodeInfo) -> i64 {
        b.score(&CycleState::default(), p, n).unwrap()
    }

    #[test]
    fn scores_the_change_in_balance() {
        let b = BalancedAllocation::new(BalancedAllocationArgs::default()).unwrap();
        let p = pod("p", json!({"cpu": "3", "memory": "5000"}));
        // Empty node: without the pod 0/0 → 100; with it cpu 0.75, memory 0.5 → std 0.125 → 87.
        // 50 + (50 + 87 - 100) / 2 = 68.
        assert_eq!(score(&b, &p, &node(json!({"cpu": "4", "memory": "10000"}), &[])), 68);
        // Perfectly balanced with the pod: cpu 0.5, memory 0.5 → 100; 50 + 50 / 2 = 75.
        assert_eq!(score(&b, &p, &node(json!({"cpu": "6", "memory": "10000"}), &[])), 75);
        // The pod evens out a node heavy on cpu: without it cpu 0.6, memory 0 → std 0.3 → 70;
        // with it cpu 0.9, memory 0.5 → std 0.2 → 80. 50 + (50 + 80 - 70) / 2 = 80.
        let n = node(json!({"cpu": "10", "memory": "10000"}), &[pod("e", json!({"cpu": "6"}))]);
        assert_eq!(score(&b, &p, &n), 80);
        // Fractions are capped at 1: cpu 9/6 → 1, memory 0.5 → 75; without: 1, 0 → 50.
        // 50 + (50 + 75 - 50) / 2 = 87.
        let n = node(json!({"cpu": "6", "memory": "10000"}), &[pod("e", json!({"cpu": "6"}))]);
        assert_eq!(score(&b, &p, &n), 87);
    }

    #[test]
    fn more_than_two_resources_use_the_population_std() {
        let args = json!({"resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
            {"name": "nvidia.com/gpu", "weight": 1}]});
        let b = BalancedAllocation::new(serde_json::from_value(args).unwrap()).unwrap();
        let n = node(json!({"cpu": "4", "memory": "4Gi", "nvidia.com/gpu": "4"}), &[]);
        // With the pod: 0.25, 0.5, 0.75 → mean 0.5, std sqrt(0.125 / 3) = 0.2041 → 79; without: 100.
        // 50 + (50 + 79 - 100) / 2 = 64.
        assert_eq!(score(&b, &pod("p", json!({"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "3"})), &n), 64);
        // A pod not asking for the gpu leaves it out: cpu 0.25, memory 0.5 → 87; 50 + 37 / 2 = 68.
        assert_eq!(score(&b, &pod("p", json!({"cpu": "1", "memory": "2Gi"})), &n), 68);
    }

    #[test]
    fn best_effort_pods_are_skipped() {
        let b = BalancedAllocation::new(BalancedAllocationArgs::default()).unwrap();
        let mut state = CycleState::default();
        // Requests only outside the configured resources count as best-effort too.
        let p = pod("p", json!({"ephemeral-storage": "1Gi"}));
        assert_eq!(b.pre_score(&mut state, &p, &[], &[]).code, Code::Skip);
        assert_eq!(score(&b, &p, &node(json!({"cpu": "4", "memory": "4Gi"}), &[])), 0);
        assert!(b.pre_score(&mut state, &pod("p", json!({"cpu": "1"})), &[], &[]).is_success());
    }

    #[test]
    fn args_defaults_and_validation() {
        let args: BalancedAllocationArgs = serde_json::from_value(json!({})).unwrap();
        assert_eq!(args, BalancedAllocationArgs::default());
        let new = |v: Value| BalancedAllocation::new(serde_json::from_value(v).unwrap());
        assert_eq!(new(json!({"resources": [{"name": "cpu"}]})).unwrap().resources, [ResourceSpec::new("cpu", 1)]);
        assert_eq!(
            new(json!({"resources": [{"name": "cpu", "weight": 2}]})).unwrap_err(),
            "resources[0].weight: Invalid value: 2: must be 1"
        );
        assert_eq!(
            new(json!({"resources": [{"name": "cpu", "weight": 1}, {"name": "cpu", "weight": 1}]})).unwrap_err(),
            "resources[1].name: Duplicate value: \"cpu\""
        );
    }
}
