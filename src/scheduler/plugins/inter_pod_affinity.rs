//! InterPodAffinity: required pod affinity / anti-affinity as a filter (including existing pods'
//! anti-affinity towards the incoming pod) and preferred terms as a score, after upstream's
//! `pkg/scheduler/framework/plugins/interpodaffinity` (filtering.go, scoring.go, plugin.go).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PodAffinityTerm, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use crate::scheduler::framework::{
    ClusterEvent, CycleState, MAX_NODE_SCORE, NodeScore, Plugin, Point, PreFilterResult, Status,
};
use crate::scheduler::types::{Labels, NodeFacts, NodeInfo, PodInfo, label_selector_matches};

/// The plugin's name in profiles and statuses.
pub const NAME: &str = "InterPodAffinity";

/// The incoming pod's affinity terms match no pod in a domain the node belongs to.
pub const ERR_REASON_AFFINITY_RULES_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
/// Pods matching the incoming pod's anti-affinity terms run in the node's domain.
pub const ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH: &str = "node(s) didn't match pod anti-affinity rules";
/// Existing pods' anti-affinity terms reject the incoming pod in the node's domain.
pub const ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

const PRE_FILTER_KEY: &str = "PreFilterInterPodAffinity";
const PRE_SCORE_KEY: &str = "PreScoreInterPodAffinity";

/// Namespace name → its labels (`None` when the namespace does not exist).
pub type NamespaceLabels = Arc<dyn Fn(&str) -> Option<Labels> + Send + Sync>;

/// `InterPodAffinityArgs` of `KubeSchedulerConfiguration`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InterPodAffinityArgs {
    /// Score weight of an existing pod's required affinity term that the incoming pod matches (0..=100).
    pub hard_pod_affinity_weight: i32,
    /// Skips scoring entirely when the incoming pod has no preferred (anti-)affinity terms.
    pub ignore_preferred_terms_of_existing_pods: bool,
}

impl Default for InterPodAffinityArgs {
    fn default() -> Self {
        InterPodAffinityArgs { hard_pod_affinity_weight: 1, ignore_preferred_terms_of_existing_pods: false }
    }
}

/// The InterPodAffinity plugin.
pub struct InterPodAffinity {
    args: InterPodAffinityArgs,
    namespace_labels: Option<NamespaceLabels>,
}

impl InterPodAffinity {
    /// Validates `args` as upstream's `ValidateInterPodAffinityArgs`.
    pub fn new(args: InterPodAffinityArgs) -> Result<Self, String> {
        let w = args.hard_pod_affinity_weight;
        if !(0..=100).contains(&w) {
            return Err(format!("hardPodAffinityWeight: Invalid value: {w}: not in valid range [0, 100]"));
        }
        Ok(InterPodAffinity { args, namespace_labels: None })
    }

    /// Sets the namespace label lookup that terms with a non-empty `namespaceSelector` need.
    /// Without it such a selector matches no namespace.
    pub fn with_namespace_labels(mut self, lookup: NamespaceLabels) -> Self {
        self.namespace_labels = Some(lookup);
        self
    }

    fn namespaces(&self) -> Namespaces<'_> {
        Namespaces { lookup: self.namespace_labels.as_ref(), cache: RefCell::default() }
    }
}

/// Namespace labels looked up at most once per namespace within one call.
struct Namespaces<'a> {
    lookup: Option<&'a NamespaceLabels>,
    cache: RefCell<HashMap<String, Option<Labels>>>,
}

impl Namespaces<'_> {
    fn selector_matches(&self, selector: &LabelSelector, namespace: &str) -> bool {
        let Some(lookup) = self.lookup else { return false };
        let mut cache = self.cache.borrow_mut();
        if !cache.contains_key(namespace) {
            cache.insert(namespace.to_string(), lookup(namespace));
        }
        cache.get(namespace).and_then(Option::as_ref).is_some_and(|l| label_selector_matches(Some(selector), l))
    }
}

/// One pod (anti-)affinity term of `owner`, resolved as upstream's `framework.AffinityTerm`.
struct Term<'a> {
    /// The owner's namespace, when the term names neither namespaces nor a namespace selector.
    own_namespace: Option<&'a str>,
    namespaces: &'a [String],
    /// `None` selects no namespace; an empty selector selects all.
    namespace_selector: Option<&'a LabelSelector>,
    selector: Option<&'a LabelSelector>,
    topology_key: &'a str,
    weight: i64,
}

impl<'a> Term<'a> {
    fn new(owner: &'a PodInfo, term: &'a PodAffinityTerm, weight: i32) -> Self {
        let namespaces = term.namespaces.as_deref().unwrap_or_default();
        let defaulted = namespaces.is_empty() && term.namespace_selector.is_none();
        Term {
            own_namespace: defaulted.then_some(owner.namespace.as_str()),
            namespaces,
            namespace_selector: term.namespace_selector.as_ref(),
            selector: term.label_selector.as_ref(),
            topology_key: &term.topology_key,
            weight: weight.into(),
        }
    }

    /// Whether `pod` is in one of the term's namespaces and matches its label selector.
    fn matches(&self, pod: &PodInfo, ns: &Namespaces<'_>) -> bool {
        let in_namespace = self.own_namespace == Some(pod.namespace.as_str())
            || self.namespaces.contains(&pod.namespace)
            || self.namespace_selector.is_some_and(|s| selector_is_empty(s) || ns.selector_matches(s, &pod.namespace));
        in_namespace && self.selects_labels(pod)
    }

    /// The label selector alone (a superset of [`Term::matches`], for queueing hints).
    fn selects_labels(&self, pod: &PodInfo) -> bool {
        label_selector_matches(self.selector, &pod.labels)
    }
}

fn selector_is_empty(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty()) && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// Which of a pod's (anti-)affinity term lists.
#[derive(Clone, Copy)]
enum Kind {
    Required,
    RequiredAnti,
    Preferred,
    PreferredAnti,
}

/// One of `pod`'s term lists, resolved.
fn terms(pod: &PodInfo, kind: Kind) -> Vec<Term<'_>> {
    fn required<'a>(pod: &'a PodInfo, list: Option<&'a Vec<PodAffinityTerm>>) -> Vec<Term<'a>> {
        list.into_iter().flatten().map(|t| Term::new(pod, t, 1)).collect()
    }
    fn preferred<'a>(pod: &'a PodInfo, list: Option<&'a Vec<WeightedPodAffinityTerm>>) -> Vec<Term<'a>> {
        list.into_iter().flatten().map(|w| Term::new(pod, &w.pod_affinity_term, w.weight)).collect()
    }
    let Some(a) = pod.affinity.as_ref() else { return Vec::new() };
    let affinity = a.pod_affinity.as_ref();
    let anti = a.pod_anti_affinity.as_ref();
    match kind {
        Kind::Required => {
            required(pod, affinity.and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()))
        }
        Kind::RequiredAnti => {
            required(pod, anti.and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()))
        }
        Kind::Preferred => {
            preferred(pod, affinity.and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref()))
        }
        Kind::PreferredAnti => {
            preferred(pod, anti.and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref()))
        }
    }
}

/// Whether `pod` matches every term; false for no terms (upstream's `podMatchesAllAffinityTerms`).
fn matches_all(terms: &[Term<'_>], pod: &PodInfo, ns: &Namespaces<'_>) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, ns))
}

/// Topology key → topology value → count or score.
type TopologyCounts = HashMap<String, HashMap<String, i64>>;

/// Adds `delta` to the node's domain for `key`; nodes without the label have no domain.
fn bump(counts: &mut TopologyCounts, node: &NodeFacts, key: &str, delta: i64) {
    let Some(value) = node.labels.get(key) else { return };
    let values = match counts.get_mut(key) {
        Some(v) => v,
        None => counts.entry(key.to_string()).or_default(),
    };
    match values.get_mut(value) {
        Some(c) => *c += delta,
        None => {
            values.insert(value.clone(), delta);
        }
    }
}

fn count(counts: &TopologyCounts, key: &str, value: &str) -> i64 {
    counts.get(key).and_then(|v| v.get(value)).copied().unwrap_or(0)
}

/// Pods the scheduler counts: upstream's informers never see Succeeded/Failed pods.
fn live_pods(node: &NodeInfo) -> impl Iterator<Item = &PodInfo> {
    node.pods.iter().map(|p| p.as_ref()).filter(|p| !p.finished)
}

/// Counts computed at PreFilter and read by Filter.
struct PreFilterState {
    /// Domains with existing pods whose required anti-affinity terms match the incoming pod.
    existing_anti_affinity: TopologyCounts,
    /// Domains with existing pods matching all the incoming pod's required affinity terms.
    affinity: TopologyCounts,
    /// Domains with existing pods matching the incoming pod's required anti-affinity terms.
    anti_affinity: TopologyCounts,
    /// Whether the incoming pod matches all its own required affinity terms.
    self_match: bool,
}

impl InterPodAffinity {
    fn satisfies_pod_affinity(s: &PreFilterState, pod: &PodInfo, node: &NodeFacts) -> bool {
        let mut pods_exist = true;
        for t in terms(pod, Kind::Required) {
            let Some(value) = node.labels.get(t.topology_key) else { return false };
            if count(&s.affinity, t.topology_key, value) <= 0 {
                pods_exist = false;
            }
        }
        // The first pod of a group with affinity to itself may go to any node with the topology
        // keys as long as no pod anywhere matches its terms.
        pods_exist || (s.affinity.is_empty() && s.self_match)
    }

    fn satisfies_pod_anti_affinity(s: &PreFilterState, pod: &PodInfo, node: &NodeFacts) -> bool {
        s.anti_affinity.is_empty()
            || terms(pod, Kind::RequiredAnti).iter().all(|t| {
                node.labels.get(t.topology_key).is_none_or(|v| count(&s.anti_affinity, t.topology_key, v) <= 0)
            })
    }

    fn satisfies_existing_pods_anti_affinity(s: &PreFilterState, node: &NodeFacts) -> bool {
        s.existing_anti_affinity.is_empty()
            || node.labels.iter().all(|(k, v)| count(&s.existing_anti_affinity, k, v) <= 0)
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter, Point::PreScore, Point::Score]
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> (Status, PreFilterResult) {
        let ns = self.namespaces();
        let affinity_terms = terms(pod, Kind::Required);
        let anti_terms = terms(pod, Kind::RequiredAnti);

        let mut existing_anti_affinity = TopologyCounts::new();
        for node in nodes.iter().filter(|n| n.pods_with_required_anti_affinity > 0) {
            for existing in live_pods(node).filter(|p| p.has_required_anti_affinity()) {
                for t in terms(existing, Kind::RequiredAnti) {
                    if t.matches(pod, &ns) {
                        bump(&mut existing_anti_affinity, &node.node, t.topology_key, 1);
                    }
                }
            }
        }

        let mut affinity = TopologyCounts::new();
        let mut anti_affinity = TopologyCounts::new();
        if !affinity_terms.is_empty() || !anti_terms.is_empty() {
            for node in nodes {
                for existing in live_pods(node) {
                    if matches_all(&affinity_terms, existing, &ns) {
                        for t in &affinity_terms {
                            bump(&mut affinity, &node.node, t.topology_key, 1);
                        }
                    }
                    for t in anti_terms.iter().filter(|t| t.matches(existing, &ns)) {
                        bump(&mut anti_affinity, &node.node, t.topology_key, 1);
                    }
                }
            }
        }

        if existing_anti_affinity.is_empty() && affinity_terms.is_empty() && anti_terms.is_empty() {
            return (Status::skip(), None);
        }
        let self_match = matches_all(&affinity_terms, pod, &ns);
        state.write(PRE_FILTER_KEY, PreFilterState { existing_anti_affinity, affinity, anti_affinity, self_match });
        (Status::success(), None)
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_KEY) else {
            return Status::error(format!("reading {PRE_FILTER_KEY:?} from cycleState: not found"));
        };
        if !Self::satisfies_pod_affinity(s, pod, &node.node) {
            return Status::unresolvable(ERR_REASON_AFFINITY_RULES_NOT_MATCH);
        }
        if !Self::satisfies_pod_anti_affinity(s, pod, &node.node) {
            return Status::unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH);
        }
        if !Self::satisfies_existing_pods_anti_affinity(s, &node.node) {
            return Status::unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH);
        }
        Status::success()
    }

    /// Sums, per topology domain, the weights of preferred terms between the incoming pod and the
    /// pods already there (plus `hardPodAffinityWeight` per existing required affinity term the
    /// incoming pod matches), over every node of the snapshot.
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        all_nodes: &[Arc<NodeInfo>],
    ) -> Status {
        let preferred_affinity = terms(pod, Kind::Preferred);
        let preferred_anti = terms(pod, Kind::PreferredAnti);
        let has_constraints = !preferred_affinity.is_empty() || !preferred_anti.is_empty();
        if self.args.ignore_preferred_terms_of_existing_pods && !has_constraints {
            return Status::skip();
        }
        let ns = self.namespaces();
        let hard_weight = i64::from(self.args.hard_pod_affinity_weight);

        let mut scores = TopologyCounts::new();
        for node in all_nodes {
            let facts = &node.node;
            if facts.labels.is_empty() || (!has_constraints && node.pods_with_affinity == 0) {
                continue;
            }
            // Without preferred terms of its own, only existing pods' terms can score.
            for existing in live_pods(node).filter(|p| has_constraints || p.has_pod_affinity()) {
                for t in preferred_affinity.iter().filter(|t| t.matches(existing, &ns)) {
                    bump(&mut scores, facts, t.topology_key, t.weight);
                }
                for t in preferred_anti.iter().filter(|t| t.matches(existing, &ns)) {
                    bump(&mut scores, facts, t.topology_key, -t.weight);
                }
                if !existing.has_pod_affinity() {
                    continue;
                }
                if hard_weight > 0 {
                    for t in terms(existing, Kind::Required).iter().filter(|t| t.matches(pod, &ns)) {
                        bump(&mut scores, facts, t.topology_key, hard_weight);
                    }
                }
                for t in terms(existing, Kind::Preferred).iter().filter(|t| t.matches(pod, &ns)) {
                    bump(&mut scores, facts, t.topology_key, t.weight);
                }
                for t in terms(existing, Kind::PreferredAnti).iter().filter(|t| t.matches(pod, &ns)) {
                    bump(&mut scores, facts, t.topology_key, -t.weight);
                }
            }
        }
        if scores.is_empty() {
            return Status::skip();
        }
        state.write(PRE_SCORE_KEY, scores);
        Status::success()
    }

    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(scores) = state.read::<TopologyCounts>(PRE_SCORE_KEY) else {
            return Err(Status::error(format!("reading {PRE_SCORE_KEY:?} from cycleState: not found")));
        };
        Ok(node.node.labels.iter().map(|(k, v)| count(scores, k, v)).sum())
    }

    /// Min–max scaling into 0..=100 (all 0 when every node scored the same), as upstream.
    fn normalize_score(&self, state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore<'_>]) -> Status {
        let Some(topology) = state.read::<TopologyCounts>(PRE_SCORE_KEY) else {
            return Status::error(format!("reading {PRE_SCORE_KEY:?} from cycleState: not found"));
        };
        if topology.is_empty() {
            return Status::success();
        }
        let min = scores.iter().map(|s| s.score).min().unwrap_or(0);
        let max = scores.iter().map(|s| s.score).max().unwrap_or(0);
        let diff = max - min;
        for s in scores.iter_mut() {
            let f = if diff > 0 { MAX_NODE_SCORE as f64 * ((s.score - min) as f64 / diff as f64) } else { 0.0 };
            s.score = f as i64;
        }
        Status::success()
    }

    /// Conservative: only events that cannot change any of the three filter checks are skipped.
    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        let affinity_terms = terms(pod, Kind::Required);
        let anti_terms = terms(pod, Kind::RequiredAnti);
        let selects_all =
            |p: &PodInfo| !affinity_terms.is_empty() && affinity_terms.iter().all(|t| t.selects_labels(p));
        match event {
            // A new node passes the affinity check only if it has every topology key.
            ClusterEvent::NodeAdded(node) => {
                affinity_terms.iter().all(|t| node.node.labels.contains_key(t.topology_key))
            }
            ClusterEvent::NodeChanged(_) => true,
            // Fewer nodes never satisfy more affinity.
            ClusterEvent::NodeRemoved(_) | ClusterEvent::StorageChanged => false,
            // An added pod may satisfy the affinity terms; a changed one may have dropped the
            // labels the anti-affinity terms select.
            ClusterEvent::AssignedPodAdded { pod: p, .. } => !anti_terms.is_empty() || selects_all(p),
            // A removed pod may have been the conflict (either direction), or the only pod
            // matching the affinity terms of a pod that matches them itself.
            ClusterEvent::AssignedPodRemoved { pod: p, .. } => {
                p.has_required_anti_affinity() || anti_terms.iter().any(|t| t.selects_labels(p)) || selects_all(p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> NodeInfo {
        NodeInfo::from_json(json!({"metadata": {"name": name, "labels": labels}}))
    }

    fn pod_in(ns: &str, name: &str, labels: Value, affinity: Value) -> PodInfo {
        let p = json!({
            "metadata": {"name": name, "namespace": ns, "uid": name, "labels": labels},
            "spec": {"containers": [{"name": "c"}], "affinity": affinity},
        });
        PodInfo::from_json(p)
    }

    fn pod(name: &str, labels: Value, affinity: Value) -> PodInfo {
        pod_in("default", name, labels, affinity)
    }

    fn place(node: &mut NodeInfo, pod: PodInfo) {
        let name = node.name().to_string();
        node.add_pod(Arc::new(pod.on_node(&name)));
    }

    fn term(selector: Value, key: &str) -> Value {
        json!({"labelSelector": {"matchLabels": selector}, "topologyKey": key})
    }

    fn required(kind: &str, terms: Value) -> Value {
        json!({kind: {"requiredDuringSchedulingIgnoredDuringExecution": terms}})
    }

    fn plugin() -> InterPodAffinity {
        InterPodAffinity::new(InterPodAffinityArgs::default()).unwrap()
    }

    /// Filter outcome per node (`None` = passes), after PreFilter over all `nodes`.
    fn filter(pl: &InterPodAffinity, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> Vec<Option<(Code, String)>> {
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
                (!s.is_success()).then(|| (s.code, s.message()))
            })
            .collect()
    }

    fn zones() -> Vec<NodeInfo> {
        vec![
            node("n1", json!({"zone": "a", "kubernetes.io/hostname": "n1"})),
            node("n2", json!({"zone": "a", "kubernetes.io/hostname": "n2"})),
            node("n3", json!({"zone": "b", "kubernetes.io/hostname": "n3"})),
            node("n4", json!({"kubernetes.io/hostname": "n4"})),
        ]
    }

    fn arcs(nodes: Vec<NodeInfo>) -> Vec<Arc<NodeInfo>> {
        nodes.into_iter().map(Arc::new).collect()
    }

    const AFFINITY: Option<(Code, &str)> =
        Some((Code::UnschedulableAndUnresolvable, ERR_REASON_AFFINITY_RULES_NOT_MATCH));
    const ANTI: Option<(Code, &str)> = Some((Code::Unschedulable, ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH));
    const EXISTING: Option<(Code, &str)> =
        Some((Code::Unschedulable, ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH));

    fn expect(got: Vec<Option<(Code, String)>>, want: &[Option<(Code, &str)>]) {
        let got: Vec<_> = got.iter().map(|o| o.as_ref().map(|(c, m)| (*c, m.as_str()))).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn required_affinity_satisfied_only_in_the_matching_zone() {
        let mut nodes = zones();
        place(&mut nodes[0], pod("db", json!({"app": "db"}), Value::Null));
        let nodes = arcs(nodes);
        let web =
            pod("web", json!({"app": "web"}), required("podAffinity", json!([term(json!({"app": "db"}), "zone")])));
        // n2 shares zone a with the db pod; n3's zone has none; n4 has no zone at all.
        expect(filter(&plugin(), &web, &nodes), &[None, None, AFFINITY, AFFINITY]);

        // The db pod is in another namespace: the term only looks in the pod's own.
        let mut nodes = zones();
        place(&mut nodes[0], pod_in("prod", "db", json!({"app": "db"}), Value::Null));
        let nodes = arcs(nodes);
        expect(filter(&plugin(), &web, &nodes), &[AFFINITY, AFFINITY, AFFINITY, AFFINITY]);
        let listed =
            json!({"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone", "namespaces": ["prod"]});
        let web = pod("web", json!({"app": "web"}), required("podAffinity", json!([listed])));
        expect(filter(&plugin(), &web, &nodes), &[None, None, AFFINITY, AFFINITY]);
    }

    #[test]
    fn all_affinity_terms_must_match_one_pod() {
        let mut nodes = zones();
        place(&mut nodes[0], pod("db", json!({"app": "db"}), Value::Null));
        place(&mut nodes[2], pod("cache", json!({"tier": "cache"}), Value::Null));
        let nodes = arcs(nodes);
        let terms = json!([term(json!({"app": "db"}), "zone"), term(json!({"tier": "cache"}), "zone")]);
        let web = pod("web", json!({"app": "web"}), required("podAffinity", terms));
        expect(filter(&plugin(), &web, &nodes), &[AFFINITY, AFFINITY, AFFINITY, AFFINITY]);
    }

    #[test]
    fn anti_affinity_against_existing_pods() {
        let mut nodes = zones();
        place(&mut nodes[0], pod("db", json!({"app": "db"}), Value::Null));
        let nodes = arcs(nodes);
        let host = pod(
            "web",
            json!({"app": "web"}),
            required("podAntiAffinity", json!([term(json!({"app": "db"}), "kubernetes.io/hostname")])),
        );
        expect(filter(&plugin(), &host, &nodes), &[ANTI, None, None, None]);
        let zone =
            pod("web", json!({"app": "web"}), required("podAntiAffinity", json!([term(json!({"app": "db"}), "zone")])));
        // n4 has no zone label, so no domain to conflict in.
        expect(filter(&plugin(), &zone, &nodes), &[ANTI, ANTI, None, None]);
    }

    #[test]
    fn existing_pods_anti_affinity_rejects_the_incoming_pod() {
        let mut nodes = zones();
        let guard = pod(
            "guard",
            json!({"app": "guard"}),
            required("podAntiAffinity", json!([term(json!({"app": "web"}), "zone")])),
        );
        place(&mut nodes[0], guard);
        let nodes = arcs(nodes);
        let web = pod("web", json!({"app": "web"}), Value::Null);
        expect(filter(&plugin(), &web, &nodes), &[EXISTING, EXISTING, None, None]);

        // Nothing applies to a pod the guard does not select: PreFilter skips.
        let api = pod("api", json!({"app": "api"}), Value::Null);
        let (s, _) = plugin().pre_filter(&mut CycleState::default(), &api, &nodes);
        assert_eq!(s.code, Code::Skip);
    }

    #[test]
    fn first_pod_with_affinity_to_itself() {
        let web =
            pod("web", json!({"app": "web"}), required("podAffinity", json!([term(json!({"app": "web"}), "zone")])));
        // No pod anywhere matches: any node with the topology key will do.
        expect(filter(&plugin(), &web, &arcs(zones())), &[None, None, None, AFFINITY]);
        // Once one exists, the pod must follow it.
        let mut nodes = zones();
        place(&mut nodes[2], pod("web-0", json!({"app": "web"}), Value::Null));
        expect(filter(&plugin(), &web, &arcs(nodes)), &[AFFINITY, AFFINITY, None, AFFINITY]);
        // A pod that does not match its own terms gets no such exception.
        let other =
            pod("x", json!({"app": "x"}), required("podAffinity", json!([term(json!({"app": "web"}), "zone")])));
        expect(filter(&plugin(), &other, &arcs(zones())), &[AFFINITY, AFFINITY, AFFINITY, AFFINITY]);
    }

    #[test]
    fn namespace_selectors() {
        let mut nodes = zones();
        place(&mut nodes[0], pod_in("prod", "db", json!({"app": "db"}), Value::Null));
        let nodes = arcs(nodes);
        let by_selector = |ns_selector: Value| {
            let t = json!({"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone", "namespaceSelector": ns_selector});
            pod("web", json!({"app": "web"}), required("podAffinity", json!([t])))
        };
        let team = by_selector(json!({"matchLabels": {"team": "a"}}));
        // Without namespace labels a non-empty selector matches nothing.
        expect(filter(&plugin(), &team, &nodes), &[AFFINITY, AFFINITY, AFFINITY, AFFINITY]);
        let lookup: NamespaceLabels =
            Arc::new(|ns: &str| (ns == "prod").then(|| [("team".to_string(), "a".to_string())].into()));
        let pl = plugin().with_namespace_labels(lookup);
        expect(filter(&pl, &team, &nodes), &[None, None, AFFINITY, AFFINITY]);
        // An empty selector selects every namespace.
        expect(filter(&plugin(), &by_selector(json!({})), &nodes), &[None, None, AFFINITY, AFFINITY]);
    }

    /// Raw and normalized scores of the `feasible` nodes, `None` when PreScore skips.
    fn scores(
        pl: &InterPodAffinity,
        pod: &PodInfo,
        all: &[Arc<NodeInfo>],
        feasible: &[Arc<NodeInfo>],
    ) -> Option<(Vec<i64>, Vec<i64>)> {
        let mut state = CycleState::default();
        pl.pre_filter(&mut state, pod, all);
        let s = pl.pre_score(&mut state, pod, feasible, all);
        if s.code == Code::Skip {
            return None;
        }
        assert!(s.is_success(), "{s}");
        let mut list: Vec<_> =
            feasible.iter().map(|n| NodeScore { name: n.name(), score: pl.score(&state, pod, n).unwrap() }).collect();
        let raw = list.iter().map(|s| s.score).collect();
        assert!(pl.normalize_score(&state, pod, &mut list).is_success());
        Some((raw, list.iter().map(|s| s.score).collect()))
    }

    fn three_zones() -> Vec<NodeInfo> {
        ["a", "b", "c"].iter().enumerate().map(|(i, z)| node(&format!("n{}", i + 1), json!({"zone": z}))).collect()
    }

    #[test]
    fn preferred_affinity_scores_min_max_normalized() {
        let mut nodes = three_zones();
        for (i, count) in [1, 3, 5].into_iter().enumerate() {
            for j in 0..count {
                place(&mut nodes[i], pod(&format!("db-{i}-{j}"), json!({"app": "db"}), Value::Null));
            }
        }
        let nodes = arcs(nodes);
        let pref = json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 2, "podAffinityTerm": term(json!({"app": "db"}), "zone")}]}});
        let web = pod("web", json!({"app": "web"}), pref);
        // 1, 3 and 5 matching pods at weight 2: 2, 6, 10 → (s − 2)/(10 − 2) · 100.
        assert_eq!(scores(&plugin(), &web, &nodes, &nodes), Some((vec![2, 6, 10], vec![0, 50, 100])));
    }

    #[test]
    fn anti_affinity_and_existing_pods_terms_score() {
        let mut nodes = three_zones();
        place(&mut nodes[0], pod("cache", json!({"app": "cache"}), Value::Null));
        let wants_web = required("podAffinity", json!([term(json!({"app": "web"}), "zone")]));
        place(&mut nodes[1], pod("sidecar", json!({"app": "sidecar"}), wants_web));
        let avoids_web = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 3, "podAffinityTerm": term(json!({"app": "web"}), "zone")}]}});
        place(&mut nodes[2], pod("loner", json!({"app": "loner"}), avoids_web));
        let nodes = arcs(nodes);
        let pref = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": term(json!({"app": "cache"}), "zone")}]}});
        let web = pod("web", json!({"app": "web"}), pref);
        // Zone a: −5 (own preferred anti-affinity); b: +1 (hardPodAffinityWeight of the sidecar's
        // required term); c: −3 (the loner's preferred anti-affinity). min −5, max 1:
        // 0, 100, 2/6·100 = 33.
        assert_eq!(scores(&plugin(), &web, &nodes, &nodes), Some((vec![-5, 1, -3], vec![0, 100, 33])));

        let args = InterPodAffinityArgs { hard_pod_affinity_weight: 10, ..Default::default() };
        let pl = InterPodAffinity::new(args).unwrap();
        // b: +10 now; min −5, max 10: 0, 100, 2/15·100 = 13.
        assert_eq!(scores(&pl, &web, &nodes, &nodes), Some((vec![-5, 10, -3], vec![0, 100, 13])));

        // Without preferred terms of its own, the pod is scored by existing pods' terms only …
        let plain = pod("web", json!({"app": "web"}), Value::Null);
        assert_eq!(scores(&plugin(), &plain, &nodes, &nodes), Some((vec![0, 1, -3], vec![75, 100, 0])));
        // … unless told to skip that.
        let args = InterPodAffinityArgs { ignore_preferred_terms_of_existing_pods: true, ..Default::default() };
        assert_eq!(scores(&InterPodAffinity::new(args).unwrap(), &plain, &nodes, &nodes), None);
        // Nothing to score at all: skip.
        let nodes = arcs(three_zones());
        assert_eq!(scores(&plugin(), &plain, &nodes, &nodes), None);
    }

    #[test]
    fn scores_count_pods_on_infeasible_nodes() {
        let mut nodes = three_zones();
        nodes.push(node("n4", json!({"zone": "a"})));
        place(&mut nodes[3], pod("db", json!({"app": "db"}), Value::Null));
        let nodes = arcs(nodes);
        let pref = json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 7, "podAffinityTerm": term(json!({"app": "db"}), "zone")}]}});
        let web = pod("web", json!({"app": "web"}), pref);
        assert_eq!(scores(&plugin(), &web, &nodes, &nodes[..3]), Some((vec![7, 0, 0], vec![100, 0, 0])));
    }

    #[test]
    fn args_defaults_and_validation() {
        let args: InterPodAffinityArgs = serde_json::from_value(json!({})).unwrap();
        assert_eq!(
            args,
            InterPodAffinityArgs { hard_pod_affinity_weight: 1, ignore_preferred_terms_of_existing_pods: false }
        );
        let args: InterPodAffinityArgs = serde_json::from_value(json!({"hardPodAffinityWeight": 101})).unwrap();
        let err = InterPodAffinity::new(args).err().unwrap();
        assert_eq!(err, "hardPodAffinityWeight: Invalid value: 101: not in valid range [0, 100]");
        assert!(
            InterPodAffinity::new(InterPodAffinityArgs { hard_pod_affinity_weight: 0, ..Default::default() }).is_ok()
        );
    }

    #[test]
    fn requeue_hints() {
        let pl = plugin();
        let nodes = arcs(zones());
        let web =
            pod("web", json!({"app": "web"}), required("podAffinity", json!([term(json!({"app": "db"}), "zone")])));
        let added = |p: PodInfo| ClusterEvent::AssignedPodAdded { pod: Arc::new(p) };
        let removed = |p: PodInfo| ClusterEvent::AssignedPodRemoved { pod: Arc::new(p), node: nodes[0].clone() };
        assert!(pl.requeue(&web, &added(pod("db", json!({"app": "db"}), Value::Null))));
        assert!(!pl.requeue(&web, &added(pod("x", json!({"app": "x"}), Value::Null))));
        assert!(!pl.requeue(&web, &removed(pod("db", json!({"app": "x"}), Value::Null))));
        assert!(pl.requeue(&web, &ClusterEvent::NodeAdded(nodes[0].clone())));
        assert!(!pl.requeue(&web, &ClusterEvent::NodeAdded(nodes[3].clone())));
        assert!(pl.requeue(&web, &ClusterEvent::NodeChanged(nodes[3].clone())));

        let plain = pod("web", json!({"app": "web"}), Value::Null);
        let guard = pod(
            "guard",
            json!({"app": "guard"}),
            required("podAntiAffinity", json!([term(json!({"app": "web"}), "zone")])),
        );
        assert!(pl.requeue(&plain, &removed(guard)));
        assert!(!pl.requeue(&plain, &added(pod("db", json!({"app": "db"}), Value::Null))));
        let anti =
            pod("web", json!({"app": "web"}), required("podAntiAffinity", json!([term(json!({"app": "db"}), "zone")])));
        assert!(pl.requeue(&anti, &removed(pod("db", json!({"app": "db"}), Value::Null))));
        assert!(pl.requeue(&anti, &added(pod("db", json!({"app": "db"}), Value::Null))));
    }
}
