//! Namespaces: `Active` on create, `Terminating` on delete until the namespace controller has emptied
//! them and cleared `spec.finalizers` through `/finalize`.

use k8s_openapi::api::core::v1::{Namespace, NamespaceSpec, NamespaceStatus};
use serde_json::{Value, json};

use crate::registry::Subresource;
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, NameRule, ResourceInfo, age_cell, name_cell};

pub struct Namespaces;

/// The finalizer the namespace controller owns.
pub const KUBERNETES_FINALIZER: &str = "kubernetes";
/// The label upstream puts on every namespace.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

impl Kind for Namespaces {
    type Obj = Namespace;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        singular: "namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        subresources: &[Subresource::Status, Subresource::Finalize],
        storage: super::NAMESPACES_STORAGE,
        return_deleted_object: true,
    };
    const FIELDS: &'static [&'static str] = &["status.phase"];
    const NAME_RULE: NameRule = NameRule::Label;

    fn prepare_create(&self, ns: &mut Namespace) {
        ns.status = Some(NamespaceStatus { phase: Some("Active".into()), ..Default::default() });
        let spec = ns.spec.get_or_insert_with(NamespaceSpec::default);
        let finalizers = spec.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == KUBERNETES_FINALIZER) {
            finalizers.push(KUBERNETES_FINALIZER.into());
        }
        set_name_label(ns);
    }

    fn prepare_update(&self, new: &mut Namespace, old: &Namespace) {
        new.status = old.status.clone();
        // spec.finalizers change only through /finalize.
        new.spec = old.spec.clone();
        set_name_label(new);
    }

    fn prepare_status_update(&self, new: &mut Namespace, old: &Namespace) {
        new.spec = old.spec.clone();
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, Column::new("Status", "string", "The status of the namespace"), AGE_COLUMN]
    }

    fn cells(&self, ns: &Namespace) -> Vec<Value> {
        let phase = ns.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        vec![name_cell(&ns.metadata), json!(phase), age_cell(&ns.metadata)]
    }

    fn pending_finalizers(&self, ns: &Namespace) -> bool {
        ns.spec.as_ref().and_then(|s| s.finalizers.as_ref()).is_some_and(|f| !f.is_empty())
    }

    fn mark_deleting(&self, ns: &mut Namespace) {
        ns.status.get_or_insert_with(NamespaceStatus::default).phase = Some("Terminating".into());
    }
}

fn set_name_label(ns: &mut Namespace) {
    if let Some(name) = ns.metadata.name.clone() {
        ns.metadata.labels.get_or_insert_with(Default::default).insert(NAME_LABEL.into(), name);
    }
}
