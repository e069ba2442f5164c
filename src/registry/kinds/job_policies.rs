//! A Job's failure and success policies, checked as upstream's `validateJobSpec` does:
//! `backoffLimitPerIndex` and `maxFailedIndexes`, `podFailurePolicy`, `successPolicy` and
//! `podReplacementPolicy`.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::{JobSpec, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule};

use super::workload_rules::non_negative;
use crate::registry::validation::{ErrorList, ErrorType, FieldError, is_qualified_name};

/// Upstream's `maxPodFailurePolicyRules`, `maxPodFailurePolicyOnExitCodesValues`,
/// `maxPodFailurePolicyOnPodConditionsPatterns`, `maxSuccessPolicyRule`,
/// `maxJobSuccessPolicySucceededIndexesLimit` and `maxFailedIndexesForIndexedJob`.
const MAX_RULES: usize = 20;
const MAX_EXIT_CODES: usize = 255;
const MAX_CONDITION_PATTERNS: usize = 20;
const MAX_SUCCESS_RULES: usize = 20;
const MAX_SUCCEEDED_INDEXES_BYTES: usize = 64 * 1024;
const MAX_FAILED_INDEXES: i32 = 100_000;
const ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];

/// `Invalid value: <detail>` with no value shown (upstream's `field.OmitValueType`).
fn invalid_omitted(field: String, detail: &str) -> FieldError {
    FieldError { kind: ErrorType::Invalid, field, detail: format!("Invalid value: {detail}") }
}

/// Go's `%#v` of an `[]int32`.
fn go_int32s(values: &[i32]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[]int32{{{}}}", items.join(", "))
}

pub fn validate(spec: &JobSpec, path: &str, out: &mut ErrorList) {
    let at = |field: &str| format!("{path}.{field}");
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    non_negative(spec.backoff_limit_per_index.map(i64::from), &at("backoffLimitPerIndex"), out);
    if let Some(max) = spec.max_failed_indexes {
        non_negative(Some(i64::from(max)), &at("maxFailedIndexes"), out);
        if spec.backoff_limit_per_index.is_none() {
            out.push(FieldError::required(at("backoffLimitPerIndex"), "when maxFailedIndexes is specified"));
        }
        if indexed && spec.completions.is_some_and(|c| max > c) {
            out.push(FieldError::invalid_raw(at("maxFailedIndexes"), max, "must be less than or equal to completions"));
        }
        if indexed && max > MAX_FAILED_INDEXES {
            out.push(FieldError::invalid_raw(
                at("maxFailedIndexes"),
                max,
                format!("must be less than or equal to {MAX_FAILED_INDEXES}"),
            ));
        }
    }
    if !indexed {
        if let Some(b) = spec.backoff_limit_per_index {
            out.push(FieldError::invalid_raw(at("backoffLimitPerIndex"), b, "requires indexed completion mode"));
        }
        if let Some(m) = spec.max_failed_indexes {
            out.push(FieldError::invalid_raw(at("maxFailedIndexes"), m, "requires indexed completion mode"));
        }
    }
    if let Some(policy) = &spec.pod_failure_policy {
        let rules = at("podFailurePolicy.rules");
        if policy.rules.len() > MAX_RULES {
            out.push(FieldError::too_many(&rules, policy.rules.len(), MAX_RULES));
        }
        let pod = spec.template.spec.clone().unwrap_or_default();
        let names: BTreeSet<String> =
            pod.containers.iter().chain(pod.init_containers.iter().flatten()).map(|c| c.name.clone()).collect();
        for (i, rule) in policy.rules.iter().enumerate() {
            validate_rule(spec, rule, &format!("{rules}[{i}]"), &names, out);
        }
        let restart = pod.restart_policy.unwrap_or_default();
        if restart == "OnFailure" {
            out.push(FieldError::invalid(
                at("template.spec.restartPolicy"),
                restart,
                "only \"Never\" is supported when podFailurePolicy is specified",
            ));
        }
    }
    if let Some(policy) = &spec.success_policy {
        if !indexed {
            out.push(FieldError::invalid_raw(
                at("successPolicy"),
                "batch.SuccessPolicy{...}",
                "requires indexed completion mode",
            ));
        } else {
            validate_success_policy(spec, policy, &at("successPolicy"), out);
        }
    }
    if let Some(replacement) = &spec.pod_replacement_policy {
        let supported: &[&str] =
            if spec.pod_failure_policy.is_some() { &["Failed"] } else { &["Failed", "TerminatingOrFailed"] };
        if !supported.contains(&replacement.as_str()) {
            out.push(FieldError::not_supported(at("podReplacementPolicy"), replacement, supported));
        }
    }
}

/// `validatePodFailurePolicyRule`.
fn validate_rule(
    spec: &JobSpec,
    rule: &PodFailurePolicyRule,
    path: &str,
    names: &BTreeSet<String>,
    out: &mut ErrorList,
) {
    let action = format!("{path}.action");
    if rule.action.is_empty() {
        let valid: Vec<String> = ACTIONS.iter().map(|a| format!("{a:?}")).collect();
        out.push(FieldError::required(action, format!("valid values: [{}]", valid.join(" "))));
    } else if rule.action == "FailIndex" {
        if spec.backoff_limit_per_index.is_none() {
            out.push(FieldError::invalid(action, &rule.action, "requires the backoffLimitPerIndex to be set"));
        }
    } else if !ACTIONS.contains(&rule.action.as_str()) {
        out.push(FieldError::not_supported(action, &rule.action, &ACTIONS));
    }
    if let Some(codes) = &rule.on_exit_codes {
        validate_exit_codes(codes, &format!("{path}.onExitCodes"), names, out);
    }
    let patterns = rule.on_pod_conditions.as_deref().unwrap_or_default();
    if !patterns.is_empty() {
        let at = format!("{path}.onPodConditions");
        if patterns.len() > MAX_CONDITION_PATTERNS {
            out.push(FieldError::too_many(&at, patterns.len(), MAX_CONDITION_PATTERNS));
        }
        const STATUSES: [&str; 3] = ["False", "True", "Unknown"];
        for (j, p) in patterns.iter().enumerate() {
            for msg in is_qualified_name(&p.type_) {
                out.push(FieldError::invalid(format!("{at}[{j}].type"), &p.type_, msg));
            }
            match p.status.as_deref() {
                None | Some("") => out.push(FieldError::required(
                    format!("{at}[{j}].status"),
                    "valid values: [\"False\" \"True\" \"Unknown\"]",
                )),
                Some(s) if !STATUSES.contains(&s) => {
                    out.push(FieldError::not_supported(format!("{at}[{j}].status"), s, &STATUSES));
                }
                Some(_) => {}
            }
        }
    }
    match (rule.on_exit_codes.is_some(), !patterns.is_empty()) {
        (true, true) => out.push(invalid_omitted(
            path.to_string(),
            "specifying both OnExitCodes and OnPodConditions is not supported",
        )),
        (false, false) => {
            out.push(invalid_omitted(path.to_string(), "specifying one of OnExitCodes and OnPodConditions is required"))
        }
        _ => {}
    }
}

/// `validatePodFailurePolicyRuleOnExitCodes`.
fn validate_exit_codes(
    codes: &PodFailurePolicyOnExitCodesRequirement,
    path: &str,
    names: &BTreeSet<String>,
    out: &mut ErrorList,
) {
    const OPERATORS: [&str; 2] = ["In", "NotIn"];
    let operator = format!("{path}.operator");
    if codes.operator.is_empty() {
        out.push(FieldError::required(operator, "valid values: [\"In\" \"NotIn\"]"));
    } else if !OPERATORS.contains(&codes.operator.as_str()) {
        out.push(FieldError::not_supported(operator, &codes.operator, &OPERATORS));
    }
    if let Some(name) = &codes.container_name
        && !names.contains(name)
    {
        out.push(FieldError::invalid(
            format!("{path}.containerName"),
            name,
            "must be one of the container or initContainer names in the pod template",
        ));
    }
    let values = format!("{path}.values");
    if codes.values.is_empty() {
        out.push(FieldError::invalid_raw(&values, go_int32s(&codes.values), "at least one value is required"));
    } else if codes.values.len() > MAX_EXIT_CODES {
        out.push(FieldError::too_many(&values, codes.values.len(), MAX_EXIT_CODES));
    }
    let mut seen = BTreeSet::new();
    for (j, v) in codes.values.iter().enumerate() {
        if codes.operator == "In" && *v == 0 {
            out.push(FieldError::invalid_raw(format!("{values}[{j}]"), v, "must not be 0 for the In operator"));
        }
        if !seen.insert(v) {
            out.push(FieldError::duplicate_raw(format!("{values}[{j}]"), v));
        }
    }
    if codes.values.windows(2).any(|w| w[0] > w[1]) {
        out.push(FieldError::invalid_raw(&values, go_int32s(&codes.values), "must be ordered"));
    }
}

/// `validateSuccessPolicy` of an Indexed Job.
fn validate_success_policy(
    spec: &JobSpec,
    policy: &k8s_openapi::api::batch::v1::SuccessPolicy,
    path: &str,
    out: &mut ErrorList,
) {
    let rules = format!("{path}.rules");
    if policy.rules.is_empty() {
        out.push(FieldError::required(
            &rules,
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if policy.rules.len() > MAX_SUCCESS_RULES {
        out.push(FieldError::too_many(&rules, policy.rules.len(), MAX_SUCCESS_RULES));
    }
    let completions = spec.completions.unwrap_or(0);
    for (i, rule) in policy.rules.iter().enumerate() {
        let at = format!("{rules}[{i}]");
        if rule.succeeded_count.is_none() && rule.succeeded_indexes.is_none() {
            out.push(FieldError::required(&at, "at least one of succeededCount or succeededIndexes must be specified"));
        }
        let mut total = 0;
        if let Some(indexes) = &rule.succeeded_indexes {
            let field = format!("{at}.succeededIndexes");
            if indexes.len() > MAX_SUCCEEDED_INDEXES_BYTES {
                out.push(FieldError::too_long(&field, MAX_SUCCEEDED_INDEXES_BYTES));
            }
            match count_indexes(indexes, completions) {
                Ok(n) => total = n,
                Err(e) => out.push(FieldError::invalid(field, indexes, format!("error parsing succeededIndexes: {e}"))),
            }
        }
        if let Some(count) = rule.succeeded_count {
            let field = format!("{at}.succeededCount");
            non_negative(Some(i64::from(count)), &field, out);
            if count > completions {
                out.push(FieldError::invalid_raw(
                    &field,
                    count,
                    format!("must be less than or equal to {completions} (the number of specified completions)"),
                ));
            }
            if rule.succeeded_indexes.is_some() && count > total {
                out.push(FieldError::invalid_raw(
                    &field,
                    count,
                    format!(
                        "must be less than or equal to {total} (the number of indexes in the specified succeededIndexes field)"
                    ),
                ));
            }
        }
    }
}

/// Upstream's `validateIndexesFormat`: how many indexes `1,3-5` names, each below `completions`,
/// in increasing order.
pub fn count_indexes(text: &str, completions: i32) -> Result<i32, String> {
    if text.is_empty() {
        return Ok(0);
    }
    let mut last: Option<i32> = None;
    let mut total = 0;
    for interval in text.split(',') {
        let parts: Vec<&str> = interval.split('-').collect();
        if parts.len() > 2 {
            return Err(format!(
                "the fragment {interval:?} violates the requirement that an index interval can have at most two parts separated by '-'"
            ));
        }
        let bound = |s: &str| -> Result<i32, String> {
            let x: i32 = s.parse().map_err(|_| format!("cannot convert string to integer for index: {s:?}"))?;
            if x >= completions {
                return Err(format!("too large index: {s:?}"));
            }
            Ok(x)
        };
        let x = bound(parts[0])?;
        let y = match parts.get(1) {
            Some(p) => bound(p)?,
            None => x,
        };
        if parts.len() == 2 && x >= y {
            return Err(format!("non-increasing order, previous: {x}, current: {y}"));
        }
        if let Some(l) = last
            && l >= x
        {
            return Err(format!("non-increasing order, previous: {l}, current: {x}"));
        }
        total += y - x + 1;
        last = Some(y);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn errors(spec: Value) -> Vec<String> {
        let mut spec = spec;
        spec["template"] = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "i"}]}});
        let spec: JobSpec = serde_json::from_value(spec).unwrap();
        let mut out = Vec::new();
        validate(&spec, "spec", &mut out);
        out.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn pod_failure_policies_are_checked_as_upstream() {
        let rules = |rules: Value| errors(json!({"podFailurePolicy": {"rules": rules}}));
        assert!(
            rules(json!([{"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [1, 42]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]))
            .is_empty()
        );
        assert_eq!(
            rules(json!([{"action": "FailJob"}])),
            [
                "spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required"
            ]
        );
        assert_eq!(
            rules(
                json!([{"action": "Stop", "onExitCodes": {"containerName": "side", "operator": "In", "values": [3, 0, 3]}}])
            ),
            [
                "spec.podFailurePolicy.rules[0].action: Unsupported value: \"Stop\": supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\"",
                "spec.podFailurePolicy.rules[0].onExitCodes.containerName: Invalid value: \"side\": must be one of the container or initContainer names in the pod template",
                "spec.podFailurePolicy.rules[0].onExitCodes.values[1]: Invalid value: 0: must not be 0 for the In operator",
                "spec.podFailurePolicy.rules[0].onExitCodes.values[2]: Duplicate value: 3",
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: []int32{3, 0, 3}: must be ordered",
            ]
        );
        assert_eq!(
            rules(json!([{"action": "FailIndex", "onExitCodes": {"operator": "Is", "values": []}}])),
            [
                "spec.podFailurePolicy.rules[0].action: Invalid value: \"FailIndex\": requires the backoffLimitPerIndex to be set",
                "spec.podFailurePolicy.rules[0].onExitCodes.operator: Unsupported value: \"Is\": supported values: \"In\", \"NotIn\"",
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: []int32{}: at least one value is required",
            ]
        );
        assert_eq!(
            errors(json!({"podFailurePolicy": {"rules": []}, "podReplacementPolicy": "TerminatingOrFailed"})),
            ["spec.podReplacementPolicy: Unsupported value: \"TerminatingOrFailed\": supported values: \"Failed\""]
        );
    }

    #[test]
    fn per_index_limits_and_success_policies_are_checked_as_upstream() {
        assert_eq!(
            errors(json!({"maxFailedIndexes": 2})),
            [
                "spec.backoffLimitPerIndex: Required value: when maxFailedIndexes is specified",
                "spec.maxFailedIndexes: Invalid value: 2: requires indexed completion mode",
            ]
        );
        let indexed = |extra: Value| {
            let mut spec = json!({"completionMode": "Indexed", "completions": 5, "backoffLimitPerIndex": 1});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            errors(spec)
        };
        assert!(indexed(json!({"maxFailedIndexes": 5, "successPolicy": {"rules": [{"succeededIndexes": "0,2-4", "succeededCount": 4}]}})).is_empty());
        assert_eq!(
            indexed(json!({"maxFailedIndexes": 6})),
            ["spec.maxFailedIndexes: Invalid value: 6: must be less than or equal to completions"]
        );
        assert_eq!(
            indexed(
                json!({"successPolicy": {"rules": [{}, {"succeededIndexes": "3-1"}, {"succeededIndexes": "0-1", "succeededCount": 3}]}})
            ),
            [
                "spec.successPolicy.rules[0]: Required value: at least one of succeededCount or succeededIndexes must be specified",
                "spec.successPolicy.rules[1].succeededIndexes: Invalid value: \"3-1\": error parsing succeededIndexes: non-increasing order, previous: 3, current: 1",
                "spec.successPolicy.rules[2].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
            ]
        );
        assert_eq!(count_indexes("0,2-4", 5), Ok(4));
        assert_eq!(count_indexes("7", 5), Err("too large index: \"7\"".into()));
        assert_eq!(count_indexes("1,1", 5), Err("non-increasing order, previous: 1, current: 1".into()));
        assert!(count_indexes("1-2-3", 5).unwrap_err().contains("at most two parts"));
    }
}
