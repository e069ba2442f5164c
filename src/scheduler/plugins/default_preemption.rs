//! DefaultPreemption, upstream's PostFilter plugin (`plugins/defaultpreemption` with
//! `framework/preemption`): when no node fits a pod, look for nodes where removing pods of lower
//! priority would make it fit, keep as many of those pods as still allows it (first those whose
//! PodDisruptionBudget would be broken), and choose one node by upstream's order. The scheduler
//! then deletes the victims and nominates the pod to the node; the pod is placed by a later cycle
//! once they are gone, never straight from here.

use std::cmp::Ordering;
use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::Store;
use rand::Rng as _;
use serde::Deserialize;

use crate::scheduler::algorithm::{Diagnosis, FitError};
use crate::scheduler::framework::{
    CycleState, Nomination, Plugin, Point, PostFilterInput, PostFilterResult, Profile, Status,
};
use crate::scheduler::types::{NodeInfo, PodInfo, label_selector_matches};

pub const NAME: &str = "DefaultPreemption";
const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";

/// `DefaultPreemptionArgs`: how many candidate nodes to find before choosing among them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Args {
    #[serde(default = "default_percentage")]
    min_candidate_nodes_percentage: i32,
    #[serde(default = "default_absolute")]
    min_candidate_nodes_absolute: i32,
    #[serde(rename = "apiVersion", default)]
    _api_version: Option<String>,
    #[serde(rename = "kind", default)]
    _kind: Option<String>,
}

fn default_percentage() -> i32 {
    10
}

fn default_absolute() -> i32 {
    100
}

impl Default for Args {
    fn default() -> Self {
        Args {
            min_candidate_nodes_percentage: default_percentage(),
            min_candidate_nodes_absolute: default_absolute(),
            _api_version: None,
            _kind: None,
        }
    }
}

pub struct DefaultPreemption {
    args: Args,
    pdbs: Store<PodDisruptionBudget>,
}

/// A node where the pod would fit once `victims` are gone.
#[derive(Debug)]
struct Candidate {
    node: String,
    /// Most important first.
    victims: Vec<Arc<PodInfo>>,
    pdb_violations: usize,
}

impl DefaultPreemption {
    /// upstream's `ValidateDefaultPreemptionArgs`.
    pub fn new(args: Args, pdbs: Store<PodDisruptionBudget>) -> Result<Self, String> {
        let (pct, abs) = (args.min_candidate_nodes_percentage, args.min_candidate_nodes_absolute);
        if !(0..=100).contains(&pct) {
            return Err(format!("minCandidateNodesPercentage: Invalid value: {pct}: not in valid range [0, 100]"));
        }
        if abs < 0 {
            return Err(format!("minCandidateNodesAbsolute: Invalid value: {abs}: not in valid range [0, inf)"));
        }
        if pct == 0 && abs == 0 {
            return Err(
                "minCandidateNodesPercentage: Invalid value: 0: cannot be zero at the same time as minCandidateNodesAbsolute"
                    .into(),
            );
        }
        Ok(DefaultPreemption { args, pdbs })
    }

    /// upstream's `calculateNumCandidates`: a percentage of the nodes, at least the absolute number,
    /// at most all of them.
    fn num_candidates(&self, nodes: usize) -> usize {
        let n = nodes * self.args.min_candidate_nodes_percentage as usize / 100;
        n.max(self.args.min_candidate_nodes_absolute as usize).min(nodes)
    }

    /// upstream's `DryRunPreemption`: the candidates found from a random start, non-violating ones
    /// first; each node that is none gets its reason in `diagnosis`.
    fn candidates(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        input: &PostFilterInput<'_>,
        pdbs: &[Arc<PodDisruptionBudget>],
        diagnosis: &mut Diagnosis,
    ) -> Vec<Candidate> {
        let potential = &input.helpful;
        let n = potential.len();
        if n == 0 {
            return Vec::new();
        }
        let wanted = self.num_candidates(n);
        let offset = rand::rng().random_range(0..n);
        // The attempt's PreFilter state serves every simulation unless it counted pods elsewhere.
        let shared = (!prefilter_counts_pods(pod, input.nodes)).then_some(state);
        let (mut fine, mut violating) = (Vec::new(), Vec::new());
        for i in 0..n {
            let node = &potential[(offset + i) % n];
            match select_victims(input, shared, pod, node, pdbs) {
                Ok(c) if c.pdb_violations == 0 => fine.push(c),
                Ok(c) => violating.push(c),
                Err(s) => diagnosis.record_on(node.name(), s),
            }
            if !fine.is_empty() && fine.len() + violating.len() >= wanted {
                break;
            }
        }
        fine.extend(violating);
        fine
    }
}

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PostFilter]
    }

    /// upstream's `Evaluator.Preempt` up to the choice of a node (the victims are deleted by the
    /// scheduler). Messages start with `preemption: `, as upstream's.
    fn post_filter(&self, state: &CycleState, pod: &PodInfo, input: &PostFilterInput<'_>) -> PostFilterResult {
        if let Err(why) = eligible(pod, input) {
            return (Status::unschedulable(format!("preemption: {why}")), None);
        }
        let pdbs = self.pdbs.state();
        let mut diagnosis = Diagnosis::default();
        let candidates = self.candidates(state, pod, input, &pdbs, &mut diagnosis);
        let Some(best) = pick(candidates) else {
            diagnosis.absent = Some(Status::unresolvable(NOT_HELPFUL));
            let fit = FitError { num_all_nodes: input.nodes.len(), diagnosis };
            // No candidate: an earlier nomination is cleared.
            let clear = Nomination { node: String::new(), victims: Vec::new() };
            return (Status::unschedulable(format!("preemption: {fit}")), Some(clear));
        };
        (Status::success(), Some(Nomination { node: best.node, victims: best.victims }))
    }
}

/// upstream's `PodEligibleToPreemptOthers`.
fn eligible(pod: &PodInfo, input: &PostFilterInput<'_>) -> Result<(), &'static str> {
    if pod.never_preempts {
        return Err("not eligible due to preemptionPolicy=Never.");
    }
    if pod.nominated_node.is_empty() || input.nominated_node_unresolvable {
        return Ok(());
    }
    let node = input.nodes.iter().find(|n| n.name() == pod.nominated_node);
    if node.is_some_and(|n| n.pods.iter().any(|p| p.priority < pod.priority && p.preempted)) {
        return Err("not eligible due to a terminating pod on the nominated node.");
    }
    Ok(())
}

/// Whether the PreFilter state of `pod` depends on the pods placed (pod affinity, spread
/// constraints, other pods' required anti-affinity, claims shared with other pods): then a
/// simulation that removes pods runs PreFilter again (upstream updates the state through
/// `PreFilterExtensions`).
fn prefilter_counts_pods(pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> bool {
    pod.has_pod_affinity()
        || !pod.topology_spread_constraints.is_empty()
        || !pod.claims.is_empty()
        || nodes.iter().any(|n| n.pods_with_required_anti_affinity > 0)
}

/// One node changed by a simulation: with the attempt's PreFilter state, or with all nodes so that
/// PreFilter can run again over them.
enum Simulated<'a> {
    Shared(&'a CycleState, Arc<NodeInfo>),
    Fresh(Vec<Arc<NodeInfo>>, usize),
}

impl Simulated<'_> {
    fn node(&mut self) -> &mut NodeInfo {
        match self {
            Simulated::Shared(_, node) => Arc::make_mut(node),
            Simulated::Fresh(nodes, i) => Arc::make_mut(&mut nodes[*i]),
        }
    }

    /// Whether the pod fits the node as it is now, the nominated pods counted.
    fn fits(&self, pod: &PodInfo, input: &PostFilterInput<'_>) -> Status {
        match self {
            Simulated::Shared(state, node) => {
                let filters = input.profile.active_filters(state);
                Profile::run_filter_with_nominated(&filters, state, pod, node, input.nominated)
            }
            Simulated::Fresh(nodes, i) => {
                let mut state = CycleState::default();
                let (s, narrowed, _) = input.profile.run_pre_filter(&mut state, pod, nodes);
                if !s.is_success() {
                    return s;
                }
                let node = &nodes[*i];
                if narrowed.is_some_and(|set| !set.contains(node.name())) {
                    return Status::unresolvable(NOT_HELPFUL);
                }
                let filters = input.profile.active_filters(&state);
                Profile::run_filter_with_nominated(&filters, &state, pod, node, input.nominated)
            }
        }
    }
}

/// upstream's `SelectVictimsOnNode`: every lower-priority pod removed, the pod must fit; then each
/// is put back, most important first (those a PodDisruptionBudget protects before the others),
/// and stays if the pod still fits.
fn select_victims(
    input: &PostFilterInput<'_>,
    shared: Option<&CycleState>,
    pod: &PodInfo,
    node: &Arc<NodeInfo>,
    pdbs: &[Arc<PodDisruptionBudget>],
) -> Result<Candidate, Status> {
    let mut potential: Vec<Arc<PodInfo>> = node.pods.iter().filter(|p| p.priority < pod.priority).cloned().collect();
    if potential.is_empty() {
        return Err(Status::unresolvable(NO_VICTIMS));
    }
    let mut sim = match shared {
        Some(state) => Simulated::Shared(state, node.clone()),
        None => {
            let nodes = input.nodes.to_vec();
            let i =
                nodes.iter().position(|n| n.name() == node.name()).ok_or_else(|| Status::unresolvable(NOT_HELPFUL))?;
            Simulated::Fresh(nodes, i)
        }
    };
    for p in &potential {
        sim.node().remove_pod(&p.uid);
    }
    let s = sim.fits(pod, input);
    if !s.is_success() {
        return Err(s);
    }
    potential.sort_by(|a, b| more_important(a, b));
    let (violating, fine) = split_by_budgets(potential, pdbs);
    let mut victims = Vec::new();
    let mut pdb_violations = 0;
    let both = !violating.is_empty() && !fine.is_empty();
    for (p, breaks_budget) in violating.into_iter().map(|p| (p, true)).chain(fine.into_iter().map(|p| (p, false))) {
        sim.node().add_pod(p.clone());
        if !sim.fits(pod, input).is_success() {
            sim.node().remove_pod(&p.uid);
            pdb_violations += usize::from(breaks_budget);
            victims.push(p);
        }
    }
    if both {
        victims.sort_by(|a, b| more_important(a, b));
    }
    Ok(Candidate { node: node.name().to_string(), victims, pdb_violations })
}

/// upstream's `MoreImportantPod` as an ordering, most important first: higher priority, then the
/// earlier start (a pod not started yet counts as starting now).
fn more_important(a: &PodInfo, b: &PodInfo) -> Ordering {
    let now = k8s_openapi::jiff::Timestamp::now();
    b.priority.cmp(&a.priority).then_with(|| a.start_time.unwrap_or(now).cmp(&b.start_time.unwrap_or(now)))
}

/// upstream's `filterPodsWithPDBViolation`: the pods whose removal, in this order, would take a
/// matching budget below zero disruptions allowed, and the others.
fn split_by_budgets(
    pods: Vec<Arc<PodInfo>>,
    pdbs: &[Arc<PodDisruptionBudget>],
) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i32> =
        pdbs.iter().map(|b| b.status.as_ref().and_then(|s| s.disruptions_allowed).unwrap_or(0)).collect();
    let (mut violating, mut fine) = (Vec::new(), Vec::new());
    for pod in pods {
        let mut breaks = false;
        if !pod.labels.is_empty() {
            for (budget, left) in pdbs.iter().zip(allowed.iter_mut()) {
                if budget.metadata.namespace.as_deref() != Some(pod.namespace.as_str()) {
                    continue;
                }
                let selector = budget.spec.as_ref().and_then(|s| s.selector.as_ref());
                let empty = selector.is_none_or(|s| {
                    s.match_labels.as_ref().is_none_or(|m| m.is_empty())
                        && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
                });
                if empty || !label_selector_matches(selector, &pod.labels) {
                    continue;
                }
                let disrupted = budget.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
                if disrupted.is_some_and(|d| d.contains_key(&pod.name)) {
                    continue;
                }
                *left -= 1;
                breaks |= *left < 0;
            }
        }
        if breaks { violating.push(pod) } else { fine.push(pod) }
    }
    (violating, fine)
}

/// upstream's `pickOneNodeForPreemption`: a node needing no victims at once; otherwise the fewest
/// budget violations, then the lowest highest victim priority, the lowest sum of priorities, the
/// fewest victims, and the latest start among the most important victims; then the first.
fn pick(mut candidates: Vec<Candidate>) -> Option<Candidate> {
    if let Some(i) = candidates.iter().position(|c| c.victims.is_empty()) {
        return Some(candidates.swap_remove(i));
    }
    let scores: [fn(&Candidate) -> i64; 5] = [
        |c| -(c.pdb_violations as i64),
        |c| -i64::from(c.victims[0].priority),
        |c| -c.victims.iter().map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1).sum::<i64>(),
        |c| -(c.victims.len() as i64),
        |c| {
            // The earliest start among the highest-priority victims; later is better.
            let top = c.victims[0].priority;
            c.victims
                .iter()
                .filter(|v| v.priority == top)
                .filter_map(|v| v.start_time)
                .min()
                .map_or(i64::MIN, |t| t.as_nanosecond().clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
        },
    ];
    for score in scores {
        if candidates.len() <= 1 {
            break;
        }
        let best = candidates.iter().map(score).max()?;
        candidates.retain(|c| score(c) == best);
    }
    candidates.into_iter().next()
}

#[cfg(test)]
mod tests;
