//! The admission plugins that look at other objects than the one written (those that need only the
//! object itself are in its kind's strategy): `DefaultStorageClass` (a claim without a class gets the
//! default one) and `PersistentVolumeClaimResize` (a claim may grow only when its class allows).

use serde_json::Value;

use super::error::{Result, StatusError};
use super::kinds::storage::{is_default_class, storage_bytes};
use super::{Registry, Resource};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

const CLAIMS: &str = "persistentvolumeclaims";
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

impl Registry {
    fn storage_classes(&self) -> Vec<StorageClass> {
        let Some(r) = self.find("storage.k8s.io", "v1", "storageclasses") else { return Vec::new() };
        self.store()
            .list(&Self::prefix(&r, None), None)
            .items
            .iter()
            .filter_map(|(_, obj)| serde_json::from_slice(&obj.data).ok())
            .collect()
    }

    /// Mutating admission of a create, before the kind's defaults and validation.
    pub(super) fn admit_create_with_others(&self, r: &Resource, obj: &mut Value) {
        if r.info().plural == CLAIMS && r.info().group.is_empty() {
            self.default_storage_class(obj);
        }
    }

    /// Validating admission of an update of the main resource, after the kind's validation.
    pub(super) fn admit_update_with_others(&self, r: &Resource, new: &Value, old: &Value) -> Result<()> {
        if r.info().plural == CLAIMS && r.info().group.is_empty() {
            return self.claim_resize(r, new, old);
        }
        Ok(())
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
