//! The rules that tie pods to nodes, shared by the scheduler and the DaemonSet controller
//! (upstream's `k8s.io/component-helpers/scheduling/corev1`): node selector terms and tolerations.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};

use crate::labels::Labels;

/// Whether a node selector requirement (node affinity) holds for `value` of its key.
fn node_requirement_matches(req: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(|v| number(v)), values) else { return false };
            let Some(bound) = number(bound) else { return false };
            if req.operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// Whether a node selector term matches a node: every label expression holds for its labels and
/// every field expression (`metadata.name` only) for its name. A term with no requirements matches
/// nothing, as upstream.
pub fn node_term_matches(term: &NodeSelectorTerm, labels: &Labels, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| node_requirement_matches(r, labels.get(&r.key)))
        && fields.iter().all(|r| r.key == "metadata.name" && node_requirement_matches(r, Some(&name.to_string())))
}

/// Whether `tolerations` tolerate `taint`.
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| toleration_matches(t, taint))
}

/// upstream's `Toleration.ToleratesTaint`: an empty key or effect matches any.
pub fn toleration_matches(t: &Toleration, taint: &Taint) -> bool {
    t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect)
        && t.key.as_deref().is_none_or(|k| k.is_empty() || k == taint.key)
        && match t.operator.as_deref().unwrap_or_default() {
            "Exists" => true,
            "Equal" | "" => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn toleration_matching() {
        let taint: Taint = serde_json::from_value(json!({"key": "k", "value": "v", "effect": "NoSchedule"})).unwrap();
        let t = |v: serde_json::Value| -> Vec<Toleration> { vec![serde_json::from_value(v).unwrap()] };
        assert!(tolerates(&t(json!({"key": "k", "value": "v"})), &taint));
        assert!(tolerates(&t(json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"})), &taint));
        assert!(tolerates(&t(json!({"operator": "Exists"})), &taint));
        assert!(!tolerates(&t(json!({"key": "k", "value": "w"})), &taint));
        assert!(!tolerates(&t(json!({"key": "k", "value": "v", "effect": "NoExecute"})), &taint));
    }

    #[test]
    fn node_terms_and_operators() {
        let labels: Labels = [("zone".to_string(), "a".to_string()), ("cores".to_string(), "8".to_string())].into();
        let term = |v: serde_json::Value| -> NodeSelectorTerm { serde_json::from_value(v).unwrap() };
        assert!(node_term_matches(
            &term(json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]})),
            &labels,
            "n1"
        ));
        assert!(node_term_matches(
            &term(json!({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]})),
            &labels,
            "n1"
        ));
        assert!(!node_term_matches(
            &term(json!({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]})),
            &labels,
            "n1"
        ));
        assert!(node_term_matches(
            &term(json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})),
            &labels,
            "n1"
        ));
        assert!(node_term_matches(
            &term(json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]})),
            &labels,
            "n1"
        ));
        assert!(!node_term_matches(&term(json!({})), &labels, "n1"));
    }
}
