//! Validation of resource requirements and resize policies.

use super::*;

/// `validateResourceRequirements` for containers, the pod level (`pod_level`) and the overhead.
pub fn validate_requirements(
    limits: Option<&Quantities>,
    requests: Option<&Quantities>,
    path: &str,
    pod_level: bool,
    out: &mut ErrorList,
) {
    let (limits_path, requests_path) = (format!("{path}.limits"), format!("{path}.requests"));
    for (name, quantity) in limits.into_iter().flatten() {
        let path = key(&limits_path, name);
        validate_resource_name(name, &path, pod_level, out);
        validate_quantity(name, quantity, &path, out);
    }
    for (name, quantity) in requests.into_iter().flatten() {
        let path = key(&requests_path, name);
        validate_resource_name(name, &path, pod_level, out);
        validate_quantity(name, quantity, &path, out);
        // Extended resources and hugepages cannot be overcommitted: request == limit.
        let overcommit = is_native_resource(name) && !name.starts_with("hugepages-");
        match limits.and_then(|l| l.get(name)) {
            Some(limit) => {
                let (Some(req), Some(lim)) = (parse_quantity(&quantity.0), parse_quantity(&limit.0)) else {
                    continue;
                };
                let (req_text, lim_text) = (shown(quantity), shown(limit));
                if !overcommit && req != lim {
                    let detail = format!("must be equal to {name} limit of {lim_text}");
                    out.push(FieldError::invalid(&requests_path, req_text, detail));
                } else if req > lim {
                    let detail = format!("must be less than or equal to {name} limit of {lim_text}");
                    out.push(FieldError::invalid(&requests_path, req_text, detail));
                }
            }
            None if !overcommit => {
                out.push(FieldError::required(&limits_path, "Limit must be set for non overcommitable resources"))
            }
            None => {}
        }
    }
}

/// A quantity as the API server prints it.
pub(super) fn shown(q: &Quantity) -> String {
    canonical_quantity(&q.0).unwrap_or_else(|| q.0.clone())
}

pub(super) fn validate_quantity(name: &str, q: &Quantity, path: &str, out: &mut ErrorList) {
    match parse_quantity_full(&q.0) {
        Err(e) => out.push(FieldError::invalid(path, &q.0, e)),
        Ok((milli, _)) => {
            if milli < 0 {
                out.push(FieldError::invalid(path, shown(q), "must be greater than or equal to 0"));
            }
            let integer = INTEGER_RESOURCES.contains(&name) || is_extended_resource(name);
            if integer && milli % 1000 != 0 {
                out.push(FieldError::invalid(path, shown(q), "must be an integer"));
            }
        }
    }
}

/// Container (or pod-level) resource names: standard names, or qualified extended resources.
pub(super) fn validate_resource_name(name: &str, path: &str, pod_level: bool, out: &mut ErrorList) {
    let unqualified = !name.contains('/');
    let mut errs = is_qualified_name(name);
    let standard =
        STANDARD_RESOURCES.contains(&name) || name.starts_with("hugepages-") || name.starts_with("requests.hugepages-");
    if errs.is_empty() && unqualified && !standard {
        errs.push("must be a standard resource type or fully qualified".to_string());
    }
    if pod_level {
        let supported = name == "cpu" || name == "memory" || name.starts_with("hugepages-");
        if errs.is_empty() && !supported {
            out.push(FieldError::not_supported(path, name, POD_LEVEL_RESOURCES));
        }
        push_msgs(out, path, name, errs);
        return;
    }
    if unqualified {
        let container = matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
        if !container {
            errs.push("must be a standard resource for containers".to_string());
        }
    } else if !is_native_resource(name) && !is_extended_resource(name) {
        errs.push("doesn't follow extended resource name standard".to_string());
    }
    push_msgs(out, path, name, errs);
}

pub(super) fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

pub fn is_extended_resource(name: &str) -> bool {
    !is_native_resource(name)
        && !name.starts_with("requests.")
        && is_qualified_name(&format!("requests.{name}")).is_empty()
}
