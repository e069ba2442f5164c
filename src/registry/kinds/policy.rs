//! `policy/v1` PodDisruptionBudgets: validation (`ValidatePodDisruptionBudgetSpec`), the status
//! subresource the disruption controller writes and the eviction subresource spends, and the
//! `kubectl get pdb` columns.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::pod_rules::validate_label_selector;
use super::workload_rules::validate_int_or_percent;
use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

pub struct PodDisruptionBudgets;

const MERGE_KEYS: &[MergeKey] = &[merge("status.conditions", "type")];

impl Kind for PodDisruptionBudgets {
    type Obj = PodDisruptionBudget;
    const INFO: ResourceInfo = ResourceInfo {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        namespaced: true,
        short_names: &["pdb"],
        categories: &[],
        subresources: &[Subresource::Status],
        storage: "poddisruptionbudgets.policy",
        return_deleted_object: false,
    };
    const GENERATION: bool = true;
    const MERGE_KEYS: &'static [MergeKey] = MERGE_KEYS;

    fn prepare_create(&self, pdb: &mut PodDisruptionBudget) {
        pdb.status = None;
    }

    fn prepare_update(&self, new: &mut PodDisruptionBudget, old: &PodDisruptionBudget) {
        new.status = old.status.clone();
    }

    fn prepare_status_update(&self, new: &mut PodDisruptionBudget, old: &PodDisruptionBudget) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, pdb: &PodDisruptionBudget) -> ErrorList {
        let mut out = Vec::new();
        let spec = pdb.spec.clone().unwrap_or_default();
        if spec.min_available.is_some() && spec.max_unavailable.is_some() {
            out.push(FieldError::invalid_raw("spec", "{...}", "minAvailable and maxUnavailable cannot be both set"));
        }
        validate_int_or_percent(spec.min_available.as_ref(), "spec.minAvailable", true, &mut out);
        validate_int_or_percent(spec.max_unavailable.as_ref(), "spec.maxUnavailable", true, &mut out);
        validate_label_selector(spec.selector.as_ref(), "spec.selector", &mut out);
        if let Some(p) = spec.unhealthy_pod_eviction_policy.as_deref()
            && !matches!(p, "IfHealthyBudget" | "AlwaysAllow")
        {
            out.push(FieldError::not_supported(
                "spec.unhealthyPodEvictionPolicy",
                p,
                &["AlwaysAllow", "IfHealthyBudget"],
            ));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Min Available", "string", "The minimum number of pods that must be available."),
            Column::new("Max Unavailable", "string", "The maximum number of pods that may be unavailable."),
            Column::new(
                "Allowed Disruptions",
                "integer",
                "Calculated number of pods that may be disrupted at this time.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, pdb: &PodDisruptionBudget) -> Vec<Value> {
        let spec = pdb.spec.clone().unwrap_or_default();
        let shown = |v: Option<IntOrString>| match v {
            Some(IntOrString::Int(i)) => i.to_string(),
            Some(IntOrString::String(s)) => s,
            None => "N/A".into(),
        };
        vec![
            name_cell(&pdb.metadata),
            json!(shown(spec.min_available)),
            json!(shown(spec.max_unavailable)),
            json!(pdb.status.as_ref().and_then(|s| s.disruptions_allowed).unwrap_or(0)),
            age_cell(&pdb.metadata),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(spec: Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).unwrap()
    }

    #[test]
    fn budgets_are_checked_as_upstream() {
        let errs = |spec: Value| -> Vec<String> {
            PodDisruptionBudgets.validate(&pdb(spec)).iter().map(ToString::to_string).collect()
        };
        assert!(errs(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})).is_empty());
        assert_eq!(
            errs(json!({"minAvailable": 1, "maxUnavailable": 1})),
            ["spec: Invalid value: {...}: minAvailable and maxUnavailable cannot be both set"]
        );
        assert!(errs(json!({"maxUnavailable": "120%"}))[0].contains("must not be greater than 100%"));
        assert!(errs(json!({"minAvailable": -1}))[0].contains("spec.minAvailable"));
        assert!(errs(json!({"unhealthyPodEvictionPolicy": "Never"}))[0].contains("spec.unhealthyPodEvictionPolicy"));
    }
}
