//! `metav1.LabelSelector` over typed labels (apimachinery's `labels` and `LabelSelectorAsSelector`):
//! matching, and the string form that Scale's `status.selector` and kubectl's SELECTOR column show.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

pub type Labels = BTreeMap<String, String>;

/// Whether a `metav1.LabelSelector` selects `labels`. An empty selector selects everything; `None`
/// selects nothing (upstream's `LabelSelectorAsSelector(nil)`).
pub fn selector_matches(selector: Option<&LabelSelector>, labels: &Labels) -> bool {
    let Some(sel) = selector else { return false };
    sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().flatten().all(|e| requirement_matches(e, labels))
}

fn requirement_matches(req: &LabelSelectorRequirement, labels: &Labels) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// The selector as `labels.Selector.String()` writes it: requirements sorted by key, values sorted
/// (`app=web,tier in (a,b),!canary`); empty for an empty or missing selector.
pub fn format_selector(selector: Option<&LabelSelector>) -> String {
    let Some(sel) = selector else { return String::new() };
    let mut parts: Vec<(String, String)> =
        sel.match_labels.iter().flatten().map(|(k, v)| (k.clone(), format!("{k}={v}"))).collect();
    for e in sel.match_expressions.iter().flatten() {
        let mut values = e.values.clone().unwrap_or_default();
        values.sort();
        let values = values.join(",");
        let text = match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => format!("{} {other} ({values})", e.key),
        };
        parts.push((e.key.clone(), text));
    }
    parts.sort();
    parts.into_iter().map(|(_, t)| t).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn selectors_match_and_print_as_upstream() {
        let s = selector(json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["b", "a"]},
            {"key": "canary", "operator": "DoesNotExist"}]}));
        let labels: Labels = [("app".into(), "web".into()), ("tier".into(), "a".into())].into();
        assert!(selector_matches(Some(&s), &labels));
        assert!(!selector_matches(None, &labels));
        assert!(selector_matches(Some(&LabelSelector::default()), &labels));
        let canary: Labels =
            [("app".into(), "web".into()), ("tier".into(), "a".into()), ("canary".into(), "".into())].into();
        assert!(!selector_matches(Some(&s), &canary));
        assert_eq!(format_selector(Some(&s)), "app=web,!canary,tier in (a,b)");
        assert_eq!(format_selector(None), "");
    }
}
