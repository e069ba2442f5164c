//! ReplicaSets keep `spec.replicas` pods of their template running (upstream's replicaset
//! controller): pods are claimed through controller references (orphans adopted, strays
//! released), at most 500 created or deleted per sync, creates in slow-start batches (1, 2, 4, ...)
//! that stop at the first failure, surplus pods deleted in upstream's ranking, and nothing done
//! while the cache has yet to show the last sync's own creates and deletes.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::expectations::Expectations;
use super::informer::{Cache, Informer, synced};
use super::ownership::{Claim, controlled_by, controller_of, controller_ref, pod_owners};
use super::pods::{is_active, is_available, is_ready};
use super::runtime::{self, Error, Reconciler, api_message};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::labels::selector_matches;

/// Upstream's `BurstReplicas`: the most pods one sync creates or deletes.
const BURST_REPLICAS: usize = 500;
/// `controller.kubernetes.io/pod-deletion-cost`: pods of lower cost go first on scale-down.
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

pub struct ReplicaSets {
    client: Client,
    pods: Cache<Pod>,
    sets: Cache<ReplicaSet>,
    expectations: Expectations,
    recorder: Recorder,
}

/// Starts the controller on the shared ReplicaSet and pod watches.
pub fn spawn(client: &Client, sets: &mut Informer<ReplicaSet>, pods: &mut Informer<Pod>, shutdown: &CancellationToken) {
    let controller = Controller::for_shared_stream(sets.subscribe(), sets.cache());
    let sets = sets.cache();
    let mapped = sets.clone();
    let controller = controller.watches_shared_stream(pods.subscribe(), move |pod| {
        pod_owners(&mapped, &pod, |rs: &ReplicaSet| &rs.spec.selector)
    });
    let reconciler = ReplicaSets {
        client: client.clone(),
        pods: pods.cache(),
        sets,
        expectations: Expectations::default(),
        recorder: Recorder::spawn(client.clone(), "replicaset-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

fn key(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

impl Reconciler for ReplicaSets {
    type Object = ReplicaSet;
    const NAME: &'static str = "replicaset";

    async fn synced(&self) -> bool {
        synced(&self.pods).await
    }

    async fn reconcile(&self, rs: Arc<ReplicaSet>) -> Result<Action, Error> {
        let ns = rs.namespace().unwrap_or_default();
        let key = key(&rs.metadata);
        let satisfied = self.expectations.satisfied_in(&key, &self.pods, &ns);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let candidates =
            self.pods.state().into_iter().filter(|p| p.namespace().as_deref() == Some(&ns) && is_active(p));
        let claim = Claim { owner: &*rs, adopting: rs.metadata.deletion_timestamp.is_none() };
        let pods = claim.claim(&api, candidates, |p| selector_matches(Some(&rs.spec.selector), p.labels())).await?;

        let failure = if satisfied && rs.metadata.deletion_timestamp.is_none() {
            self.manage(&rs, &key, &api, &pods).await.err()
        } else {
            None
        };
        let now = Timestamp::now();
        let status = status(&rs, &pods, failure.as_ref().map(|(reason, e)| (*reason, e.message())), now);
        if rs.status.as_ref() != Some(&status) {
            let sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
            let mut body = json!({"status": status});
            if status.conditions.is_none() {
                body["status"]["conditions"] = serde_json::Value::Null;
            }
            sets.patch_status(&rs.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
        if let Some((_, e)) = failure {
            return Err(e);
        }
        // Pods ready but not yet for minReadySeconds become available later: look again then.
        let min_ready = rs.spec.min_ready_seconds.unwrap_or(0);
        if min_ready > 0
            && status.ready_replicas == Some(status.replicas)
            && status.available_replicas != Some(status.replicas)
        {
            return Ok(Action::requeue(Duration::from_secs(min_ready as u64)));
        }
        Ok(Action::await_change())
    }
}

impl ReplicaSets {
    /// `manageReplicas`: creates or deletes pods towards `spec.replicas`. An error carries the
    /// ReplicaFailure reason it stands for.
    async fn manage(
        &self,
        rs: &ReplicaSet,
        key: &str,
        api: &Api<Pod>,
        pods: &[Arc<Pod>],
    ) -> Result<(), (&'static str, Error)> {
        let want = rs.spec.replicas.unwrap_or(1).max(0) as usize;
        let object = EventObject::of(rs);
        if pods.len() < want {
            let mut left = (want - pods.len()).min(BURST_REPLICAS);
            let template = pod_from_template(rs);
            let mut batch = 1;
            while left > 0 {
                let size = batch.min(left);
                let params = PostParams::default();
                let created = join_all((0..size).map(|_| api.create(&params, &template))).await;
                let mut failed = None;
                for result in created {
                    match result {
                        Ok(pod) => {
                            let name = pod.name_any();
                            self.expectations.created(key, name.clone());
                            self.recorder.record(
                                object.clone(),
                                EventType::Normal,
                                "SuccessfulCreate",
                                "Create",
                                format!("Created pod: {name}"),
                            );
                        }
                        Err(e) => {
                            let message = api_message(&e);
                            self.recorder.record(
                                object.clone(),
                                EventType::Warning,
                                "FailedCreate",
                                "Create",
                                format!("Error creating: {message}"),
                            );
                            failed = Some(e);
                        }
                    }
                }
                if let Some(e) = failed {
                    // The rest are not tried: the next sync (after a backoff) starts again at one.
                    return Err(("FailedCreate", e.into()));
                }
                left -= size;
                batch *= 2;
            }
        } else if pods.len() > want {
            let surplus = (pods.len() - want).min(BURST_REPLICAS);
            let related = self.related_pods(rs);
            let victims = ranked_for_deletion(pods, &related, Timestamp::now());
            let victims = &victims[..surplus];
            for p in victims {
                self.expectations.deleted(key, p.name_any(), p.uid().unwrap_or_default());
            }
            let params = DeleteParams::default();
            let names: Vec<String> = victims.iter().map(|p| p.name_any()).collect();
            let deleted = join_all(names.iter().map(|n| api.delete(n, &params))).await;
            let mut failed = None;
            for (p, result) in victims.iter().zip(deleted) {
                match result {
                    Ok(_) => self.recorder.record(
                        object.clone(),
                        EventType::Normal,
                        "SuccessfulDelete",
                        "Delete",
                        format!("Deleted pod: {}", p.name_any()),
                    ),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        self.expectations.delete_failed(key, &p.name_any(), p.uid().as_deref().unwrap_or_default());
                        let message = api_message(&e);
                        self.recorder.record(
                            object.clone(),
                            EventType::Warning,
                            "FailedDelete",
                            "Delete",
                            format!("Error deleting: {message}"),
                        );
                        failed = Some(e);
                    }
                }
            }
            if let Some(e) = failed {
                return Err(("FailedDelete", e.into()));
            }
        }
        Ok(())
    }

    /// The active pods of every set under the same controller as `rs` (its Deployment's other
    /// sets), or of `rs` alone: what scale-down's "pods on the same node" rank counts.
    fn related_pods(&self, rs: &ReplicaSet) -> Vec<Arc<Pod>> {
        let ns = rs.namespace();
        let mut uids = vec![rs.uid().unwrap_or_default()];
        if let Some(owner) = controller_of(&rs.metadata) {
            uids.extend(
                self.sets
                    .state()
                    .iter()
                    .filter(|s| s.namespace() == ns && controlled_by(&s.metadata, &owner.uid))
                    .filter_map(|s| s.uid()),
            );
        }
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.namespace() == ns && is_active(p))
            .filter(|p| controller_of(&p.metadata).is_some_and(|r| uids.contains(&r.uid)))
            .collect()
    }
}

/// The message of an API error as the API gave it.
/// `GetPodFromTemplate`: a pod of the set's template, named `<set>-<random>` and controlled by it.
fn pod_from_template(rs: &ReplicaSet) -> Pod {
    let template = rs.spec.template.clone().unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", rs.name_any())),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(rs)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// `calculateStatus`, with the ReplicaFailure condition set from a failed sync or cleared.
fn status(rs: &ReplicaSet, pods: &[Arc<Pod>], failure: Option<(&str, String)>, now: Timestamp) -> ReplicaSetStatus {
    let template_labels = rs.spec.template.as_ref().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.clone());
    let min_ready = rs.spec.min_ready_seconds.unwrap_or(0);
    let fully_labeled =
        pods.iter().filter(|p| template_labels.iter().flatten().all(|(k, v)| p.labels().get(k) == Some(v))).count();
    let ready = pods.iter().filter(|p| is_ready(p)).count();
    let available = pods.iter().filter(|p| is_available(p, min_ready, now)).count();
    let old = rs.status.clone().unwrap_or_default();
    let mut conditions: Vec<ReplicaSetCondition> = old.conditions.unwrap_or_default();
    let has_failure = conditions.iter().any(|c| c.type_.as_deref() == Some("ReplicaFailure"));
    match failure {
        Some((reason, message)) if !has_failure => conditions.push(ReplicaSetCondition {
            type_: Some("ReplicaFailure".into()),
            status: Some("True".into()),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: Some(Time(now)),
        }),
        None if has_failure => conditions.retain(|c| c.type_.as_deref() != Some("ReplicaFailure")),
        _ => {}
    }
    ReplicaSetStatus {
        replicas: pods.len() as i32,
        fully_labeled_replicas: Some(fully_labeled as i32),
        ready_replicas: Some(ready as i32),
        available_replicas: Some(available as i32),
        observed_generation: rs.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        terminating_replicas: old.terminating_replicas,
    }
}

/// Pods in the order scale-down deletes them (`ActivePodsWithRanks`, with upstream's logarithmic
/// comparison of ages): unassigned, pending, not ready, lower deletion cost, more related pods on
/// the same node, ready for less time, more restarts, newer.
fn ranked_for_deletion(pods: &[Arc<Pod>], related: &[Arc<Pod>], now: Timestamp) -> Vec<Arc<Pod>> {
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for p in related {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) {
            *per_node.entry(node).or_default() += 1;
        }
    }
    let mut ranked: Vec<(usize, Arc<Pod>)> = pods
        .iter()
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
            (per_node.get(node).copied().unwrap_or(0), p.clone())
        })
        .collect();
    ranked.sort_by(|(ra, a), (rb, b)| deletion_order(a, *ra, b, *rb, now));
    ranked.into_iter().map(|(_, p)| p).collect()
}

fn deletion_order(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize, now: Timestamp) -> Ordering {
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let phase = |p: &Pod| match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 3,
    };
    let cost = |p: &Pod| p.annotations().get(DELETION_COST).and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
    let restarts = |p: &Pod| {
        let s = p.status.as_ref();
        s.iter()
            .flat_map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()))
            .map(|c| c.restart_count)
            .max()
            .unwrap_or(0)
    };
    let uid = |p: &Pod| p.uid().unwrap_or_default();
    // Assigned after unassigned, then by phase, readiness and cost, all ascending.
    (!node(a).is_empty())
        .cmp(&!node(b).is_empty())
        .then(phase(a).cmp(&phase(b)))
        .then(is_ready(a).cmp(&is_ready(b)))
        .then(cost(a).cmp(&cost(b)))
        .then(rank_b.cmp(&rank_a))
        .then_with(|| {
            if !(is_ready(a) && is_ready(b)) {
                return Ordering::Equal;
            }
            younger_first(super::pods::ready_since(a), super::pods::ready_since(b), now, || uid(a).cmp(&uid(b)))
        })
        .then(restarts(b).cmp(&restarts(a)))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            younger_first(created(a), created(b), now, || uid(a).cmp(&uid(b)))
        })
}

/// Orders two times newest first, an unset one before both; times in the same power-of-two
/// bucket of age count as equal and are ordered by `tie` (upstream's `logarithmicRankDiff`).
fn younger_first(a: Option<Timestamp>, b: Option<Timestamp>, now: Timestamp, tie: impl Fn() -> Ordering) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) if a == b => Ordering::Equal,
        (Some(a), Some(b)) => {
            let bucket = |t: Timestamp| {
                let age = now.as_nanosecond() - t.as_nanosecond();
                if age > 0 { (age as f64).log2() as i64 } else { -1 }
            };
            match bucket(a).cmp(&bucket(b)) {
                Ordering::Equal => tie(),
                other => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, v: serde_json::Value) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(v).unwrap();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(name.into());
        Arc::new(p)
    }

    fn running(node: &str, ready_at: &str, created: &str) -> serde_json::Value {
        json!({"metadata": {"creationTimestamp": created}, "spec": {"nodeName": node, "containers": []},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]}})
    }

    #[test]
    fn surplus_pods_go_in_upstreams_order() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let old = running("n1", "2026-01-01T10:00:00Z", "2026-01-01T09:00:00Z");
        let young = running("n1", "2026-01-01T11:59:00Z", "2026-01-01T11:58:00Z");
        let pods = vec![
            pod("old", old.clone()),
            pod("young", young),
            pod("unassigned", json!({"spec": {"containers": []}, "status": {"phase": "Pending"}})),
            pod("pending", json!({"spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Pending"}})),
            pod("not-ready", json!({"spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Running"}})),
            pod("cheap", {
                let mut v = old.clone();
                v["metadata"]["annotations"] = json!({DELETION_COST: "-5"});
                v
            }),
        ];
        let order: Vec<String> = ranked_for_deletion(&pods, &pods, now).iter().map(|p| p.name_any()).collect();
        assert_eq!(order, ["unassigned", "pending", "not-ready", "cheap", "young", "old"]);
    }

    #[test]
    fn status_counts_ready_and_available_pods() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let mut rs: ReplicaSet = serde_json::from_value(json!({"metadata": {"name": "web", "generation": 3},
            "spec": {"replicas": 3, "minReadySeconds": 30, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web", "tier": "f"}}}}}))
        .unwrap();
        let mut labelled = running("n1", "2026-01-01T11:00:00Z", "2026-01-01T11:00:00Z");
        labelled["metadata"]["labels"] = json!({"app": "web", "tier": "f"});
        let pods = vec![
            pod("a", labelled),
            pod("b", running("n1", "2026-01-01T11:59:50Z", "2026-01-01T11:00:00Z")),
            pod("c", json!({"spec": {"containers": []}, "status": {"phase": "Pending"}})),
        ];
        let s = status(&rs, &pods, Some(("FailedCreate", "quota".into())), now);
        assert_eq!(
            (s.replicas, s.fully_labeled_replicas, s.ready_replicas, s.available_replicas),
            (3, Some(1), Some(2), Some(1))
        );
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.conditions.as_ref().unwrap()[0].reason.as_deref(), Some("FailedCreate"));
        rs.status = Some(s);
        assert!(status(&rs, &pods, None, now).conditions.is_none(), "a good sync clears ReplicaFailure");
    }

    #[test]
    fn pods_from_the_template_are_owned_by_the_set() {
        let rs: ReplicaSet = serde_json::from_value(json!({"metadata": {"name": "web", "uid": "u1"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c"}]}}}}))
        .unwrap();
        let p = pod_from_template(&rs);
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(p.labels().get("app").map(String::as_str), Some("web"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("ReplicaSet", "u1", Some(true)));
    }
}
