//! One scheduling attempt for one pod (upstream's `schedulePod`): PreFilter, Filter over as many
//! nodes as needed (in parallel), then PreScore, Score and a random pick among the best.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use rand::Rng;
use rayon::prelude::*;

use super::framework::{Code, CycleState, Nominated, PARALLEL_FROM, Profile, Status};
use super::types::{NodeInfo, PodInfo};

/// Filter at least this many nodes whatever the percentage, and all nodes below it.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
const MIN_FEASIBLE_NODES_PERCENTAGE: usize = 5;
/// Smallest batch of nodes filtered at once once the first batch fell short.
const MIN_BATCH: usize = 32;

/// Why the nodes were rejected.
#[derive(Debug, Default)]
pub struct Diagnosis {
    /// How many checked nodes gave each rejection reason.
    pub reasons: BTreeMap<Cow<'static, str>, usize>,
    /// Number of nodes checked and rejected.
    pub rejected: usize,
    /// Status shared by nodes not checked at all (left out by a PreFilter node set).
    pub absent: Option<Status>,
    /// The message of a PreFilter rejection, which applies to every node.
    pub pre_filter_msg: Option<String>,
    /// Whether that PreFilter rejection was unresolvable (then no node can be helped).
    pub pre_filter_unresolvable: bool,
    /// The nodes rejected as `Unschedulable` (others leaving may make room there).
    pub unschedulable_nodes: BTreeSet<String>,
    /// Plugins that rejected the pod somewhere: they decide which cluster events requeue it.
    pub unschedulable_plugins: BTreeSet<&'static str>,
    /// What PostFilter (preemption) said, appended to the message.
    pub post_filter_msg: Option<String>,
}

impl Diagnosis {
    /// Counts the rejection of the node `name`.
    pub fn record_on(&mut self, name: &str, s: Status) {
        if s.code == Code::Unschedulable {
            self.unschedulable_nodes.insert(name.to_string());
        }
        self.record(s);
    }

    /// The nodes where preemption might help (upstream's `NodesForStatusCode(Unschedulable)`).
    pub fn helpful(&self, all_nodes: &[Arc<NodeInfo>]) -> Vec<Arc<NodeInfo>> {
        match &self.pre_filter_msg {
            Some(_) if self.pre_filter_unresolvable => Vec::new(),
            Some(_) => all_nodes.to_vec(),
            None => all_nodes.iter().filter(|n| self.unschedulable_nodes.contains(n.name())).cloned().collect(),
        }
    }

    /// Whether `node` was rejected as unresolvable (or never considered).
    pub fn unresolvable(&self, node: &str) -> bool {
        match &self.pre_filter_msg {
            Some(_) => self.pre_filter_unresolvable,
            None => !self.unschedulable_nodes.contains(node),
        }
    }

    /// Counts a node's rejection.
    pub fn record(&mut self, s: Status) {
        self.unschedulable_plugins.insert(s.plugin);
        self.rejected += 1;
        for r in s.reasons {
            *self.reasons.entry(r).or_default() += 1;
        }
    }
}

/// No node fits the pod (upstream's `FitError`).
#[derive(Debug)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub diagnosis: Diagnosis,
}

impl fmt::Display for FitError {
    /// `0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector.`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available:", self.num_all_nodes)?;
        if let Some(msg) = &self.diagnosis.pre_filter_msg {
            write!(f, " {msg}.")?;
        } else {
            self.histogram(f)?;
        }
        match &self.diagnosis.post_filter_msg {
            Some(msg) => write!(f, " {msg}"),
            None => Ok(()),
        }
    }
}

impl FitError {
    /// ` 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector.`: how many nodes
    /// gave each reason, nodes left out by a PreFilter counted with its reason.
    fn histogram(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut reasons: BTreeMap<&str, usize> = self.diagnosis.reasons.iter().map(|(r, n)| (r.as_ref(), *n)).collect();
        let checked = self.diagnosis.rejected;
        if let Some(absent) = self.diagnosis.absent.as_ref().filter(|_| checked < self.num_all_nodes) {
            for r in &absent.reasons {
                *reasons.entry(r).or_default() += self.num_all_nodes - checked;
            }
        }
        let mut list: Vec<String> = reasons.into_iter().map(|(r, n)| format!("{n} {r}")).collect();
        list.sort();
        if !list.is_empty() {
            write!(f, " {}.", list.join(", "))?;
        }
        Ok(())
    }
}

/// How an attempt failed.
#[derive(Debug)]
pub enum Failure {
    /// The cluster has no nodes.
    NoNodes,
    /// Every node rejected the pod.
    Unschedulable(Box<FitError>),
    /// Something broke; the pod takes error backoff.
    Error(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NoNodes => f.write_str("no nodes available to schedule pods"),
            Failure::Unschedulable(e) => e.fmt(f),
            Failure::Error(e) => f.write_str(e),
        }
    }
}

/// upstream's `numFeasibleNodesToFind`: all nodes below 100; otherwise `percentage` of them
/// (adaptive when 0: 50% minus 1% per 125 nodes, at least 5%), and never fewer than 100.
pub fn num_feasible_nodes_to_find(percentage: u32, num_all_nodes: usize) -> usize {
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND {
        return num_all_nodes;
    }
    let mut pct = percentage as usize;
    if pct == 0 {
        pct = 50usize.saturating_sub(num_all_nodes / 125).max(MIN_FEASIBLE_NODES_PERCENTAGE);
    }
    (num_all_nodes * pct / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// Finds a node for `pod`. `next_start` rotates where the search starts, so that with partial
/// searches every node gets its turn.
pub fn schedule_pod(
    profile: &Profile,
    state: &mut CycleState,
    pod: &PodInfo,
    all_nodes: &[Arc<NodeInfo>],
    nominated: &Nominated,
    next_start: &mut usize,
) -> Result<String, Failure> {
    if all_nodes.is_empty() {
        return Err(Failure::NoNodes);
    }
    let mut diagnosis = Diagnosis::default();
    let (s, narrowed, narrowed_by) = profile.run_pre_filter(state, pod, all_nodes);
    if !s.is_success() {
        if !s.is_rejected() {
            return Err(Failure::Error(s.message()));
        }
        diagnosis.pre_filter_msg = Some(s.message());
        diagnosis.pre_filter_unresolvable = s.code == Code::UnschedulableAndUnresolvable;
        diagnosis.unschedulable_plugins.insert(s.plugin);
        return Err(Failure::Unschedulable(Box::new(FitError { num_all_nodes: all_nodes.len(), diagnosis })));
    }
    let narrowed_nodes: Vec<Arc<NodeInfo>>;
    let nodes = match &narrowed {
        None => all_nodes,
        Some(names) => {
            narrowed_nodes = all_nodes.iter().filter(|n| names.contains(n.name())).cloned().collect();
            let msg = format!("node(s) didn't satisfy plugin(s) [{}]", narrowed_by.join(" "));
            diagnosis.absent = Some(Status::unresolvable(msg));
            diagnosis.unschedulable_plugins.extend(narrowed_by);
            &narrowed_nodes
        }
    };

    // A pod a preemption made room for tries that node first (upstream's `evaluateNominatedNode`).
    if !pod.nominated_node.is_empty()
        && let Some(node) = nodes.iter().find(|n| n.name() == pod.nominated_node)
    {
        let filters = profile.active_filters(state);
        if Profile::run_filter_with_nominated(&filters, state, pod, node, nominated).is_success() {
            return Ok(pod.nominated_node.clone());
        }
    }
    let feasible = find_feasible(profile, state, pod, nodes, nominated, next_start, &mut diagnosis)?;
    match feasible.len() {
        0 => Err(Failure::Unschedulable(Box::new(FitError { num_all_nodes: all_nodes.len(), diagnosis }))),
        // One feasible node: no need to score.
        1 => Ok(feasible[0].name().to_string()),
        _ => {
            let s = profile.run_pre_score(state, pod, &feasible, all_nodes);
            if !s.is_success() {
                return Err(Failure::Error(s.message()));
            }
            let totals = profile.run_score(state, pod, &feasible).map_err(|s| Failure::Error(s.message()))?;
            Ok(feasible[select_host(&totals, &mut rand::rng())].name().to_string())
        }
    }
}

/// Runs the Filter plugins over `nodes` from `next_start` until enough feasible nodes are found.
fn find_feasible(
    profile: &Profile,
    state: &CycleState,
    pod: &PodInfo,
    nodes: &[Arc<NodeInfo>],
    nominated: &Nominated,
    next_start: &mut usize,
    diagnosis: &mut Diagnosis,
) -> Result<Vec<Arc<NodeInfo>>, Failure> {
    let n = nodes.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let want = num_feasible_nodes_to_find(profile.percentage_of_nodes_to_score, n);
    let start = *next_start % n;
    let filters = profile.active_filters(state);
    let mut feasible = Vec::with_capacity(want);
    let mut processed = 0;
    while processed < n && feasible.len() < want {
        let batch = (want - feasible.len()).max(MIN_BATCH).min(n - processed);
        let check = |i: usize| {
            let node = &nodes[(start + processed + i) % n];
            (node, Profile::run_filter_with_nominated(&filters, state, pod, node, nominated))
        };
        let results: Vec<_> = if let Some(pool) = profile.pool.as_ref().filter(|_| batch >= PARALLEL_FROM) {
            pool.install(|| (0..batch).into_par_iter().map(check).collect())
        } else {
            (0..batch).map(check).collect()
        };
        processed += batch;
        for (node, s) in results {
            match s.code {
                Code::Success if feasible.len() < want => feasible.push(node.clone()),
                Code::Success => {}
                Code::Error => return Err(Failure::Error(s.message())),
                _ => diagnosis.record_on(node.name(), s),
            }
        }
    }
    *next_start = (start + feasible.len() + diagnosis.rejected) % n;
    Ok(feasible)
}

/// The index of a highest total; ties broken uniformly at random (reservoir sampling, as upstream).
fn select_host(totals: &[i64], rng: &mut impl Rng) -> usize {
    let mut best = 0;
    let mut ties = 1;
    for (i, &t) in totals.iter().enumerate().skip(1) {
        if t > totals[best] {
            best = i;
            ties = 1;
        } else if t == totals[best] {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::scheduler::framework::{Enabled, NodeScore, Plugin, Point};
    use crate::scheduler::types::NodeFacts;

    /// Rejects nodes whose name is in `reject` with `reason`; scores by a fixed table.
    struct Fake {
        name: &'static str,
        reject: Vec<&'static str>,
        reason: &'static str,
        scores: HashMap<&'static str, i64>,
    }

    impl Plugin for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn points(&self) -> &'static [Point] {
            &[Point::Filter, Point::Score]
        }
        fn filter(&self, _: &CycleState, _: &PodInfo, node: &NodeInfo) -> Status {
            if self.reject.contains(&node.name()) { Status::unschedulable(self.reason) } else { Status::success() }
        }
        fn score(&self, _: &CycleState, _: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
            Ok(self.scores.get(node.name()).copied().unwrap_or(0))
        }
        fn normalize_score(&self, _: &CycleState, _: &PodInfo, _: &mut [NodeScore<'_>]) -> Status {
            Status::success()
        }
    }

    fn profile(plugins: Vec<Fake>) -> Profile {
        let enabled: Vec<Enabled> =
            plugins.into_iter().map(|p| Enabled { plugin: Arc::new(p) as Arc<dyn Plugin>, weight: 1 }).collect();
        let points = [(Point::Filter, enabled.clone()), (Point::Score, enabled)].into_iter().collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().map(Arc::new).ok();
        Profile { name: "test".into(), points, percentage_of_nodes_to_score: 0, pool }
    }

    fn nodes(names: &[&str]) -> Vec<Arc<NodeInfo>> {
        names.iter().map(|n| Arc::new(NodeInfo::new(NodeFacts { name: n.to_string(), ..Default::default() }))).collect()
    }

    fn fake(name: &'static str, reject: &[&'static str], reason: &'static str, scores: &[(&'static str, i64)]) -> Fake {
        Fake { name, reject: reject.to_vec(), reason, scores: scores.iter().copied().collect() }
    }

    /// One attempt for a plain pod over nodes of these names, nothing nominated.
    fn schedule(p: &Profile, names: &[&str]) -> Result<String, Failure> {
        schedule_pod(p, &mut CycleState::default(), &PodInfo::default(), &nodes(names), &Nominated::default(), &mut 0)
    }

    #[test]
    fn feasible_node_counts_follow_upstream() {
        assert_eq!(num_feasible_nodes_to_find(0, 50), 50);
        assert_eq!(num_feasible_nodes_to_find(0, 1000), 420);
        assert_eq!(num_feasible_nodes_to_find(0, 5000), 500);
        assert_eq!(num_feasible_nodes_to_find(0, 10000), 500);
        assert_eq!(num_feasible_nodes_to_find(0, 150), 100);
        assert_eq!(num_feasible_nodes_to_find(30, 1000), 300);
        assert_eq!(num_feasible_nodes_to_find(100, 1000), 1000);
    }

    #[test]
    fn fit_error_message_has_upstream_form() {
        let p = profile(vec![
            fake("Fit", &["a"], "Insufficient cpu", &[]),
            fake("NodeAffinity", &["b", "c"], "node(s) didn't match Pod's node affinity/selector", &[]),
        ]);
        let err = schedule(&p, &["a", "b", "c"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector."
        );
        let Failure::Unschedulable(fit) = err else { panic!("not a fit error") };
        assert_eq!(fit.diagnosis.unschedulable_plugins.into_iter().collect::<Vec<_>>(), ["Fit", "NodeAffinity"]);
        let none = schedule(&p, &[]).unwrap_err();
        assert_eq!(none.to_string(), "no nodes available to schedule pods");
    }

    #[test]
    fn a_single_feasible_node_is_not_scored() {
        // The scorer would fail the attempt with an out-of-range score, were it asked.
        let p = profile(vec![fake("Odd", &["a", "c"], "no", &[("b", 1000)])]);
        let node = schedule(&p, &["a", "b", "c"]);
        assert_eq!(node.unwrap(), "b");
    }

    #[test]
    fn out_of_range_scores_fail_the_attempt() {
        let p = profile(vec![fake("Odd", &[], "no", &[("a", 101)])]);
        let err = schedule(&p, &["a", "b"]).unwrap_err();
        assert!(matches!(err, Failure::Error(ref m) if m.contains("invalid score 101")), "{err}");
    }

    #[test]
    fn highest_total_wins_and_ties_are_random() {
        let p = profile(vec![fake("S", &[], "", &[("a", 10), ("b", 90), ("c", 90)])]);
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let n = schedule(&p, &["a", "b", "c"]).unwrap();
            seen.insert(n);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["b", "c"]);
    }

    #[test]
    fn partial_search_rotates_the_start() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let all = nodes(&refs);
        let p = profile(vec![fake("S", &[], "", &[])]);
        let mut next = 0;
        let state = CycleState::default();
        let diag = &mut Diagnosis::default();
        let found =
            find_feasible(&p, &state, &PodInfo::default(), &all, &Nominated::default(), &mut next, diag).unwrap();
        assert_eq!(found.len(), 420);
        assert_eq!(next, 420);
        let found =
            find_feasible(&p, &state, &PodInfo::default(), &all, &Nominated::default(), &mut next, diag).unwrap();
        assert_eq!(found[0].name(), "n0420");
        assert_eq!(next, 840);
    }
}
