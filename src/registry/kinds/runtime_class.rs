//! `node.k8s.io/v1` RuntimeClasses: which CRI runtime handler a pod runs under (`handler`, a DNS
//! label, immutable), with its fixed overhead and the scheduling constraints its pods get (the
//! `RuntimeClass` admission applies both to pods, in `registry/admission.rs`).

use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::{Value, json};

use super::pod_rules::{validate_requirements, validate_tolerations};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

pub struct RuntimeClasses;

impl Kind for RuntimeClasses {
    type Obj = RuntimeClass;
    const INFO: ResourceInfo = ResourceInfo {
        group: "node.k8s.io",
        version: "v1",
        kind: "RuntimeClass",
        plural: "runtimeclasses",
        singular: "runtimeclass",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "runtimeclasses.node.k8s.io",
        return_deleted_object: false,
    };

    fn validate(&self, rc: &RuntimeClass) -> ErrorList {
        let mut out: ErrorList = validation::is_dns1123_label(&rc.handler)
            .into_iter()
            .map(|e| FieldError::invalid("handler", &rc.handler, e))
            .collect();
        if let Some(fixed) = rc.overhead.as_ref().and_then(|o| o.pod_fixed.as_ref()) {
            validate_requirements(Some(fixed), None, "overhead", false, &mut out);
        }
        if let Some(s) = &rc.scheduling {
            if let Some(selector) = &s.node_selector {
                out.extend(validation::validate_labels(selector, "scheduling.nodeSelector"));
            }
            validate_tolerations(s.tolerations.as_deref().unwrap_or_default(), "scheduling.tolerations", &mut out);
        }
        out
    }

    fn validate_update(&self, new: &RuntimeClass, old: &RuntimeClass) -> ErrorList {
        let mut out = self.validate(new);
        if new.handler != old.handler {
            out.push(FieldError::invalid("handler", &new.handler, "field is immutable"));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Handler",
                "string",
                "Handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class. The possible values are specific to the node & CRI configuration.  It is assumed that all handlers are available on every node, and handlers of the same name are equivalent on every node. For example, a handler called \"runc\" might specify that the runc OCI runtime (using native Linux containers) will be used to run the containers in a pod. The Handler must be lowercase, conform to the DNS Label (RFC 1123) requirements, and is immutable.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, rc: &RuntimeClass) -> Vec<Value> {
        vec![name_cell(&rc.metadata), json!(rc.handler), age_cell(&rc.metadata)]
    }
}
