//! Nodes: cluster-scoped, status writable only through `/status` (except on create, as upstream).

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

pub struct Nodes;

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl Kind for Nodes {
    type Obj = Node;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        singular: "node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        subresources: &[Subresource::Status, Subresource::Proxy],
        storage: super::NODES_STORAGE,
        return_deleted_object: false,
    };
    const MERGE_KEYS: &'static [MergeKey] = &[merge("status.conditions", "type"), merge("status.addresses", "type")];
    const FIELDS: &'static [&'static str] = &["spec.unschedulable"];

    fn validate(&self, node: &Node) -> ErrorList {
        let mut errs = Vec::new();
        let spec = node.spec.clone().unwrap_or_default();
        for (i, t) in spec.taints.unwrap_or_default().iter().enumerate() {
            let path = validation::index("spec.taints", i);
            for e in validation::is_qualified_name(&t.key) {
                errs.push(FieldError::invalid(validation::child(&path, "key"), &t.key, e));
            }
            if let Some(v) = &t.value {
                for e in validation::is_label_value(v) {
                    errs.push(FieldError::invalid(validation::child(&path, "value"), v, e));
                }
            }
            if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
                errs.push(FieldError::not_supported(validation::child(&path, "effect"), &t.effect, TAINT_EFFECTS));
            }
        }
        if let Some(cidr) = spec.pod_cidr.filter(|c| !c.is_empty())
            && !is_cidr(&cidr)
        {
            errs.push(FieldError::invalid(
                "spec.podCIDR",
                &cidr,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Node, old: &Node) -> ErrorList {
        let mut errs = self.validate(new);
        let old_cidr = old.spec.as_ref().and_then(|s| s.pod_cidr.clone()).unwrap_or_default();
        let new_cidr = new.spec.as_ref().and_then(|s| s.pod_cidr.clone()).unwrap_or_default();
        if !old_cidr.is_empty() && old_cidr != new_cidr {
            errs.push(FieldError::forbidden(
                "spec.podCIDR",
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        errs
    }

    fn prepare_update(&self, new: &mut Node, old: &Node) {
        new.status = old.status.clone();
    }

    fn prepare_status_update(&self, new: &mut Node, old: &Node) {
        new.spec = old.spec.clone();
    }

    fn field(&self, node: &Value, field: &str) -> Option<String> {
        match field {
            // An unset boolean reads as false, as upstream's field set renders it.
            "spec.unschedulable" => {
                Some(node["spec"].get("unschedulable").and_then(Value::as_bool).unwrap_or(false).to_string())
            }
            _ => None,
        }
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Status", "string", "The status of the node"),
            Column::new("Roles", "string", "The roles of the node"),
            AGE_COLUMN,
            Column::new("Version", "string", "Kubelet Version reported by the node."),
            Column::new("Internal-IP", "string", "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).").wide(),
            Column::new("External-IP", "string", "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).").wide(),
            Column::new("OS-Image", "string", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).").wide(),
            Column::new("Kernel-Version", "string", "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).").wide(),
            Column::new("Container-Runtime", "string", "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).").wide(),
        ]
    }

    fn cells(&self, node: &Node) -> Vec<Value> {
        let status = node.status.clone().unwrap_or_default();
        let mut state = match status
            .conditions
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone())
            .as_deref()
        {
            Some("True") => "Ready".to_string(),
            Some("False") => "NotReady".to_string(),
            _ => "Unknown".to_string(),
        };
        if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            state.push_str(",SchedulingDisabled");
        }
        let mut roles: Vec<String> = node
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
                Some(role) if !role.is_empty() => Some(role.to_string()),
                _ if k == "kubernetes.io/role" && !v.is_empty() => Some(v.clone()),
                _ => None,
            })
            .collect();
        roles.sort();
        roles.dedup();
        let roles = if roles.is_empty() { "<none>".to_string() } else { roles.join(",") };
        let addresses = status.addresses.unwrap_or_default();
        let address = |t: &str| {
            addresses.iter().find(|a| a.type_ == t).map(|a| a.address.clone()).unwrap_or_else(|| "<none>".into())
        };
        let info = status.node_info.unwrap_or_default();
        let unknown = |s: String| if s.is_empty() { "<unknown>".to_string() } else { s };
        vec![
            name_cell(&node.metadata),
            json!(state),
            json!(roles),
            age_cell(&node.metadata),
            json!(info.kubelet_version),
            json!(address("InternalIP")),
            json!(address("ExternalIP")),
            json!(unknown(info.os_image)),
            json!(unknown(info.kernel_version)),
            json!(unknown(info.container_runtime_version)),
        ]
    }
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else { return false };
    match (ip.parse::<std::net::IpAddr>(), bits.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(b)) => b <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(b)) => b <= 128,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_row_like_kubectl() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/master": "true"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {
                "kubeletVersion": "v1.37.0-cairn", "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1",
                "osImage": "Debian", "containerRuntimeVersion": "containerd://1.6", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"
            }, "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}
        }))
        .unwrap();
        let cells = Nodes.cells(&node);
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "control-plane,master");
        assert_eq!(cells[4], "v1.37.0-cairn");
        assert_eq!(cells[5], "10.0.0.1");
        assert_eq!(cells[6], "<none>");
    }

    #[test]
    fn taint_effects_are_checked() {
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}}),
        )
        .unwrap();
        let errs = Nodes.validate(&node);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.taints[0].effect");
    }
}
