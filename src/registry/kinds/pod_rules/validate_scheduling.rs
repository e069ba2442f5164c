//! Validation of affinity, node selector terms and label selectors.

use super::*;

pub(super) fn validate_affinity(affinity: &Affinity, out: &mut ErrorList) {
    const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";
    const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
    if let Some(na) = &affinity.node_affinity {
        let path = "spec.affinity.nodeAffinity";
        if let Some(selector) = &na.required_during_scheduling_ignored_during_execution {
            let terms_path = format!("{path}.{REQUIRED}.nodeSelectorTerms");
            if selector.node_selector_terms.is_empty() {
                let detail = "must have at least one node selector term";
                out.push(FieldError::required(&terms_path, detail));
            }
            for (i, term) in selector.node_selector_terms.iter().enumerate() {
                validate_node_selector_term(term, false, &index(&terms_path, i), out);
            }
        }
        let preferred = slice(&na.preferred_during_scheduling_ignored_during_execution);
        for (i, term) in preferred.iter().enumerate() {
            let path = format!("{path}.{PREFERRED}[{i}]");
            check_weight(term.weight, &path, out);
            // Preferred terms may name label values no node has yet.
            validate_node_selector_term(&term.preference, true, &format!("{path}.preference"), out);
        }
    }
    let pod_terms = [
        (
            "podAffinity",
            affinity.pod_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            affinity.pod_anti_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ];
    for (field, terms) in pod_terms {
        let Some((required, preferred)) = terms else {
            continue;
        };
        let path = format!("spec.affinity.{field}");
        for (i, term) in slice(required).iter().enumerate() {
            validate_pod_affinity_term(term, &format!("{path}.{REQUIRED}[{i}]"), out);
        }
        for (i, weighted) in slice(preferred).iter().enumerate() {
            let path = format!("{path}.{PREFERRED}[{i}]");
            check_weight(weighted.weight, &path, out);
            validate_pod_affinity_term(&weighted.pod_affinity_term, &format!("{path}.podAffinityTerm"), out);
        }
    }
}

pub(super) fn check_weight(weight: i32, path: &str, out: &mut ErrorList) {
    if !(1..=100).contains(&weight) {
        out.push(invalid_raw(&format!("{path}.weight"), weight, "must be in the range 1-100"));
    }
}

pub(super) fn validate_pod_affinity_term(term: &PodAffinityTerm, path: &str, out: &mut ErrorList) {
    validate_label_selector(term.label_selector.as_ref(), &format!("{path}.labelSelector"), out);
    let namespace_selector = term.namespace_selector.as_ref();
    validate_label_selector(namespace_selector, &format!("{path}.namespaceSelector"), out);
    for namespace in slice(&term.namespaces) {
        // Upstream reports these on `namespace`, not `namespaces[i]`.
        dns_label(namespace, &format!("{path}.namespace"), out);
    }
    let key_path = format!("{path}.topologyKey");
    if term.topology_key.is_empty() {
        out.push(FieldError::required(&key_path, "can not be empty"));
    }
    qualified_name(&term.topology_key, &key_path, out);
}

pub fn validate_node_selector_term(term: &NodeSelectorTerm, any_value: bool, path: &str, out: &mut ErrorList) {
    for (i, req) in slice(&term.match_expressions).iter().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        validate_requirement(&req.key, &req.operator, slice(&req.values), true, any_value, &path, out);
    }
    for (i, req) in slice(&term.match_fields).iter().enumerate() {
        let path = format!("{path}.matchFields[{i}]");
        let values = slice(&req.values);
        match req.operator.as_str() {
            "In" | "NotIn" if values.len() != 1 => out.push(FieldError::required(
                format!("{path}.values"),
                "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            )),
            "In" | "NotIn" => {}
            op => out.push(FieldError::invalid(format!("{path}.operator"), op, "not a valid selector operator")),
        }
        if req.key == "metadata.name" {
            for (j, value) in values.iter().enumerate() {
                dns_subdomain(value, &format!("{path}.values[{j}]"), out);
            }
        } else {
            let field = format!("{path}.key");
            out.push(FieldError::invalid(field, &req.key, "not a valid field selector key"));
        }
    }
}

/// `metav1.ValidateLabelSelector`.
pub fn validate_label_selector(selector: Option<&LabelSelector>, path: &str, out: &mut ErrorList) {
    let Some(selector) = selector else { return };
    let labels = selector.match_labels.iter().flatten();
    out.extend(validate_labels(labels, &format!("{path}.matchLabels")));
    for (i, req) in slice(&selector.match_expressions).iter().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        validate_requirement(&req.key, &req.operator, slice(&req.values), false, false, &path, out);
    }
}

/// A label (or node) selector requirement; `node` admits the `Gt`/`Lt` operators.
pub(super) fn validate_requirement(
    key: &str,
    operator: &str,
    values: &[String],
    node: bool,
    any_value: bool,
    path: &str,
    out: &mut ErrorList,
) {
    let values_path = format!("{path}.values");
    match operator {
        "In" | "NotIn" if values.is_empty() => {
            out.push(FieldError::required(&values_path, "must be specified when `operator` is 'In' or 'NotIn'"))
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => out.push(FieldError::forbidden(
            &values_path,
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if node && values.len() != 1 => out
            .push(FieldError::required(&values_path, "must be specified single value when `operator` is 'Lt' or 'Gt'")),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        "Gt" | "Lt" if node => {}
        _ => out.push(FieldError::invalid(format!("{path}.operator"), operator, "not a valid selector operator")),
    }
    qualified_name(key, &format!("{path}.key"), out);
    if !any_value {
        for (i, value) in values.iter().enumerate() {
            push_msgs(out, &index(&values_path, i), value, is_label_value(value));
        }
    }
}
