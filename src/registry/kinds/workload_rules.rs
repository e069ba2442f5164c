//! What the workload kinds (`apps/v1`, `batch/v1`) share: their pod template's defaults and
//! validation (`ValidatePodTemplateSpec`, `ValidatePodTemplateSpecForReplicaSet`), selectors,
//! int-or-percent fields, non-negative counts and the CONTAINERS / IMAGES / SELECTOR table cells.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::pod_rules::{default_pod_spec, validate_label_selector, validate_pod};
use crate::labels::{format_selector, selector_matches};
use crate::registry::strategy::Column;
use crate::registry::validation::{self, ErrorList, FieldError};

/// The scheme defaults of a template's pod spec (as the pod's own, without the pod admission ones).
pub fn default_template(template: &mut PodTemplateSpec) {
    default_pod_spec(template.spec.get_or_insert_with(PodSpec::default));
}

/// `ValidatePodTemplateSpec` at `path`: the template's labels and annotations, and its pod spec by
/// the pod's own rules, reported under `path`.
pub fn validate_template(template: &PodTemplateSpec, path: &str, out: &mut ErrorList) {
    let meta = template.metadata.clone().unwrap_or_default();
    let meta_path = format!("{path}.metadata");
    out.extend(validation::validate_labels(meta.labels.iter().flatten(), &format!("{meta_path}.labels")));
    let pod = Pod { metadata: meta, spec: template.spec.clone(), status: None };
    for mut e in validate_pod(&pod) {
        e.field = match e.field.strip_prefix("metadata") {
            Some(rest) => format!("{meta_path}{rest}"),
            None => format!("{path}.{}", e.field),
        };
        out.push(e);
    }
    if template.spec.as_ref().is_some_and(|s| s.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty())) {
        out.push(FieldError::forbidden(
            format!("{path}.spec.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
}

/// `ValidatePodTemplateSpecForReplicaSet` (also used for StatefulSets and DaemonSets): the template
/// is valid, its labels match the selector, and its pods restart `Always` with no deadline.
pub fn validate_template_for_controller(
    template: &PodTemplateSpec,
    selector: Option<&LabelSelector>,
    kind: &str,
    path: &str,
    out: &mut ErrorList,
) {
    let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    if selector.is_some_and(|s| !is_empty_selector(s)) && !selector_matches(selector, &labels) {
        out.push(FieldError::invalid_raw(
            format!("{path}.metadata.labels"),
            go_map(&labels),
            "`selector` does not match template `labels`",
        ));
    }
    validate_template(template, path, out);
    let spec = template.spec.clone().unwrap_or_default();
    let restart = spec.restart_policy.unwrap_or_default();
    if restart != "Always" {
        out.push(FieldError::not_supported(format!("{path}.spec.restartPolicy"), restart, &["Always"]));
    }
    if spec.active_deadline_seconds.is_some() {
        out.push(FieldError::forbidden(
            format!("{path}.spec.activeDeadlineSeconds"),
            format!("activeDeadlineSeconds in {kind} is not Supported"),
        ));
    }
}

/// A label map as Go's `%#v` prints it: `map[string]string{"app":"web"}`.
pub fn go_map(labels: &std::collections::BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k:?}:{v:?}")).collect();
    format!("map[string]string{{{}}}", pairs.join(", "))
}

fn is_empty_selector(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty()) && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// A controller's required, non-empty selector (`empty selector is invalid for <what>`).
pub fn validate_selector(selector: Option<&LabelSelector>, what: &str, out: &mut ErrorList) {
    match selector {
        None => out.push(FieldError::required("spec.selector", "")),
        Some(s) => {
            validate_label_selector(Some(s), "spec.selector", out);
            if is_empty_selector(s) {
                out.push(FieldError::invalid(
                    "spec.selector",
                    format_selector(Some(s)),
                    format!("empty selector is invalid for {what}"),
                ));
            }
        }
    }
}

/// The selector may not change (`spec.selector: field is immutable`).
pub fn selector_immutable(new: Option<&LabelSelector>, old: Option<&LabelSelector>, out: &mut ErrorList) {
    if new != old {
        out.push(FieldError::invalid("spec.selector", format_selector(new), "field is immutable"));
    }
}

/// `ValidateNonnegativeField`.
pub fn non_negative(value: Option<i64>, path: &str, out: &mut ErrorList) {
    if let Some(v) = value
        && v < 0
    {
        out.push(FieldError::invalid_raw(path, v, "must be greater than or equal to 0"));
    }
}

/// The percentage of a `"N%"` string, if it is one.
fn percent(s: &str) -> Option<i64> {
    let digits = s.strip_suffix('%')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The value an int-or-percent stands for, when valid (a percent is its number).
pub fn int_or_percent_value(v: Option<&IntOrString>) -> i64 {
    match v {
        Some(IntOrString::Int(i)) => i64::from(*i),
        Some(IntOrString::String(s)) => percent(s).unwrap_or(0),
        None => 0,
    }
}

/// `ValidatePositiveIntOrPercent` and, with `at_most_100`, `IsNotMoreThan100Percent`.
pub fn validate_int_or_percent(v: Option<&IntOrString>, path: &str, at_most_100: bool, out: &mut ErrorList) {
    match v {
        Some(IntOrString::Int(i)) => non_negative(Some(i64::from(*i)), path, out),
        Some(IntOrString::String(s)) => match percent(s) {
            None => out.push(FieldError::invalid(path, s, "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")),
            Some(p) if at_most_100 && p > 100 => out.push(FieldError::invalid(path, s, "must not be greater than 100%")),
            Some(_) => {}
        },
        None => {}
    }
}

/// The CONTAINERS, IMAGES and SELECTOR columns that `-o wide` shows for workloads.
pub fn wide_columns(selector: bool) -> Vec<Column> {
    let mut cols = vec![
        Column::new("Containers", "string", "Names of each container in the template.").wide(),
        Column::new("Images", "string", "Images referenced by each container in the template.").wide(),
    ];
    if selector {
        cols.push(Column::new("Selector", "string", "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.").wide());
    }
    cols
}

/// Cells for [`wide_columns`].
pub fn wide_cells(template: Option<&PodTemplateSpec>, selector: Option<Option<&LabelSelector>>) -> Vec<Value> {
    let containers = template.and_then(|t| t.spec.as_ref()).map(|s| s.containers.as_slice()).unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers.iter().map(|c| c.image.as_deref().unwrap_or_default()).collect();
    let mut cells = vec![json!(names.join(",")), json!(images.join(","))];
    if let Some(s) = selector {
        let text = format_selector(s);
        cells.push(json!(if text.is_empty() { "<none>".to_string() } else { text }));
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percents_are_checked_as_upstream() {
        let mut out = Vec::new();
        validate_int_or_percent(Some(&IntOrString::String("25%".into())), "x", true, &mut out);
        validate_int_or_percent(Some(&IntOrString::Int(3)), "x", true, &mut out);
        assert!(out.is_empty());
        validate_int_or_percent(Some(&IntOrString::String("120%".into())), "a", true, &mut out);
        validate_int_or_percent(Some(&IntOrString::String("x%".into())), "b", false, &mut out);
        validate_int_or_percent(Some(&IntOrString::Int(-1)), "c", false, &mut out);
        let fields: Vec<&str> = out.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["a", "b", "c"]);
        assert_eq!(int_or_percent_value(Some(&IntOrString::String("25%".into()))), 25);
    }
}
