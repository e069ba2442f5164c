//! The `eviction` subresource of pods (upstream's `EvictionREST`): a pod is deleted only when the
//! PodDisruptionBudget that selects it allows one more disruption. The budget's
//! `disruptionsAllowed` is spent, and the pod recorded in its `disruptedPods`, by a guaranteed
//! update of the budget before the delete, so two evictions can never spend the same disruption.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::error::{Cause, GroupResource};
use super::{DeleteOptions, ListOptions, Registry, Result, StatusError, Subresource, WriteOptions, strategy};

/// Upstream's `MaxDisruptedPodSize`: evictions the disruption controller has yet to confirm.
const MAX_DISRUPTED: usize = 2000;

/// `canIgnorePDB`: a pod that is finished, not yet running or already going costs no disruption.
fn ignores_budgets(pod: &Value) -> bool {
    let phase = strategy::str_at(pod, &["status", "phase"]).unwrap_or_default();
    matches!(phase.as_str(), "Succeeded" | "Failed" | "Pending" | "")
        || pod["metadata"].get("deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether a budget's selector picks `labels`: an empty one picks every pod, a missing one none
/// (`LabelSelectorAsSelector`).
fn selects(pdb: &PodDisruptionBudget, labels: &crate::labels::Labels) -> bool {
    let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    selector.is_some_and(|s| crate::labels::selector_matches(Some(s), labels))
}

/// The Eviction's delete options.
fn delete_options(eviction: &Value) -> DeleteOptions {
    let o = &eviction["deleteOptions"];
    DeleteOptions {
        grace_period_seconds: o.get("gracePeriodSeconds").and_then(Value::as_i64),
        uid: o["preconditions"].get("uid").and_then(Value::as_str).map(str::to_string),
        resource_version: o["preconditions"].get("resourceVersion").and_then(Value::as_str).map(str::to_string),
        propagation: o.get("propagationPolicy").and_then(Value::as_str).map(str::to_string),
        dry_run: o.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All")),
        node: None,
    }
}

impl Registry {
    /// `POST pods/{name}/eviction`.
    pub async fn evict(&self, ns: &str, name: &str, eviction: &Value, node: Option<&str>) -> Result<()> {
        if let Some(kind) = eviction.get("kind").and_then(Value::as_str)
            && kind != "Eviction"
        {
            return Err(StatusError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind (Eviction)"
            )));
        }
        if let Some(n) = strategy::str_at(eviction, &["metadata", "name"]).filter(|n| !n.is_empty())
            && n != name
        {
            return Err(StatusError::bad_request(format!(
                "name in URL does not match name in Eviction object: {n} vs {name}"
            )));
        }
        let pods = self.find("", "v1", "pods").ok_or_else(|| StatusError::internal("pods are not served"))?;
        let budgets = self
            .find("policy", "v1", "poddisruptionbudgets")
            .ok_or_else(|| StatusError::internal("poddisruptionbudgets are not served"))?;
        let opts = delete_options(eviction);
        let pod = self.get_value(&pods, Some(ns), name)?;
        if let Some(node) = node {
            self.restrict_node_eviction(node, &pod)?;
        }
        if !ignores_budgets(&pod) {
            let labels: crate::labels::Labels =
                serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default();
            let listed = self.list(&budgets, Some(ns), &ListOptions::default())?;
            let mut matching = Vec::new();
            for item in listed.items {
                let pdb: PodDisruptionBudget = serde_json::from_slice(&item).map_err(StatusError::internal)?;
                if selects(&pdb, &labels) {
                    matching.push(pdb);
                }
            }
            match matching.as_slice() {
                [] => {}
                [pdb] => self.spend(&budgets, ns, pdb, name, ready(&pod), opts.dry_run).await?,
                _ => {
                    return Err(StatusError::internal(
                        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                    ));
                }
            }
        }
        self.delete(&pods, Some(ns), name, &opts).await.map(|_| ())
    }

    /// `checkAndDecrement`: spends one disruption of `pdb` on pod `pod`, or says why not. An
    /// unready pod of a budget that is met (or that always allows them) costs none.
    async fn spend(
        &self,
        budgets: &super::Resource,
        ns: &str,
        pdb: &PodDisruptionBudget,
        pod: &str,
        ready: bool,
        dry_run: bool,
    ) -> Result<()> {
        let name = pdb.metadata.name.clone().unwrap_or_default();
        let status = pdb.status.clone().unwrap_or_default();
        if !ready {
            let policy = pdb.spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref()).unwrap_or_default();
            if policy == "AlwaysAllow"
                || (status.current_healthy >= status.desired_healthy && status.desired_healthy.unwrap_or(0) > 0)
            {
                return Ok(());
            }
        }
        let gr = GroupResource { group: "policy".into(), resource: "poddisruptionbudgets".into() };
        let refuse = |status: &k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus, generation: Option<i64>| {
            let cause = |message: String| Cause { reason: "DisruptionBudget".into(), message, field: String::new() };
            if status.observed_generation < generation {
                return Some(StatusError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    cause(format!("The disruption budget {name} is still being processed by the server.")),
                ));
            }
            if status.disruptions_allowed.unwrap_or(0) < 0 {
                return Some(StatusError::forbidden(&gr, &name, "pdb disruptions allowed is negative"));
            }
            if status.disrupted_pods.as_ref().map_or(0, |d| d.len()) > MAX_DISRUPTED {
                return Some(StatusError::forbidden(
                    &gr,
                    &name,
                    "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
                ));
            }
            (status.disruptions_allowed.unwrap_or(0) == 0).then(|| {
                StatusError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    cause(format!(
                        "The disruption budget {name} needs {} healthy pods and has {} currently",
                        status.desired_healthy.unwrap_or(0),
                        status.current_healthy.unwrap_or(0)
                    )),
                )
            })
        };
        if dry_run {
            return refuse(&status, pdb.metadata.generation).map_or(Ok(()), Err);
        }
        let now = Timestamp::now().to_string();
        self.guaranteed_update(
            budgets,
            Some(ns),
            &name,
            None,
            Some(Subresource::Status),
            &WriteOptions::default(),
            None,
            |current| {
                let latest: PodDisruptionBudget =
                    serde_json::from_value(current.clone()).map_err(StatusError::internal)?;
                let status = latest.status.clone().unwrap_or_default();
                if let Some(e) = refuse(&status, latest.metadata.generation) {
                    return Err(e);
                }
                let mut next = current.clone();
                let allowed = status.disruptions_allowed.unwrap_or(0) - 1;
                next["status"]["disruptionsAllowed"] = json!(allowed);
                next["status"]["disruptedPods"][pod] = json!(now);
                if allowed == 0 {
                    let conditions = next["status"]["conditions"].as_array().cloned().unwrap_or_default();
                    let mut kept: Vec<Value> =
                        conditions.into_iter().filter(|c| c["type"] != "DisruptionAllowed").collect();
                    kept.push(json!({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                    "message": "", "lastTransitionTime": now, "observedGeneration": latest.metadata.generation}));
                    next["status"]["conditions"] = json!(kept);
                }
                Ok(next)
            },
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_pods_cost_a_disruption() {
        assert!(ignores_budgets(&json!({"status": {"phase": "Pending"}})));
        assert!(ignores_budgets(&json!({"status": {"phase": "Succeeded"}})));
        assert!(ignores_budgets(
            &json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}})
        ));
        assert!(!ignores_budgets(&json!({"metadata": {}, "status": {"phase": "Running"}})));
    }

    #[test]
    fn an_empty_selector_picks_every_pod() {
        let pdb =
            |sel: Value| -> PodDisruptionBudget { serde_json::from_value(json!({"spec": {"selector": sel}})).unwrap() };
        let labels: crate::labels::Labels = [("app".to_string(), "web".to_string())].into();
        assert!(selects(&pdb(json!({})), &labels));
        assert!(selects(&pdb(json!({"matchLabels": {"app": "web"}})), &labels));
        assert!(!selects(&pdb(json!({"matchLabels": {"app": "db"}})), &labels));
        let unset: PodDisruptionBudget = serde_json::from_value(json!({"spec": {}})).unwrap();
        assert!(!selects(&unset, &labels));
    }
}
