use std::collections::HashMap;

use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};

use super::*;
use crate::scheduler::algorithm::Diagnosis;
use crate::scheduler::framework::{Enabled, Nominated};
use crate::scheduler::plugins::fit::Fit;

fn pod(name: &str, priority: i32, cpu: &str, labels: Value, started: &str) -> PodInfo {
    PodInfo::from_json(json!({
        "metadata": {"name": name, "uid": name, "namespace": "default", "labels": labels},
        "spec": {"priority": priority,
            "containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"startTime": started},
    }))
}

fn node(name: &str, cpu: &str, pods: &[PodInfo]) -> Arc<NodeInfo> {
    let mut info = NodeInfo::from_json(
        json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "pods": "110"}}}),
    );
    for p in pods {
        info.add_pod(Arc::new(p.on_node(name)));
    }
    Arc::new(info)
}

fn budgets(pdbs: Vec<Value>) -> Store<PodDisruptionBudget> {
    let (store, mut writer) = reflector::store();
    for b in pdbs {
        writer.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(b).unwrap()));
    }
    store
}

fn profile(pdbs: Vec<Value>) -> Profile {
    let fit: Arc<dyn Plugin> = Arc::new(Fit::new(Default::default()).unwrap());
    let preemption: Arc<dyn Plugin> = Arc::new(DefaultPreemption::new(Args::default(), budgets(pdbs)).unwrap());
    let points = [
        (Point::Filter, vec![Enabled { plugin: fit, weight: 1 }]),
        (Point::PostFilter, vec![Enabled { plugin: preemption, weight: 1 }]),
    ];
    Profile {
        name: "test".into(),
        points: points.into_iter().collect::<HashMap<_, _>>(),
        percentage_of_nodes_to_score: 0,
        pool: None,
    }
}

/// Runs the profile's PostFilter as the scheduler does after every node rejected `p`.
fn preempt(profile: &Profile, p: &PodInfo, nodes: &[Arc<NodeInfo>]) -> PostFilterResult {
    let mut diagnosis = Diagnosis::default();
    let state = CycleState::default();
    let filters = profile.active_filters(&state);
    for n in nodes {
        let s = Profile::run_filter(&filters, &state, p, n);
        assert!(!s.is_success(), "{} fits {}", p.name, n.name());
        diagnosis.record_on(n.name(), s);
    }
    let nominated = Nominated::default();
    let input = PostFilterInput {
        profile,
        nodes,
        helpful: diagnosis.helpful(nodes),
        nominated_node_unresolvable: false,
        nominated: &nominated,
    };
    profile.run_post_filter(&state, p, &input)
}

fn victims(result: &PostFilterResult) -> (String, Vec<&str>) {
    let n = result.1.as_ref().expect("a nomination");
    (n.node.clone(), n.victims.iter().map(|v| v.name.as_str()).collect())
}

const EARLY: &str = "2026-01-01T00:00:00Z";
const LATE: &str = "2026-06-01T00:00:00Z";

#[test]
fn the_least_important_pods_go_and_the_others_are_put_back() {
    let p = profile(vec![]);
    let nodes = [node(
        "n1",
        "3",
        &[
            pod("low", 1, "1", json!({}), EARLY),
            pod("mid", 5, "1", json!({}), EARLY),
            pod("high", 100, "1", json!({}), EARLY),
        ],
    )];
    let r = preempt(&p, &pod("new", 10, "1", json!({}), LATE), &nodes);
    assert!(r.0.is_success(), "{}", r.0);
    assert_eq!(victims(&r), ("n1".into(), vec!["low"]));
    // Two cores needed: both lower pods go, the more important first.
    let r = preempt(&p, &pod("new", 10, "2", json!({}), LATE), &nodes);
    assert_eq!(victims(&r), ("n1".into(), vec!["mid", "low"]));
}

#[test]
fn nodes_are_chosen_by_upstreams_order() {
    let p = profile(vec![]);
    // The lowest highest-victim priority wins.
    let nodes = [
        node("a", "1", &[pod("a1", 5, "1", json!({}), EARLY)]),
        node("b", "1", &[pod("b1", 3, "1", json!({}), EARLY)]),
    ];
    assert_eq!(victims(&preempt(&p, &pod("new", 10, "1", json!({}), LATE), &nodes)).0, "b");
    // Same priorities: the fewest victims.
    let nodes = [
        node("a", "2", &[pod("a1", 3, "1", json!({}), EARLY), pod("a2", 3, "1", json!({}), EARLY)]),
        node("b", "2", &[pod("b1", 3, "2", json!({}), EARLY)]),
    ];
    assert_eq!(victims(&preempt(&p, &pod("new", 10, "2", json!({}), LATE), &nodes)).0, "b");
    // Then the latest started.
    let nodes =
        [node("a", "1", &[pod("a1", 3, "1", json!({}), EARLY)]), node("b", "1", &[pod("b1", 3, "1", json!({}), LATE)])];
    assert_eq!(victims(&preempt(&p, &pod("new", 10, "1", json!({}), LATE), &nodes)).0, "b");
}

#[test]
fn a_disruption_budget_shifts_the_choice() {
    let budget = json!({"metadata": {"name": "keep", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}});
    let nodes = [
        node("a", "1", &[pod("db", 1, "1", json!({"app": "db"}), EARLY)]),
        node("b", "1", &[pod("web", 5, "1", json!({"app": "web"}), EARLY)]),
    ];
    let new = pod("new", 10, "1", json!({}), LATE);
    // Without the budget the lower-priority db pod goes; with it, web does.
    assert_eq!(victims(&preempt(&profile(vec![]), &new, &nodes)), ("a".into(), vec!["db"]));
    assert_eq!(victims(&preempt(&profile(vec![budget.clone()]), &new, &nodes)), ("b".into(), vec!["web"]));
    // Where only the protected pod can go, it still goes: a budget is respected where possible.
    assert_eq!(victims(&preempt(&profile(vec![budget]), &new, &nodes[..1])), ("a".into(), vec!["db"]));
}

#[test]
fn no_preemption_when_it_cannot_help_or_is_not_allowed() {
    let p = profile(vec![]);
    // On a, nothing has a lower priority; on b, removing what has still leaves too little.
    let nodes = [
        node("a", "2", &[pod("same", 10, "1", json!({}), EARLY)]),
        node("b", "2", &[pod("small", 1, "1", json!({}), EARLY), pod("big", 20, "1", json!({}), EARLY)]),
    ];
    let (s, nomination) = preempt(&p, &pod("new", 10, "2", json!({}), LATE), &nodes);
    assert!(!s.is_success());
    assert_eq!(
        s.message(),
        "preemption: 0/2 nodes are available: 1 Insufficient cpu, 1 No preemption victims found for incoming pod."
    );
    assert_eq!(nomination.map(|n| n.node), Some(String::new()), "an earlier nomination is cleared");

    let mut never = pod("never", 100, "2", json!({}), LATE);
    never.never_preempts = true;
    let (s, nomination) = preempt(&p, &never, &nodes);
    assert_eq!(s.message(), "preemption: not eligible due to preemptionPolicy=Never.");
    assert!(nomination.is_none(), "the nomination is left as it is");
}

#[test]
fn a_terminating_victim_on_the_nominated_node_means_waiting() {
    let p = profile(vec![]);
    let mut going = pod("going", 1, "1", json!({}), EARLY);
    going.deleting = true;
    going.preempted = true;
    let nodes = [node("a", "1", &[going])];
    let mut new = pod("new", 10, "1", json!({}), LATE);
    new.nominated_node = "a".into();
    let (s, nomination) = preempt(&p, &new, &nodes);
    assert_eq!(s.message(), "preemption: not eligible due to a terminating pod on the nominated node.");
    assert!(nomination.is_none());
}

#[test]
fn arguments_are_validated_as_upstream() {
    let new = |v: Value| DefaultPreemption::new(serde_json::from_value(v).unwrap(), budgets(vec![])).map(|_| ());
    assert!(new(json!({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 5})).is_ok());
    assert!(new(json!({"minCandidateNodesPercentage": 101})).unwrap_err().contains("not in valid range [0, 100]"));
    assert!(
        new(json!({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 0}))
            .unwrap_err()
            .contains("cannot be zero at the same time")
    );
    let d = DefaultPreemption::new(Args::default(), budgets(vec![])).unwrap();
    assert_eq!((d.num_candidates(50), d.num_candidates(500), d.num_candidates(5000)), (50, 100, 500));
}

#[test]
fn pods_whose_prefilter_counts_other_pods_are_simulated_afresh() {
    let p = profile(vec![]);
    let nodes = [node("n1", "2", &[pod("low", 1, "1", json!({}), EARLY), pod("mid", 5, "1", json!({}), EARLY)])];
    let mut new = PodInfo::from_json(json!({
        "metadata": {"name": "new", "uid": "new", "namespace": "default"},
        "spec": {"priority": 10, "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": "1"}}}]},
    }));
    assert!(prefilter_counts_pods(&new, &nodes));
    assert_eq!(victims(&preempt(&p, &new, &nodes)), ("n1".into(), vec!["low"]));
    new.claims.clear();
    assert!(!prefilter_counts_pods(&new, &nodes));
    assert_eq!(victims(&preempt(&p, &new, &nodes)), ("n1".into(), vec!["low"]));
}
