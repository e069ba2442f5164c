//! The Node authorizer (upstream's `plugin/pkg/auth/authorizer/node`): a node reads only the
//! Secrets, ConfigMaps, claims, volumes and attachments its pods need, only its own Node, Lease and
//! CSINode, and lists pods only with `spec.nodeName=<itself>`; everything else is decided by
//! [`NODE_RULES`]. Writes to nodes and pods that these allow are narrowed further by the
//! NodeRestriction admission plugin in the registry.
//!
//! Upstream keeps a graph of pods, their references and nodes; here each decision looks the path
//! up in the store's index (a node asks for a Secret or a claim only when it starts a pod).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde::de::DeserializeOwned;

use super::Decision;
use super::request_info::{Attributes, ResourceAttributes};
use super::rules::{NODE_RULES, rules_allow};
use crate::registry::kinds::pod_rules::Referenced;
use crate::registry::selector::FieldSelector;
use crate::registry::{ListOptions, Registry};

const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What a node's objects point at, as upstream's graph vertex types.
#[derive(Clone, Copy, PartialEq)]
enum Object {
    Secret,
    ConfigMap,
    Claim,
    Volume,
    Attachment,
    ServiceAccount,
    Pod,
}

pub fn authorize(registry: &Registry, node: &str, attrs: &Attributes) -> Decision {
    let Some(r) = &attrs.resource else { return by_rules(attrs) };
    let verb = attrs.verb.as_str();
    match (r.group.as_str(), r.resource.as_str()) {
        ("", "secrets") => read_namespaced(registry, node, Object::Secret, verb, r),
        ("", "configmaps") => read_namespaced(registry, node, Object::ConfigMap, verb, r),
        ("", "persistentvolumeclaims") if r.subresource == "status" => match verb {
            "update" | "patch" => related(registry, node, Object::Claim, r),
            _ => Decision::no("can only get/update/patch this type"),
        },
        ("", "persistentvolumeclaims") => get_only(registry, node, Object::Claim, verb, r),
        ("", "persistentvolumes") => get_only(registry, node, Object::Volume, verb, r),
        ("storage.k8s.io", "volumeattachments") => get_only(registry, node, Object::Attachment, verb, r),
        ("", "serviceaccounts") => {
            if verb != "create" || r.name.is_empty() {
                Decision::no("can only create tokens for individual service accounts")
            } else if r.subresource != "token" {
                Decision::no("can only create token subresource of serviceaccount")
            } else {
                related(registry, node, Object::ServiceAccount, r)
            }
        }
        ("coordination.k8s.io", "leases") => {
            if !matches!(verb, "get" | "create" | "update" | "patch" | "delete") {
                Decision::no("can only get, create, update, patch, or delete a node lease")
            } else if r.namespace != NODE_LEASE_NAMESPACE {
                Decision::no(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"))
            } else if verb != "create" && r.name != node {
                Decision::no("can only access node lease with the same name as the requesting node")
            } else {
                Decision::Allow
            }
        }
        ("storage.k8s.io", "csinodes") => {
            if !matches!(verb, "get" | "create" | "update" | "patch" | "delete") {
                Decision::no("can only get, create, update, patch, or delete a CSINode")
            } else if !r.subresource.is_empty() {
                Decision::no("cannot authorize CSINode subresources")
            } else if verb != "create" && r.name != node {
                Decision::no("can only access CSINode with the same name as the requesting node")
            } else {
                Decision::Allow
            }
        }
        ("", "nodes") => match (r.subresource.as_str(), verb) {
            // NodeRestriction limits these to the node's own object.
            ("", "create" | "update" | "patch") | ("status", "update" | "patch") => Decision::Allow,
            ("", "get" | "list" | "watch") if r.name == node => Decision::Allow,
            ("", "get" | "list" | "watch") if r.name.is_empty() => {
                Decision::no(format!("node '{node}' cannot read all nodes, only its own Node object"))
            }
            ("", "get" | "list" | "watch") => {
                Decision::no(format!("node '{node}' cannot read '{}', only its own Node object", r.name))
            }
            _ => Decision::no(""),
        },
        ("", "pods") => match (r.subresource.as_str(), verb) {
            ("", "get") => get_only(registry, node, Object::Pod, verb, r),
            ("", "list" | "watch") => {
                if r.field_equals.iter().any(|(f, v)| f == "spec.nodeName" && v == node) {
                    Decision::Allow
                } else if !r.name.is_empty() {
                    related(registry, node, Object::Pod, r)
                } else {
                    Decision::no("can only list/watch pods with spec.nodeName field selector")
                }
            }
            // Mirror pods; NodeRestriction limits them to pods bound to the node.
            ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => Decision::Allow,
            _ => Decision::no(""),
        },
        _ => by_rules(attrs),
    }
}

fn by_rules(attrs: &Attributes) -> Decision {
    if rules_allow(attrs, &NODE_RULES) { Decision::Allow } else { Decision::no("") }
}

fn get_only(registry: &Registry, node: &str, kind: Object, verb: &str, r: &ResourceAttributes) -> Decision {
    if verb != "get" {
        return Decision::no("can only get individual resources of this type");
    }
    if !r.subresource.is_empty() {
        return Decision::no("cannot get subresource");
    }
    related(registry, node, kind, r)
}

fn read_namespaced(registry: &Registry, node: &str, kind: Object, verb: &str, r: &ResourceAttributes) -> Decision {
    if !matches!(verb, "get" | "list" | "watch") {
        return Decision::no("can only read resources of this type");
    }
    if !r.subresource.is_empty() {
        return Decision::no("cannot read subresource");
    }
    if r.namespace.is_empty() {
        return Decision::no("can only read namespaced object of this type");
    }
    related(registry, node, kind, r)
}

/// Allowed when the object leads to the node: node ← pod ← Secret/ConfigMap/claim/service account,
/// node ← pod ← claim ← volume (← its Secrets), node ← VolumeAttachment.
fn related(registry: &Registry, node: &str, kind: Object, r: &ResourceAttributes) -> Decision {
    if r.name.is_empty() {
        return Decision::no("No Object name found");
    }
    let lookup = Lookup { registry, node };
    let found = match kind {
        Object::Pod => lookup.get::<Pod>("", "pods", Some(&r.namespace), &r.name).is_some_and(|p| lookup.bound(&p)),
        Object::Attachment => lookup
            .get::<VolumeAttachment>("storage.k8s.io", "volumeattachments", None, &r.name)
            .is_some_and(|va| va.spec.node_name == node),
        Object::Volume => lookup.volume_used(&r.name),
        Object::Claim => lookup.pods(&r.namespace).iter().any(|p| claims(p).contains(&r.name)),
        Object::ServiceAccount => lookup
            .pods(&r.namespace)
            .iter()
            .any(|p| p.spec.as_ref().and_then(|s| s.service_account_name.as_deref()) == Some(r.name.as_str())),
        Object::Secret | Object::ConfigMap => {
            let pods = lookup.pods(&r.namespace);
            let refs = |p: &Pod| p.spec.as_ref().map(Referenced::all).unwrap_or_default();
            pods.iter().any(|p| {
                let refs = refs(p);
                if kind == Object::Secret { refs.secrets.contains(&r.name) } else { refs.config_maps.contains(&r.name) }
            }) || (kind == Object::Secret && lookup.volume_secret(&pods, &r.namespace, &r.name))
        }
    };
    if found {
        Decision::Allow
    } else {
        Decision::no(format!("no relationship found between node '{node}' and this object"))
    }
}

fn claims(pod: &Pod) -> Vec<String> {
    crate::controllers::protection::claims_of(pod)
}

struct Lookup<'a> {
    registry: &'a Registry,
    node: &'a str,
}

impl Lookup<'_> {
    fn get<K: DeserializeOwned>(&self, group: &str, plural: &str, ns: Option<&str>, name: &str) -> Option<K> {
        let r = self.registry.find(group, "v1", plural)?;
        let bytes = self.registry.get(&r, ns, name).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn bound(&self, pod: &Pod) -> bool {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node)
    }

    /// The pods of `ns` bound to the node.
    fn pods(&self, ns: &str) -> Vec<Pod> {
        let Some(r) = self.registry.find("", "v1", "pods") else { return Vec::new() };
        let Ok(fields) = FieldSelector::parse(&format!("spec.nodeName={}", self.node)) else { return Vec::new() };
        let opts = ListOptions { fields, ..Default::default() };
        let Ok(page) = self.registry.list(&r, Some(ns), &opts) else { return Vec::new() };
        page.items.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect()
    }

    /// A volume is the node's when the claim it is bound to is used by one of the node's pods.
    fn volume_used(&self, name: &str) -> bool {
        let Some(pv) = self.get::<PersistentVolume>("", "persistentvolumes", None, name) else { return false };
        let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return false };
        let (Some(ns), Some(claim)) = (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()) else { return false };
        let bound = self
            .get::<PersistentVolumeClaim>("", "persistentvolumeclaims", Some(ns), claim)
            .and_then(|c| c.spec.and_then(|s| s.volume_name))
            .is_some_and(|v| v == name);
        bound && self.pods(ns).iter().any(|p| claims(p).iter().any(|c| c == claim))
    }

    /// Whether a CSI volume behind one of the pods' claims names the Secret.
    fn volume_secret(&self, pods: &[Pod], ns: &str, secret: &str) -> bool {
        pods.iter().flat_map(claims).any(|claim| {
            let volume = self
                .get::<PersistentVolumeClaim>("", "persistentvolumeclaims", Some(ns), &claim)
                .and_then(|c| c.spec.and_then(|s| s.volume_name));
            let Some(pv) = volume.and_then(|v| self.get::<PersistentVolume>("", "persistentvolumes", None, &v)) else {
                return false;
            };
            let Some(csi) = pv.spec.and_then(|s| s.csi) else { return false };
            [
                csi.node_publish_secret_ref,
                csi.node_stage_secret_ref,
                csi.node_expand_secret_ref,
                csi.controller_expand_secret_ref,
            ]
            .into_iter()
            .flatten()
            .any(|r| r.name.as_deref() == Some(secret) && r.namespace.as_deref().is_none_or(|n| n == ns))
        })
    }
}
