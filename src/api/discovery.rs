//! Discovery documents: legacy (`/api`, `/apis`, per group-version) and aggregated (`apidiscovery.k8s.io/v2`).

use serde_json::{Value, json};

use crate::registry::{Resource, ResourceInfo};

/// A resource as discovery lists it: a stored kind of the registry, or one served another way
/// (metrics.k8s.io), with the verbs it answers.
#[derive(Clone, Copy)]
pub struct Listed<'a> {
    pub info: &'a ResourceInfo,
    pub verbs: &'static [&'static str],
}

/// The registry's resources (every verb), then `served`.
pub fn listed<'a>(resources: &'a [Resource], served: impl IntoIterator<Item = Listed<'a>>) -> Vec<Listed<'a>> {
    let stored = resources.iter().map(|r| Listed { info: r.info(), verbs: VERBS });
    stored.chain(served).collect()
}

/// The Content-Type of an aggregated discovery answer.
pub const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const AGGREGATED_V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// Which aggregated discovery version the `Accept` header asks for, if any.
pub fn wants_aggregated(accept: &str) -> Option<&'static str> {
    for entry in accept.split(',') {
        let e: String = entry.chars().filter(|c| !c.is_whitespace()).collect();
        if e.contains("as=APIGroupDiscoveryList") && e.contains("g=apidiscovery.k8s.io") {
            if e.contains("v=v2beta1") {
                return Some(AGGREGATED_V2BETA1);
            }
            if e.contains("v=v2") {
                return Some(AGGREGATED_V2);
            }
        }
    }
    None
}

/// Named groups in discovery order with their versions, the preferred (first served) first.
fn groups(resources: &[Listed<'_>]) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for i in resources.iter().map(|r| r.info).filter(|i| !i.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == i.group) {
            Some((_, versions)) if !versions.contains(&i.version) => versions.push(i.version),
            Some(_) => {}
            None => out.push((i.group, vec![i.version])),
        }
    }
    out
}

/// An `APIGroup` body: its versions and the preferred one.
fn group_body(group: &str, versions: &[&str]) -> Value {
    let gv = |v: &&str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    let all: Vec<Value> = versions.iter().map(gv).collect();
    json!({"name": group, "versions": all, "preferredVersion": versions.first().map(gv)})
}

/// `/api`: the legacy core versions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `/apis`: the named groups.
pub fn api_group_list(resources: &[Listed<'_>]) -> Value {
    let groups: Vec<Value> = groups(resources).iter().map(|(g, versions)| group_body(g, versions)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`: one group.
pub fn api_group(resources: &[Listed<'_>], group: &str) -> Option<Value> {
    let (g, versions) = groups(resources).into_iter().find(|(g, _)| *g == group)?;
    let mut body = group_body(g, &versions);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Some(body)
}

/// `/api/v1` or `/apis/{group}/{version}`: the resources of one group-version.
pub fn resource_list(resources: &[Listed<'_>], group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for listed in resources.iter().filter(|l| l.info.group == group && l.info.version == version) {
        let r = listed.info;
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": listed.verbs,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        for sub in r.subresources {
            let (g, v, kind) = sub.response_kind(r);
            let mut e = json!({
                "name": format!("{}/{}", r.plural, sub.name()),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": sub.verbs(),
            });
            if g != group || v != version {
                e["group"] = json!(g);
                e["version"] = json!(v);
            }
            list.push(e);
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}

fn discovery_resource(listed: &Listed<'_>) -> Value {
    let r = listed.info;
    let mut e = json!({
        "resource": r.plural,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": listed.verbs,
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        e["categories"] = json!(r.categories);
    }
    if !r.subresources.is_empty() {
        let subs: Vec<Value> = r
            .subresources
            .iter()
            .map(|sub| {
                let (g, v, kind) = sub.response_kind(r);
                json!({"subresource": sub.name(), "responseKind": {"group": g, "version": v, "kind": kind}, "verbs": sub.verbs()})
            })
            .collect();
        e["subresources"] = Value::Array(subs);
    }
    e
}

/// Aggregated discovery for `/api` (`core == true`) or `/apis`.
pub fn aggregated(resources: &[Listed<'_>], core: bool, api_version: &str) -> Value {
    let group_ids = if core { vec![("", vec!["v1"])] } else { groups(resources) };
    let items: Vec<Value> = group_ids
        .into_iter()
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let res: Vec<Value> = resources
                        .iter()
                        .filter(|l| l.info.group == g && l.info.version == *v)
                        .map(discovery_resource)
                        .collect();
                    json!({"version": v, "resources": res, "freshness": "Current"})
                })
                .collect();
            let mut meta = json!({"creationTimestamp": null});
            if !g.is_empty() {
                meta["name"] = json!(g);
            }
            json!({"metadata": meta, "versions": versions})
        })
        .collect();
    let version =
        if api_version.contains("v2beta1") { "apidiscovery.k8s.io/v2beta1" } else { "apidiscovery.k8s.io/v2" };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": version, "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kinds;

    #[test]
    fn core_resources_are_listed_with_subresources() {
        let all = kinds::all();
        let list = resource_list(&listed(&all, []), "", "v1").unwrap();
        let names: Vec<&str> =
            list["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
        for n in ["pods", "pods/status", "pods/binding", "nodes", "nodes/status", "namespaces/finalize", "events"] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let binding = list["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods/binding").unwrap();
        assert_eq!(binding["kind"], "Binding");
        assert_eq!(binding["verbs"], json!(["create"]));
        // kubectl drain evicts only where `pods/eviction` is listed with its group and version.
        let eviction = list["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods/eviction").unwrap();
        assert_eq!(
            (&eviction["group"], &eviction["version"], &eviction["kind"]),
            (&json!("policy"), &json!("v1"), &json!("Eviction"))
        );
    }

    #[test]
    fn groups_and_aggregated() {
        let all = kinds::all();
        let all = listed(&all, []);
        let groups = api_group_list(&all);
        let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
        assert_eq!(
            names,
            vec![
                "apps",
                "events.k8s.io",
                "autoscaling",
                "batch",
                "certificates.k8s.io",
                "networking.k8s.io",
                "policy",
                "rbac.authorization.k8s.io",
                "storage.k8s.io",
                "scheduling.k8s.io",
                "coordination.k8s.io",
                "node.k8s.io",
                "discovery.k8s.io"
            ]
        );
        // Two versions of one group: the first served is preferred, as autoscaling/v2 upstream.
        let autoscaling = api_group(&all, "autoscaling").unwrap();
        assert_eq!(autoscaling["preferredVersion"]["groupVersion"], "autoscaling/v2");
        let versions: Vec<&str> =
            autoscaling["versions"].as_array().unwrap().iter().filter_map(|v| v["version"].as_str()).collect();
        assert_eq!(versions, ["v2", "v1"]);
        let agg = aggregated(&all, false, AGGREGATED_V2);
        let item = agg["items"].as_array().unwrap().iter().find(|i| i["metadata"]["name"] == "autoscaling").unwrap();
        assert_eq!(item["versions"][1]["resources"][0]["resource"], "horizontalpodautoscalers");
        let agg = aggregated(&all, true, AGGREGATED_V2);
        let pods = agg["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .unwrap();
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(
            wants_aggregated("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            Some(AGGREGATED_V2)
        );
        assert_eq!(wants_aggregated("application/json"), None);
    }
}
