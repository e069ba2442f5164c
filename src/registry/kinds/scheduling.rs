//! `scheduling.k8s.io/v1` PriorityClasses: a name for a pod priority (`value`), whether pods without a
//! class get it (`globalDefault`), and whether its pods may preempt (`preemptionPolicy`). The two
//! system classes are made at start (`registry::bootstrap`); the Priority admission that turns a
//! pod's class into `spec.priority` is in `registry/admission.rs`.

use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde_json::{Value, json};

use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

/// Highest priority a user-made class may have (upstream's `HighestUserDefinablePriority`).
pub const HIGHEST_USER_DEFINABLE_PRIORITY: i32 = 1_000_000_000;
/// Priority of `system-cluster-critical` (upstream's `SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2 * HIGHEST_USER_DEFINABLE_PRIORITY;
/// Names with this prefix are reserved for the system classes.
const SYSTEM_PREFIX: &str = "system-";
pub const PREEMPT_LOWER_PRIORITY: &str = "PreemptLowerPriority";
pub const NEVER: &str = "Never";

/// The built-in classes: name, value, description (upstream's `SystemPriorityClasses`).
pub const SYSTEM_CLASSES: [(&str, i32, &str); 2] = [
    (
        "system-node-critical",
        SYSTEM_CRITICAL_PRIORITY + 1000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        SYSTEM_CRITICAL_PRIORITY,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The value of a system class, by name.
pub fn system_class_value(name: &str) -> Option<i32> {
    SYSTEM_CLASSES.iter().find(|(n, ..)| *n == name).map(|(_, v, _)| *v)
}

pub struct PriorityClasses;

impl Kind for PriorityClasses {
    type Obj = PriorityClass;
    const INFO: ResourceInfo = ResourceInfo {
        group: "scheduling.k8s.io",
        version: "v1",
        kind: "PriorityClass",
        plural: "priorityclasses",
        singular: "priorityclass",
        namespaced: false,
        short_names: &["pc"],
        categories: &[],
        subresources: &[],
        storage: "priorityclasses.scheduling.k8s.io",
        return_deleted_object: false,
    };

    fn prepare_create(&self, pc: &mut PriorityClass) {
        pc.preemption_policy.get_or_insert_with(|| PREEMPT_LOWER_PRIORITY.into());
    }

    fn prepare_update(&self, new: &mut PriorityClass, old: &PriorityClass) {
        if new.preemption_policy.is_none() {
            new.preemption_policy = old.preemption_policy.clone();
        }
    }

    /// upstream's `ValidatePriorityClass`.
    fn validate(&self, pc: &PriorityClass) -> ErrorList {
        let mut out = Vec::new();
        let name = pc.metadata.name.as_deref().unwrap_or_default();
        let value = pc.value.unwrap_or(0);
        let reserved = |error: String| {
            FieldError::forbidden(
                "metadata.name",
                format!(
                    "priority class names with '{SYSTEM_PREFIX}' prefix are reserved for system use only. error: {error}"
                ),
            )
        };
        match system_class_value(name) {
            Some(wanted) if wanted != value => {
                out.push(reserved(format!("value of {name} PriorityClass must be {wanted}")));
            }
            Some(_) if pc.global_default == Some(true) => {
                out.push(reserved(format!("globalDefault of {name} PriorityClass must be false")));
            }
            Some(_) => {}
            None if name.starts_with(SYSTEM_PREFIX) => {
                out.push(reserved(format!("{name} is not a known system priority class")));
            }
            None if value > HIGHEST_USER_DEFINABLE_PRIORITY => out.push(FieldError::forbidden(
                "value",
                format!("maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"),
            )),
            None => {}
        }
        match pc.preemption_policy.as_deref() {
            Some("") => out.push(FieldError::required("preemptionPolicy", "")),
            Some(policy) if !matches!(policy, PREEMPT_LOWER_PRIORITY | NEVER) => {
                out.push(FieldError::not_supported("preemptionPolicy", policy, &[NEVER, PREEMPT_LOWER_PRIORITY]));
            }
            _ => {}
        }
        out
    }

    /// upstream's `ValidatePriorityClassUpdate`: the value and the preemption policy stay.
    fn validate_update(&self, new: &PriorityClass, old: &PriorityClass) -> ErrorList {
        let mut out = self.validate(new);
        if new.value != old.value {
            out.push(FieldError::forbidden("value", "may not be changed in an update."));
        }
        if new.preemption_policy != old.preemption_policy {
            let policy = new.preemption_policy.as_deref().unwrap_or_default();
            out.push(FieldError::invalid("preemptionPolicy", policy, "field is immutable"));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Value",
                "integer",
                "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
            ),
            Column::new(
                "Global-Default",
                "boolean",
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.",
            ),
            AGE_COLUMN,
            Column::new(
                "PreemptionPolicy",
                "string",
                "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.",
            ),
        ]
    }

    fn cells(&self, pc: &PriorityClass) -> Vec<Value> {
        vec![
            name_cell(&pc.metadata),
            json!(pc.value.unwrap_or(0)),
            json!(pc.global_default.unwrap_or(false)),
            age_cell(&pc.metadata),
            json!(pc.preemption_policy.as_deref().unwrap_or(PREEMPT_LOWER_PRIORITY)),
        ]
    }
}
