//! The admission plugins that look at other objects than the one written (those that need only the
//! object itself are in its kind's strategy): `DefaultStorageClass` (a claim without a class gets the
//! default one), `PersistentVolumeClaimResize` (a claim may grow only when its class allows) and
//! `RuntimeClass` (a pod's class must exist; its overhead and scheduling constraints go into the pod)
//! and `Priority` (a pod's PriorityClass, or the global default, gives its `spec.priority`; one
//! global default at most).

use serde_json::{Value, json};

use super::error::{Result, StatusError};
use super::kinds::scheduling::{PREEMPT_LOWER_PRIORITY, system_class_value};
use super::kinds::storage::{is_default_class, storage_bytes};
use super::{Registry, Resource};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Toleration};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;

const CLAIMS: &str = "persistentvolumeclaims";
const PODS: &str = "pods";
const PRIORITY_CLASSES: &str = "priorityclasses";
const SCHEDULING_GROUP: &str = "scheduling.k8s.io";
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

impl Registry {
    /// Every stored object of a cluster-scoped resource.
    fn all_of<T: serde::de::DeserializeOwned>(&self, group: &str, plural: &str) -> Vec<T> {
        let Some(r) = self.find(group, "v1", plural) else { return Vec::new() };
        self.store()
            .list(&Self::prefix(&r, None), None)
            .items
            .iter()
            .filter_map(|(_, obj)| serde_json::from_slice(&obj.data).ok())
            .collect()
    }

    fn storage_classes(&self) -> Vec<StorageClass> {
        self.all_of("storage.k8s.io", "storageclasses")
    }

    /// One stored object of a cluster-scoped resource, by name.
    fn one_of<T: serde::de::DeserializeOwned>(&self, group: &str, plural: &str, name: &str) -> Option<T> {
        let r = self.find(group, "v1", plural)?;
        let obj = self.store().get(&Self::key(&r, None, name))?;
        serde_json::from_slice(&obj.data).ok()
    }

    fn runtime_class(&self, name: &str) -> Option<RuntimeClass> {
        self.one_of("node.k8s.io", "runtimeclasses", name)
    }

    fn priority_classes(&self) -> Vec<PriorityClass> {
        self.all_of(SCHEDULING_GROUP, PRIORITY_CLASSES)
    }

    /// Admission of a create, before the kind's defaults and validation.
    pub(super) fn admit_create_with_others(&self, r: &Resource, obj: &mut Value) -> Result<()> {
        match (r.info().group, r.info().plural) {
            ("", CLAIMS) => self.default_storage_class(obj),
            ("", PODS) => {
                self.admit_runtime_class(r, obj)?;
                return self.admit_priority(r, obj);
            }
            (SCHEDULING_GROUP, PRIORITY_CLASSES) => return self.one_global_default(r, obj),
            _ => {}
        }
        Ok(())
    }

    /// `Priority` on a pod's create: its class (or, naming none, the global default class with the
    /// lowest value, or priority 0 and `PreemptLowerPriority` when there is none) gives
    /// `spec.priority` and `spec.preemptionPolicy`; a pod may not ask for other values.
    fn admit_priority(&self, r: &Resource, pod: &mut Value) -> Result<()> {
        let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let forbid = |msg: String| Err(StatusError::forbidden(&r.info().group_resource(), &name, msg));
        let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
        let class_name = spec.get("priorityClassName").and_then(Value::as_str).unwrap_or_default().to_string();
        let class = if class_name.is_empty() {
            let classes = self.priority_classes();
            let default =
                classes.into_iter().filter(|c| c.global_default == Some(true)).min_by_key(|c| c.value.unwrap_or(0));
            if let Some(c) = &default {
                spec.insert("priorityClassName".into(), json!(c.metadata.name.clone().unwrap_or_default()));
            }
            default
        } else {
            // One lookup by name, not a listing.
            match self.one_of::<PriorityClass>(SCHEDULING_GROUP, PRIORITY_CLASSES, &class_name) {
                Some(c) => Some(c),
                None => return forbid(format!("no PriorityClass with name {class_name} was found")),
            }
        };
        let priority = class.as_ref().and_then(|c| c.value).unwrap_or(0);
        if let Some(asked) = spec.get("priority").and_then(Value::as_i64)
            && asked != i64::from(priority)
        {
            return forbid(format!(
                "the integer value of priority ({asked}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
            ));
        }
        spec.insert("priority".into(), json!(priority));
        let policy = match class {
            Some(c) => c.preemption_policy,
            None => Some(PREEMPT_LOWER_PRIORITY.to_string()),
        };
        if let Some(policy) = policy {
            if let Some(asked) = spec.get("preemptionPolicy").and_then(Value::as_str)
                && asked != policy
            {
                return forbid(format!(
                    "the string value of PreemptionPolicy ({asked}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
                ));
            }
            spec.insert("preemptionPolicy".into(), json!(policy));
        }
        Ok(())
    }

    /// `Priority` on a PriorityClass's create or update: at most one class is the global default.
    fn one_global_default(&self, r: &Resource, class: &Value) -> Result<()> {
        if class.get("globalDefault").and_then(Value::as_bool) != Some(true) {
            return Ok(());
        }
        let name = class.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let other = self
            .priority_classes()
            .into_iter()
            .find(|c| c.global_default == Some(true) && c.metadata.name.as_deref() != Some(name));
        match other {
            Some(c) => Err(StatusError::forbidden(
                &r.info().group_resource(),
                name,
                format!(
                    "PriorityClass {} is already marked as default. Only one default can exist",
                    c.metadata.name.unwrap_or_default()
                ),
            )),
            None => Ok(()),
        }
    }

    /// `RuntimeClass`: the pod's class must exist; its `overhead.podFixed` becomes the pod's
    /// `spec.overhead` (which the pod may not set otherwise), its `scheduling` is merged into the pod's
    /// node selector (a conflicting key refuses the pod) and tolerations.
    fn admit_runtime_class(&self, r: &Resource, pod: &mut Value) -> Result<()> {
        let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let forbid = |msg: String| Err(StatusError::forbidden(&r.info().group_resource(), &name, msg));
        let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
        let overhead = spec.get("overhead").filter(|o| !o.is_null()).cloned();
        let Some(class) = spec.get("runtimeClassName").and_then(Value::as_str).map(str::to_string) else {
            if overhead.is_some() {
                return forbid(
                    "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".into(),
                );
            }
            return Ok(());
        };
        let Some(rc) = self.runtime_class(&class) else {
            return forbid(format!("pod rejected: RuntimeClass \"{class}\" not found"));
        };
        match rc.overhead.and_then(|o| o.pod_fixed) {
            Some(fixed) => {
                let fixed = serde_json::to_value(fixed).unwrap_or_default();
                if overhead.as_ref().is_some_and(|o| !same_quantities(o, &fixed)) {
                    return forbid("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into());
                }
                spec.insert("overhead".into(), fixed);
            }
            None if overhead.is_some() => {
                return forbid(
                    "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".into(),
                );
            }
            None => {}
        }
        let Some(scheduling) = rc.scheduling else { return Ok(()) };
        let selector = spec.entry("nodeSelector").or_insert_with(|| Value::Object(Default::default()));
        if let Some(selector) = selector.as_object_mut() {
            for (key, value) in scheduling.node_selector.unwrap_or_default() {
                match selector.get(&key).and_then(Value::as_str) {
                    Some(pod_value) if pod_value != value => {
                        return forbid(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; pod.spec.nodeSelector[{key}] = {pod_value}"
                        ));
                    }
                    _ => {
                        selector.insert(key, Value::String(value));
                    }
                }
            }
        }
        if selector.as_object().is_some_and(|s| s.is_empty()) {
            spec.remove("nodeSelector");
        }
        let mut tolerations: Vec<Toleration> =
            spec.get("tolerations").and_then(|t| serde_json::from_value(t.clone()).ok()).unwrap_or_default();
        for t in scheduling.tolerations.unwrap_or_default() {
            if !tolerations.iter().any(|have| covers(have, &t)) {
                tolerations.push(t);
            }
        }
        if !tolerations.is_empty() {
            spec.insert("tolerations".into(), serde_json::to_value(tolerations).unwrap_or_default());
        }
        Ok(())
    }

    /// What may not be deleted at all: the system PriorityClasses (upstream's priorityclass storage).
    pub(super) fn admit_delete(r: &Resource, name: &str) -> Result<()> {
        if (r.info().group, r.info().plural) == (SCHEDULING_GROUP, PRIORITY_CLASSES)
            && system_class_value(name).is_some()
        {
            return Err(StatusError::forbidden(
                &r.info().group_resource(),
                name,
                "this is a system priority class and cannot be deleted",
            ));
        }
        Ok(())
    }

    /// Validating admission of an update of the main resource, after the kind's validation.
    pub(super) fn admit_update_with_others(&self, r: &Resource, new: &Value, old: &Value) -> Result<()> {
        match (r.info().group, r.info().plural) {
            ("", CLAIMS) => self.claim_resize(r, new, old),
            (SCHEDULING_GROUP, PRIORITY_CLASSES) => self.one_global_default(r, new),
            _ => Ok(()),
        }
    }

    /// `DefaultStorageClass`: a claim with no class (neither `storageClassName` nor the beta
    /// annotation; `""` is a class) gets the newest default class.
    fn default_storage_class(&self, obj: &mut Value) {
        let has_class = obj["spec"].get("storageClassName").is_some_and(|c| !c.is_null())
            || obj["metadata"]["annotations"].get(BETA_CLASS_ANNOTATION).is_some();
        if has_class {
            return;
        }
        let mut defaults: Vec<StorageClass> =
            self.storage_classes().into_iter().filter(|c| is_default_class(&c.metadata)).collect();
        defaults.sort_by(|a, b| {
            b.metadata
                .creation_timestamp
                .cmp(&a.metadata.creation_timestamp)
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        if let (Some(default), Some(spec)) = (defaults.first(), obj.get_mut("spec").and_then(Value::as_object_mut)) {
            spec.insert("storageClassName".into(), Value::String(default.metadata.name.clone().unwrap_or_default()));
        }
    }

    /// `PersistentVolumeClaimResize`: more storage only for a bound claim of a class that allows it.
    fn claim_resize(&self, r: &Resource, new: &Value, old: &Value) -> Result<()> {
        let (Ok(new), Ok(old)) = (
            serde_json::from_value::<PersistentVolumeClaim>(new.clone()),
            serde_json::from_value::<PersistentVolumeClaim>(old.clone()),
        ) else {
            return Ok(());
        };
        let size = |c: &PersistentVolumeClaim| {
            storage_bytes(c.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()))
        };
        if size(&new) <= size(&old) {
            return Ok(());
        }
        let name = new.metadata.name.clone().unwrap_or_default();
        let forbid = |msg: &str| Err(StatusError::forbidden(&r.info().group_resource(), &name, msg.to_string()));
        if old.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return forbid("Only bound persistent volume claims can be expanded");
        }
        let class =
            |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let allowed = !class(&new).is_empty()
            && class(&new) == class(&old)
            && self
                .storage_classes()
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(class(&new).as_str()))
                .is_some_and(|c| c.allow_volume_expansion == Some(true));
        if !allowed {
            return forbid(
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            );
        }
        Ok(())
    }
}

/// Whether two quantity maps say the same amounts (`1000m` is `1`).
fn same_quantities(a: &Value, b: &Value) -> bool {
    let parse = |v: &Value| -> Option<std::collections::BTreeMap<String, i128>> {
        v.as_object()?
            .iter()
            .map(|(k, q)| Some((k.clone(), super::kinds::pod_rules::parse_quantity(q.as_str()?)?)))
            .collect()
    };
    parse(a).is_some_and(|a| Some(a) == parse(b))
}

/// Whether toleration `have` tolerates everything `t` does (upstream's `MergeTolerations` keeps only
/// tolerations no other one covers).
fn covers(have: &Toleration, t: &Toleration) -> bool {
    let op = |t: &Toleration| t.operator.clone().unwrap_or_else(|| "Equal".into());
    let key_ok = have.key.as_deref().unwrap_or_default().is_empty() && op(have) == "Exists" || have.key == t.key;
    let effect_ok = have.effect.as_deref().unwrap_or_default().is_empty() || have.effect == t.effect;
    let value_ok = op(have) == "Exists" || (op(t) == "Equal" && have.value == t.value);
    let seconds_ok = have.toleration_seconds.is_none() || have.toleration_seconds == t.toleration_seconds;
    key_ok && effect_ok && value_ok && seconds_ok
}
