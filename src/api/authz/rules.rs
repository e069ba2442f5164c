//! RBAC's rule matching (upstream's `rbac.RulesAllow`) and the built-in rule sets of the identities
//! cairn restricts: a node's (upstream's `NodeRules`, which the Node authorizer falls back to) and
//! the node controllers' (the service proxy, the cluster DNS, the pod routes and the per-node CSI
//! provisioner and attacher, which a joined node runs as `system:cairn-controller`, as a k3s agent
//! runs flannel as `system:k3s-controller`).

use std::sync::LazyLock;

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::request_info::Attributes;

/// Whether any rule allows the request.
pub fn rules_allow(attrs: &Attributes, rules: &[PolicyRule]) -> bool {
    rules.iter().any(|rule| rule_allows(attrs, rule))
}

fn rule_allows(attrs: &Attributes, rule: &PolicyRule) -> bool {
    let any = |list: &[String], want: &str| list.iter().any(|v| v == "*" || v == want);
    if !any(&rule.verbs, &attrs.verb) {
        return false;
    }
    let Some(r) = &attrs.resource else {
        return rule.non_resource_urls.iter().flatten().any(|url| {
            url == "*" || *url == attrs.path || url.strip_suffix('*').is_some_and(|p| attrs.path.starts_with(p))
        });
    };
    let combined = attrs.combined_resource().unwrap_or_default();
    let resource_matches = |res: &String| {
        res == "*"
            || *res == combined
            || (!r.subresource.is_empty() && res.strip_prefix("*/") == Some(r.subresource.as_str()))
    };
    any(rule.api_groups.as_deref().unwrap_or_default(), &r.group)
        && rule.resources.iter().flatten().any(resource_matches)
        && rule.resource_names.as_ref().is_none_or(|names| names.is_empty() || names.contains(&r.name))
}

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        verbs: owned(verbs),
        api_groups: Some(owned(groups)),
        resources: Some(owned(resources)),
        ..Default::default()
    }
}

const READ: &[&str] = &["get", "list", "watch"];

/// What every node may do beyond what the Node authorizer decides itself (upstream's
/// `bootstrappolicy.NodeRules`).
pub static NODE_RULES: LazyLock<Vec<PolicyRule>> = LazyLock::new(|| {
    vec![
        rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        rule(&["create"], &["authorization.k8s.io"], &["subjectaccessreviews", "localsubjectaccessreviews"]),
        rule(READ, &[""], &["services"]),
        rule(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        rule(&["update", "patch"], &[""], &["nodes/status"]),
        rule(&["update", "patch"], &[""], &["nodes"]),
        rule(&["create", "update", "patch"], &["", "events.k8s.io"], &["events"]),
        rule(READ, &[""], &["pods"]),
        rule(&["create", "delete"], &[""], &["pods"]),
        rule(&["update", "patch"], &[""], &["pods/status"]),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(READ, &[""], &["secrets", "configmaps"]),
        rule(&["get"], &[""], &["persistentvolumeclaims", "persistentvolumes"]),
        rule(&["get"], &[""], &["endpoints"]),
        rule(&["create", "get", "list", "watch"], &["certificates.k8s.io"], &["certificatesigningrequests"]),
        rule(&["get", "create", "update", "patch", "delete"], &["coordination.k8s.io"], &["leases"]),
        rule(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(&["get", "update", "patch"], &[""], &["persistentvolumeclaims/status"]),
        rule(READ, &["storage.k8s.io"], &["csidrivers"]),
        rule(&["get", "create", "update", "patch", "delete"], &["storage.k8s.io"], &["csinodes"]),
        rule(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
});

/// The node controllers' rules: upstream's `system:node-proxier` (the service proxy), what the
/// cluster DNS watches, and external-provisioner's and external-attacher's roles.
pub static CONTROLLER_RULES: LazyLock<Vec<PolicyRule>> = LazyLock::new(|| {
    vec![
        rule(&["list", "watch"], &[""], &["services", "endpoints", "namespaces"]),
        rule(READ, &[""], &["nodes"]),
        rule(&["create", "update", "patch"], &["", "events.k8s.io"], &["events"]),
        rule(&["list", "watch"], &["discovery.k8s.io"], &["endpointslices"]),
        rule(&["get", "list", "watch", "create", "update", "patch", "delete"], &[""], &["persistentvolumes"]),
        rule(&["get", "list", "watch", "update", "patch"], &[""], &["persistentvolumeclaims"]),
        rule(READ, &["storage.k8s.io"], &["storageclasses", "csinodes", "csidrivers"]),
        rule(&["get", "list", "watch", "update", "patch"], &["storage.k8s.io"], &["volumeattachments"]),
        rule(&["update", "patch"], &["storage.k8s.io"], &["volumeattachments/status"]),
    ]
});

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn allowed(method: Method, path: &str, query: Option<&str>, rules: &[PolicyRule]) -> bool {
        rules_allow(&Attributes::of(&method, path, query), rules)
    }

    #[test]
    fn verbs_groups_resources_and_names_must_all_match() {
        let mut named = rule(&["get"], &[""], &["configmaps"]);
        named.resource_names = Some(vec!["one".into()]);
        let rules =
            [rule(&["get", "list"], &[""], &["pods", "pods/status"]), named, rule(&["*"], &["apps"], &["*/scale"])];
        assert!(allowed(Method::GET, "/api/v1/namespaces/n/pods/p", None, &rules));
        assert!(allowed(Method::GET, "/api/v1/namespaces/n/pods/p/status", None, &rules));
        assert!(!allowed(Method::GET, "/api/v1/namespaces/n/pods/p/log", None, &rules));
        assert!(!allowed(Method::DELETE, "/api/v1/namespaces/n/pods/p", None, &rules));
        assert!(!allowed(Method::GET, "/apis/apps/v1/namespaces/n/pods/p", None, &rules));
        assert!(allowed(Method::GET, "/api/v1/namespaces/n/configmaps/one", None, &rules));
        assert!(!allowed(Method::GET, "/api/v1/namespaces/n/configmaps/two", None, &rules));
        assert!(allowed(Method::PUT, "/apis/apps/v1/namespaces/n/deployments/d/scale", None, &rules));
        assert!(!allowed(Method::PUT, "/apis/apps/v1/namespaces/n/deployments/d", None, &rules));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let rules = [PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(vec!["/healthz".into(), "/apis/*".into()]),
            ..Default::default()
        }];
        assert!(allowed(Method::GET, "/healthz", None, &rules));
        assert!(allowed(Method::GET, "/apis/apps", None, &rules));
        assert!(!allowed(Method::GET, "/metrics", None, &rules));
        assert!(!allowed(Method::POST, "/healthz", None, &rules));
    }
}
