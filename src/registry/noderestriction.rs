//! The NodeRestriction admission plugin (upstream's `plugin/pkg/admission/noderestriction`): a
//! node's writes that the Node authorizer let through are narrowed to what is its own. It creates
//! only mirror pods bound to itself that refer to nothing else, deletes and reports on only pods
//! bound to itself, modifies only its own Node (never its taints, nor labels outside kubelet's set),
//! Lease and CSINode, and of a claim only its status.
//!
//! Checked on the object as it would be stored, after the kind's strategy (so a status write that
//! carries a stale spec is judged on the status it changes).

use std::collections::BTreeSet;

use serde_json::Value;

use super::error::{Result, StatusError};
use super::kinds::pod_rules::Referenced;
use super::{Registry, Resource, Subresource};

const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The labels kubelet sets on its own Node (upstream's `kubeletapis.IsKubeletLabel`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// A write a node makes.
pub(super) enum Write<'a> {
    Create(&'a Value),
    Update { old: &'a Value, new: &'a Value },
    Delete(&'a Value),
}

impl Write<'_> {
    fn object(&self) -> &Value {
        match self {
            Write::Create(o) | Write::Delete(o) => o,
            Write::Update { new, .. } => new,
        }
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

impl Registry {
    /// Admits `write` of `r` (its `sub`resource) by node `node`, or refuses it with upstream's text.
    pub(super) fn restrict_node(&self, node: &str, r: &Resource, sub: Option<Subresource>, write: Write) -> Result<()> {
        let info = r.info();
        let name = str_at(write.object(), "/metadata/name");
        let forbid = |why: String| Err(StatusError::forbidden(&info.group_resource(), name, why));
        match (info.group, info.plural) {
            ("", "pods") => match (sub, &write) {
                (None, Write::Create(pod)) => self.admit_mirror_pod(node, pod).or_else(forbid),
                (None, Write::Delete(pod)) if str_at(pod, "/spec/nodeName") != node => {
                    forbid(format!("node {node:?} can only delete pods with spec.nodeName set to itself"))
                }
                (None, Write::Delete(_)) => Ok(()),
                (None, Write::Update { .. }) => forbid(format!(
                    "unexpected operation \"UPDATE\", node {node:?} can only create and delete mirror pods"
                )),
                (Some(Subresource::Status), Write::Update { old, new }) => {
                    if str_at(old, "/spec/nodeName") != node {
                        forbid(format!(
                            "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                        ))
                    } else if labels(old) != labels(new) {
                        forbid(format!("node {node:?} cannot update labels through pod status"))
                    } else if old.pointer("/status/resourceClaimStatuses")
                        != new.pointer("/status/resourceClaimStatuses")
                    {
                        forbid(format!("node {node:?} cannot update resource claim statues"))
                    } else {
                        Ok(())
                    }
                }
                (Some(other), _) => forbid(format!(
                    "unexpected pod subresource {:?}, only 'status' and 'eviction' are allowed",
                    other.name()
                )),
            },
            ("", "nodes") => {
                if name != node {
                    return forbid(format!("node {node:?} is not allowed to modify node {name:?}"));
                }
                match &write {
                    Write::Create(new) => {
                        if new.pointer("/spec/configSource").is_some_and(|c| !c.is_null()) {
                            return forbid(format!(
                                "node {node:?} is not allowed to create pods with a non-nil configSource"
                            ));
                        }
                        let forbidden = forbidden_labels(&labels(new), &Default::default());
                        if !forbidden.is_empty() {
                            return forbid(format!(
                                "node {node:?} is not allowed to set the following labels: {}",
                                join(&forbidden)
                            ));
                        }
                        Ok(())
                    }
                    Write::Update { old, new } => {
                        let config = new.pointer("/spec/configSource").filter(|c| !c.is_null());
                        if config.is_some() && config != old.pointer("/spec/configSource") {
                            return forbid(format!(
                                "node {node:?} is not allowed to update configSource to a new non-nil configSource"
                            ));
                        }
                        if taints(old) != taints(new) {
                            return forbid(format!("node {node:?} is not allowed to modify taints"));
                        }
                        let forbidden = forbidden_labels(&labels(new), &labels(old));
                        if !forbidden.is_empty() {
                            return forbid(format!("is not allowed to modify labels: {}", join(&forbidden)));
                        }
                        Ok(())
                    }
                    Write::Delete(_) => Ok(()),
                }
            }
            ("", "persistentvolumeclaims") => match (sub, &write) {
                (Some(Subresource::Status), Write::Update { old, new }) => {
                    if beyond_claim_status(old) != beyond_claim_status(new) {
                        forbid(format!(
                            "node {node:?} is not allowed to update fields other than status.capacity and status.conditions"
                        ))
                    } else {
                        Ok(())
                    }
                }
                _ => forbid("may only update PVC status".into()),
            },
            ("coordination.k8s.io", "leases") => {
                if str_at(write.object(), "/metadata/namespace") != NODE_LEASE_NAMESPACE {
                    forbid(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"))
                } else if name != node {
                    forbid("can only access node lease with the same name as the requesting node".into())
                } else {
                    Ok(())
                }
            }
            ("storage.k8s.io", "csinodes") if name != node => {
                forbid("can only access CSINode with the same name as the requesting node".into())
            }
            _ => Ok(()),
        }
    }

    /// A node creates only mirror pods of its own static pods (owned by its Node, bound to it),
    /// which may not refer to other objects.
    fn admit_mirror_pod(&self, node: &str, pod: &Value) -> std::result::Result<(), String> {
        if pod.pointer("/metadata/annotations").and_then(|a| a.get(MIRROR_POD_ANNOTATION)).is_none() {
            return Err(format!(
                "pod does not have {MIRROR_POD_ANNOTATION:?} annotation, node {node:?} can only create mirror pods"
            ));
        }
        if str_at(pod, "/spec/nodeName") != node {
            return Err(format!("node {node:?} can only create pods with spec.nodeName set to itself"));
        }
        let owners = pod.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
        let owner = match owners.as_slice() {
            [] => return Err(format!("node {node:?} can only create pods with an owner reference set to itself")),
            [owner] => owner,
            _ => return Err(format!("node {node:?} can only create pods with a single owner reference set to itself")),
        };
        if (str_at(owner, "/apiVersion"), str_at(owner, "/kind"), str_at(owner, "/name")) != ("v1", "Node", node) {
            return Err(format!("node {node:?} can only create pods with an owner reference set to itself"));
        }
        if owner.get("controller").and_then(Value::as_bool) != Some(true) {
            return Err(format!("node {node:?} can only create pods with a controller owner reference set to itself"));
        }
        if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
            return Err(format!("node {node:?} must not set blockOwnerDeletion on an owner reference"));
        }
        let uid = self
            .find("", "v1", "nodes")
            .and_then(|r| self.get_value(&r, None, node).ok())
            .map(|n| str_at(&n, "/metadata/uid").to_string())
            .ok_or_else(|| format!("nodes {node:?} not found"))?;
        if str_at(owner, "/uid") != uid {
            return Err(format!("node {node} UID mismatch: expected {} got {uid}", str_at(owner, "/uid")));
        }
        if !str_at(pod, "/spec/serviceAccountName").is_empty() {
            return Err(format!("node {node:?} can not create pods that reference a service account"));
        }
        let spec = serde_json::from_value(pod.get("spec").cloned().unwrap_or_default()).unwrap_or_default();
        let refs = Referenced::all(&spec);
        if !refs.secrets.is_empty() {
            return Err(format!("node {node:?} can not create pods that reference secrets"));
        }
        if !refs.config_maps.is_empty() {
            return Err(format!("node {node:?} can not create pods that reference configmaps"));
        }
        let volumes = spec.volumes.unwrap_or_default();
        let projected = volumes.iter().flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()));
        if projected.clone().any(|s| s.cluster_trust_bundle.is_some()) {
            return Err(format!("node {node:?} can not create pods that reference clustertrustbundles"));
        }
        if volumes.iter().any(|v| v.persistent_volume_claim.is_some()) {
            return Err(format!("node {node:?} can not create pods that reference persistentvolumeclaims"));
        }
        Ok(())
    }

    /// Eviction by a node: only of pods bound to it.
    pub(super) fn restrict_node_eviction(&self, node: &str, pod: &Value) -> Result<()> {
        if str_at(pod, "/spec/nodeName") == node {
            return Ok(());
        }
        let gr = super::GroupResource { group: String::new(), resource: "pods".into() };
        Err(StatusError::forbidden(
            &gr,
            str_at(pod, "/metadata/name"),
            format!("node {node} can only evict pods with spec.nodeName set to itself"),
        ))
    }
}

fn labels(v: &Value) -> serde_json::Map<String, Value> {
    v.pointer("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default()
}

fn taints(v: &Value) -> Vec<Value> {
    v.pointer("/spec/taints").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn join(labels: &BTreeSet<String>) -> String {
    labels.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// Labels added, removed or changed that a node may not touch: `node-restriction.kubernetes.io/`
/// ones, and `kubernetes.io`/`k8s.io` ones outside kubelet's own.
fn forbidden_labels(new: &serde_json::Map<String, Value>, old: &serde_json::Map<String, Value>) -> BTreeSet<String> {
    let changed =
        new.iter().filter(|(k, v)| old.get(*k) != Some(v)).chain(old.iter().filter(|(k, v)| new.get(*k) != Some(v)));
    changed
        .map(|(k, _)| k.clone())
        .filter(|key| {
            let ns = key.split_once('/').map_or("", |(ns, _)| ns);
            let under = |domain: &str| ns == domain || ns.ends_with(&format!(".{domain}"));
            let kubelet = KUBELET_LABELS.contains(&key.as_str()) || KUBELET_LABEL_NAMESPACES.iter().any(|d| under(d));
            under("node-restriction.kubernetes.io") || ((under("kubernetes.io") || under("k8s.io")) && !kubelet)
        })
        .collect()
}

/// A claim without what a node may change in it.
fn beyond_claim_status(claim: &Value) -> Value {
    let mut c = claim.clone();
    if let Some(meta) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    if let Some(status) = c.get_mut("status").and_then(Value::as_object_mut) {
        for field in ["capacity", "conditions", "allocatedResourceStatuses", "allocatedResources"] {
            status.remove(field);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn kubelet_labels_pass_others_under_kubernetes_io_do_not() {
        let old = map(json!({"kubernetes.io/hostname": "a", "node-role.kubernetes.io/worker": "true"}));
        let new = map(json!({
            "kubernetes.io/hostname": "a", "kubernetes.io/arch": "arm64", "node.kubernetes.io/exclude-from-external-load-balancers": "",
            "nvidia.com/gpu.count": "1", "node-restriction.kubernetes.io/secure": "true", "example.k8s.io/x": "1"
        }));
        let forbidden: Vec<String> = forbidden_labels(&new, &old).into_iter().collect();
        assert_eq!(
            forbidden,
            ["example.k8s.io/x", "node-restriction.kubernetes.io/secure", "node-role.kubernetes.io/worker"]
        );
    }
}
