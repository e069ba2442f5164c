//! PodDisruptionBudget status (upstream's disruption controller, `pkg/controller/disruption`):
//! how many of the pods a budget selects are healthy, how many must be, and so how many
//! disruptions (evictions) it allows now. A percentage, or `maxUnavailable`, counts against the
//! pods the owning controllers want (their scale); evictions the pods do not show yet stay
//! counted as disrupted for two minutes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::deployment::scaled;
use super::informer::{Cache, Informer, synced};
use super::ownership::controller_of;
use super::pods::is_ready;
use super::runtime::{self, Error, Reconciler};
use crate::labels::selector_matches;

/// Upstream's `DeletionTimeout`: an eviction not seen in its pod after this is forgotten.
const DELETION_TIMEOUT: SignedDuration = SignedDuration::from_secs(120);

pub struct Disruption {
    client: Client,
    pods: Cache<Pod>,
}

/// Starts the controller on the shared pod watch.
pub fn spawn(client: &Client, pods: &mut Informer<Pod>, shutdown: &CancellationToken) {
    let controller = Controller::new(Api::<PodDisruptionBudget>::all(client.clone()), watcher::Config::default());
    let budgets: Cache<PodDisruptionBudget> = controller.store();
    let controller = controller.watches_shared_stream(pods.subscribe(), move |pod| {
        let ns = pod.namespace();
        budgets
            .state()
            .iter()
            .filter(|b| b.namespace() == ns && selects(b, pod.labels()))
            .map(|b| ObjectRef::from_obj(&**b))
            .collect::<Vec<_>>()
    });
    let reconciler = Disruption { client: client.clone(), pods: pods.cache() };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// An empty selector picks every pod of the namespace, a missing one none.
fn selects(pdb: &PodDisruptionBudget, labels: &BTreeMap<String, String>) -> bool {
    let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    selector.is_some_and(|s| selector_matches(Some(s), labels))
}

/// `buildDisruptedPodMap`: evictions still on their way, and when the oldest of them expires.
fn still_disrupted(
    status: &PodDisruptionBudgetStatus,
    pods: &[Arc<Pod>],
    now: Timestamp,
) -> (BTreeMap<String, Time>, Option<Duration>) {
    let mut kept = BTreeMap::new();
    let mut recheck: Option<Duration> = None;
    for (name, at) in status.disrupted_pods.iter().flatten() {
        let live = pods.iter().any(|p| p.name_any() == *name && p.metadata.deletion_timestamp.is_none());
        let expires = at.0 + DELETION_TIMEOUT;
        if live && expires > now {
            let left = Duration::try_from(expires.duration_since(now)).unwrap_or_default();
            recheck = Some(recheck.map_or(left, |r| r.min(left)));
            kept.insert(name.clone(), at.clone());
        }
    }
    (kept, recheck)
}

/// `countHealthyPods`: ready, not being deleted, and not just evicted.
fn healthy(pods: &[Arc<Pod>], disrupted: &BTreeMap<String, Time>) -> i32 {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !disrupted.contains_key(&p.name_any()) && is_ready(p))
        .count() as i32
}

/// (expected pods, desired healthy) for the budget, given the pods' owners' wanted scale.
fn desired(pdb: &PodDisruptionBudget, pods: usize, scale: impl FnOnce() -> i32) -> (i32, i32) {
    let spec = pdb.spec.clone().unwrap_or_default();
    match (&spec.max_unavailable, &spec.min_available) {
        (Some(max), _) => {
            let expected = scale();
            (expected, (expected - scaled(Some(max), expected, true)).max(0))
        }
        (None, Some(IntOrString::Int(min))) => (pods as i32, *min),
        (None, Some(min)) => {
            let expected = scale();
            (expected, scaled(Some(min), expected, true))
        }
        (None, None) => (pods as i32, 0),
    }
}

impl Reconciler for Disruption {
    type Object = PodDisruptionBudget;
    const NAME: &'static str = "disruption";

    async fn synced(&self) -> bool {
        synced(&self.pods).await
    }

    async fn reconcile(&self, pdb: Arc<PodDisruptionBudget>) -> Result<Action, Error> {
        let ns = pdb.namespace().unwrap_or_default();
        let pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(&ns) && selects(&pdb, p.labels()))
            .collect();
        let now = Timestamp::now();
        let old = pdb.status.clone().unwrap_or_default();
        let (disrupted, recheck) = still_disrupted(&old, &pods, now);
        let spec = pdb.spec.clone().unwrap_or_default();
        let needs_scale = spec.max_unavailable.is_some() || matches!(spec.min_available, Some(IntOrString::String(_)));
        let scale = if needs_scale { self.expected_scale(&ns, &pods).await? } else { 0 };
        let (expected, desired_healthy) = desired(&pdb, pods.len(), || scale);
        let current = healthy(&pods, &disrupted);
        let allowed = if expected <= 0 { 0 } else { (current - desired_healthy).max(0) };
        let (state, reason) = if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
        let mut conditions: Vec<Condition> = old.conditions.clone().unwrap_or_default();
        // As `meta.SetStatusCondition`: the transition time moves only with the status.
        let kept = conditions.iter_mut().find(|c| c.type_ == "DisruptionAllowed" && c.status == state);
        if let Some(c) = kept {
            c.reason = reason.into();
            c.observed_generation = pdb.metadata.generation;
        } else {
            conditions.retain(|c| c.type_ != "DisruptionAllowed");
            conditions.push(Condition {
                type_: "DisruptionAllowed".into(),
                status: state.into(),
                reason: reason.into(),
                message: String::new(),
                last_transition_time: Time(now),
                observed_generation: pdb.metadata.generation,
            });
        }
        let status = PodDisruptionBudgetStatus {
            observed_generation: pdb.metadata.generation,
            expected_pods: Some(expected),
            current_healthy: Some(current),
            desired_healthy: Some(desired_healthy),
            disruptions_allowed: Some(allowed),
            disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
            conditions: Some(conditions),
        };
        if status != old {
            let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &ns);
            let mut body = json!({"status": status});
            if status.disrupted_pods.is_none() {
                body["status"]["disruptedPods"] = serde_json::Value::Null;
            }
            api.patch_status(&pdb.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
        Ok(recheck.map_or_else(Action::await_change, Action::requeue))
    }
}

impl Disruption {
    /// `getExpectedScale`: the replicas the controllers of the pods want, each counted once (a
    /// ReplicaSet of a Deployment counts as the Deployment). Pods without a controller count as
    /// themselves.
    async fn expected_scale(&self, ns: &str, pods: &[Arc<Pod>]) -> Result<i32, Error> {
        let mut seen = HashSet::new();
        let mut total = 0;
        for pod in pods {
            let Some(owner) = controller_of(&pod.metadata) else {
                total += 1;
                continue;
            };
            if !seen.insert(owner.uid.clone()) {
                continue;
            }
            let replicas = match (owner.api_version.as_str(), owner.kind.as_str()) {
                ("apps/v1", "ReplicaSet") => {
                    let rs = Api::<ReplicaSet>::namespaced(self.client.clone(), ns).get_opt(&owner.name).await?;
                    match rs.as_ref().and_then(|rs| controller_of(&rs.metadata)).filter(|o| o.kind == "Deployment") {
                        Some(d) if seen.insert(d.uid.clone()) => {
                            let d = Api::<Deployment>::namespaced(self.client.clone(), ns).get_opt(&d.name).await?;
                            d.and_then(|d| d.spec.replicas).unwrap_or(1)
                        }
                        Some(_) => 0,
                        None => rs.and_then(|rs| rs.spec.replicas).unwrap_or(1),
                    }
                }
                ("apps/v1", "StatefulSet") => {
                    let set = Api::<StatefulSet>::namespaced(self.client.clone(), ns).get_opt(&owner.name).await?;
                    set.and_then(|s| s.spec.replicas).unwrap_or(1)
                }
                // Controllers without a scale (Jobs, DaemonSets) count their pods.
                _ => pods.iter().filter(|p| controller_of(&p.metadata).is_some_and(|o| o.uid == owner.uid)).count()
                    as i32,
            };
            total += replicas;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(spec: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).unwrap()
    }

    #[test]
    fn desired_healthy_follows_min_available_or_max_unavailable() {
        assert_eq!(desired(&pdb(json!({"minAvailable": 2})), 3, || unreachable!()), (3, 2));
        assert_eq!(desired(&pdb(json!({"minAvailable": "50%"})), 3, || 5), (5, 3), "rounded up");
        assert_eq!(desired(&pdb(json!({"maxUnavailable": 1})), 3, || 4), (4, 3));
        assert_eq!(desired(&pdb(json!({"maxUnavailable": "10%"})), 3, || 4), (4, 3));
        assert_eq!(desired(&pdb(json!({"maxUnavailable": 9})), 3, || 4), (4, 0));
    }

    #[test]
    fn evictions_count_as_disruptions_until_they_show_or_expire() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let pod = |name: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}))
                .unwrap(),
            )
        };
        let pods = [pod("a"), pod("b"), pod("c")];
        let status: PodDisruptionBudgetStatus = serde_json::from_value(json!({"currentHealthy": 0, "desiredHealthy": 0,
            "disruptionsAllowed": 0, "expectedPods": 0,
            "disruptedPods": {"a": "2026-01-01T11:59:30Z", "b": "2026-01-01T11:50:00Z", "gone": "2026-01-01T11:59:59Z"}}))
        .unwrap();
        let (kept, recheck) = still_disrupted(&status, &pods, now);
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["a"], "b expired, gone is gone");
        assert_eq!(recheck, Some(Duration::from_secs(90)));
        assert_eq!(healthy(&pods, &kept), 2);
    }
}
