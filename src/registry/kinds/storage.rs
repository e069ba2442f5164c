//! Storage kinds: core/v1 PersistentVolumes and PersistentVolumeClaims, and storage.k8s.io/v1
//! StorageClasses, CSIDrivers, CSINodes and VolumeAttachments, with upstream's defaults, validation,
//! immutability rules and table columns. The storage-object-in-use finalizers are added on create
//! (upstream's `StorageObjectInUseProtection` admission).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

use super::pod_rules::parse_quantity;
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::subresource::Subresource;
use crate::registry::validation::{self, ErrorList, FieldError};

/// Finalizer keeping a claim while a pod uses it (the pvc-protection controller removes it).
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Finalizer keeping a volume while it is bound (the pv-protection controller removes it).
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// The class annotation marking the default StorageClass, and its beta spelling.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// The PV controller's annotations on claims and volumes.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

const ACCESS_MODES: &[&str] = &["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const PV_RECLAIM: &[&str] = &["Delete", "Recycle", "Retain"];
const CLASS_RECLAIM: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

pub struct PersistentVolumes;
pub struct PersistentVolumeClaims;
pub struct StorageClasses;
pub struct CsiDrivers;
pub struct CsiNodes;
pub struct VolumeAttachments;

/// Whether a StorageClass is marked default (either annotation).
pub fn is_default_class(meta: &ObjectMeta) -> bool {
    meta.annotations.as_ref().is_some_and(|a| {
        a.get(DEFAULT_CLASS).map(String::as_str) == Some("true")
            || a.get(BETA_DEFAULT_CLASS).map(String::as_str) == Some("true")
    })
}

fn add_finalizer(meta: &mut ObjectMeta, finalizer: &str) {
    let list = meta.finalizers.get_or_insert_with(Vec::new);
    if !list.iter().any(|f| f == finalizer) {
        list.push(finalizer.to_string());
    }
}

/// The full reference to a claim that a volume's `claimRef` holds once bound.
pub fn claim_reference(pvc: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: pvc.metadata.namespace.clone(),
        name: pvc.metadata.name.clone(),
        uid: pvc.metadata.uid.clone(),
        resource_version: pvc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// A status phase among `phases`.
fn validate_phase(phase: Option<&str>, phases: &[&str]) -> ErrorList {
    match phase {
        Some(p) if !phases.contains(&p) => vec![FieldError::not_supported("status.phase", p, phases)],
        _ => Vec::new(),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Access modes as kubectl abbreviates them (`RWO,ROX`), in upstream's order.
pub fn access_modes_cell(modes: Option<&Vec<String>>) -> String {
    let modes = modes.map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    for (mode, short) in
        [("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP")]
    {
        if modes.iter().any(|m| m == mode) {
            out.push(short);
        }
    }
    out.join(",")
}

fn validate_access_modes(modes: &[String], path: &str, required: &str, out: &mut ErrorList) {
    if modes.is_empty() {
        out.push(FieldError::required(path, required));
        return;
    }
    for m in modes {
        if !ACCESS_MODES.contains(&m.as_str()) {
            out.push(FieldError::not_supported(path, m, ACCESS_MODES));
        }
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        out.push(FieldError::forbidden(path, "may not use ReadWriteOncePod with other access modes"));
    }
}

fn validate_volume_mode(mode: Option<&String>, path: &str, out: &mut ErrorList) {
    if let Some(m) = mode
        && !VOLUME_MODES.contains(&m.as_str())
    {
        out.push(FieldError::not_supported(path, m, VOLUME_MODES));
    }
}

/// A storage quantity's bytes, for comparisons (`None` when absent or unparsable).
pub fn storage_bytes(list: Option<&BTreeMap<String, Quantity>>) -> Option<i128> {
    list?.get("storage").and_then(|q| parse_quantity(&q.0)).map(|milli| milli / 1000)
}

/// The volume sources a PersistentVolume spec sets, by their JSON names.
fn pv_sources(spec: &PersistentVolumeSpec) -> Vec<&'static str> {
    let v = serde_json::to_value(spec).unwrap_or_default();
    const SOURCES: &[&str] = &[
        "awsElasticBlockStore",
        "azureDisk",
        "azureFile",
        "cephfs",
        "cinder",
        "csi",
        "fc",
        "flexVolume",
        "flocker",
        "gcePersistentDisk",
        "glusterfs",
        "hostPath",
        "iscsi",
        "local",
        "nfs",
        "photonPersistentDisk",
        "portworxVolume",
        "quobyte",
        "rbd",
        "scaleIO",
        "storageos",
        "vsphereVolume",
    ];
    SOURCES.iter().copied().filter(|s| v.get(*s).is_some_and(|x| !x.is_null())).collect()
}

fn pv_source(spec: &PersistentVolumeSpec) -> Value {
    let mut v = serde_json::to_value(spec).unwrap_or_default();
    if let Value::Object(map) = &mut v {
        let sources = pv_sources(spec);
        map.retain(|k, _| sources.contains(&k.as_str()));
    }
    v
}

impl Kind for PersistentVolumes {
    type Obj = PersistentVolume;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "PersistentVolume",
        plural: "persistentvolumes",
        singular: "persistentvolume",
        namespaced: false,
        short_names: &["pv"],
        categories: &[],
        subresources: &[Subresource::Status],
        storage: "persistentvolumes",
        return_deleted_object: false,
    };

    fn prepare_create(&self, pv: &mut PersistentVolume) {
        let spec = pv.spec.get_or_insert_with(Default::default);
        spec.persistent_volume_reclaim_policy.get_or_insert_with(|| "Retain".into());
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Pending".into()),
            last_phase_transition_time: Some(now()),
            ..Default::default()
        });
        add_finalizer(&mut pv.metadata, PV_PROTECTION);
    }

    fn validate(&self, pv: &PersistentVolume) -> ErrorList {
        let mut out = Vec::new();
        let spec = pv.spec.clone().unwrap_or_default();
        validate_access_modes(spec.access_modes.as_deref().unwrap_or_default(), "spec.accessModes", "", &mut out);
        match spec.capacity.as_ref() {
            None => {
                out.push(FieldError::required("spec.capacity", ""));
                out.push(FieldError::not_supported("spec.capacity", "null", &["storage"]));
            }
            Some(c) if !c.contains_key("storage") || c.len() != 1 => {
                let keys: Vec<&String> = c.keys().collect();
                out.push(FieldError::not_supported("spec.capacity", format!("{keys:?}"), &["storage"]));
            }
            Some(c) => {
                if storage_bytes(Some(c)).is_none_or(|b| b <= 0) {
                    let q = &c["storage"].0;
                    out.push(FieldError::invalid("spec.capacity[storage]", q, "must be greater than zero"));
                }
            }
        }
        if let Some(p) = &spec.persistent_volume_reclaim_policy
            && !PV_RECLAIM.contains(&p.as_str())
        {
            out.push(FieldError::not_supported("spec.persistentVolumeReclaimPolicy", p, PV_RECLAIM));
        }
        validate_volume_mode(spec.volume_mode.as_ref(), "spec.volumeMode", &mut out);
        if let Some(class) = spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
            for e in validation::is_dns1123_subdomain(class) {
                out.push(FieldError::invalid("spec.storageClassName", class, e));
            }
        }
        let sources = pv_sources(&spec);
        match sources.as_slice() {
            [] => out.push(FieldError::required("spec", "must specify a volume type")),
            [_] => {}
            [_, rest @ ..] => {
                for s in rest {
                    out.push(FieldError::forbidden(format!("spec.{s}"), "may not specify more than 1 volume type"));
                }
            }
        }
        if let Some(hp) = &spec.host_path
            && hp.path.is_empty()
        {
            out.push(FieldError::required("spec.hostPath.path", ""));
        }
        if let Some(local) = &spec.local {
            if local.path.is_empty() {
                out.push(FieldError::required("spec.local.path", ""));
            }
            if spec.node_affinity.as_ref().and_then(|a| a.required.as_ref()).is_none() {
                out.push(FieldError::required("spec.nodeAffinity", "Local volume requires node affinity"));
            }
        }
        if let Some(csi) = &spec.csi {
            if csi.driver.is_empty() {
                out.push(FieldError::required("spec.csi.driver", ""));
            }
            if csi.volume_handle.is_empty() {
                out.push(FieldError::required("spec.csi.volumeHandle", ""));
            }
        }
        if let Some(required) = spec.node_affinity.as_ref().and_then(|a| a.required.as_ref()) {
            if required.node_selector_terms.is_empty() {
                out.push(FieldError::required(
                    "spec.nodeAffinity.required.nodeSelectorTerms",
                    "must have at least one node selector term",
                ));
            }
            for (i, term) in required.node_selector_terms.iter().enumerate() {
                let path = format!("spec.nodeAffinity.required.nodeSelectorTerms[{i}]");
                super::pod_rules::validate_node_selector_term(term, false, &path, &mut out);
            }
        }
        out
    }

    fn prepare_update(&self, new: &mut PersistentVolume, old: &PersistentVolume) {
        new.status = old.status.clone();
    }

    fn validate_update(&self, new: &PersistentVolume, old: &PersistentVolume) -> ErrorList {
        let mut out = self.validate(new);
        let (ns, os) = (new.spec.clone().unwrap_or_default(), old.spec.clone().unwrap_or_default());
        if pv_source(&ns) != pv_source(&os) {
            out.push(FieldError::forbidden(
                "spec.persistentvolumesource",
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        if ns.volume_mode != os.volume_mode {
            out.push(FieldError::invalid("volumeMode", ns.volume_mode.unwrap_or_default(), "field is immutable"));
        }
        if os.node_affinity.is_some() && ns.node_affinity != os.node_affinity {
            let value = serde_json::to_string(&ns.node_affinity).unwrap_or_default();
            out.push(FieldError::invalid(
                "nodeAffinity",
                value,
                "field is immutable, except for updating from beta label to GA",
            ));
        }
        out
    }

    fn prepare_status_update(&self, new: &mut PersistentVolume, old: &PersistentVolume) {
        new.spec = old.spec.clone();
        let phase = |pv: &PersistentVolume| pv.status.as_ref().and_then(|s| s.phase.clone());
        if phase(new) != phase(old)
            && let Some(status) = new.status.as_mut()
        {
            status.last_phase_transition_time = Some(now());
        }
    }

    fn validate_status_update(&self, new: &PersistentVolume, _old: &PersistentVolume) -> ErrorList {
        validate_phase(
            new.status.as_ref().and_then(|s| s.phase.as_deref()),
            &["Available", "Bound", "Failed", "Pending", "Released"],
        )
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Capacity", "string", "capacity is the description of the persistent volume's resources and capacity. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#capacity"),
            Column::new("Access Modes", "string", "accessModes contains all ways the volume can be mounted. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes"),
            Column::new("Reclaim Policy", "string", "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim. Valid options are Retain (default for manually created PersistentVolumes), Delete (default for dynamically provisioned PersistentVolumes), and Recycle (deprecated). Recycle must be supported by the volume plugin underlying this PersistentVolume. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#reclaiming"),
            Column::new("Status", "string", "phase indicates if a volume is available, bound to a claim, or released by a claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#phase"),
            Column::new("Claim", "string", "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim. Expected to be non-nil when bound. claim.VolumeName is the authoritative bind between PV and PVC. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#binding"),
            Column::new("StorageClass", "string", "storageClassName is the name of StorageClass to which this persistent volume belongs. Empty value means that this volume does not belong to any StorageClass."),
            Column::new("VolumeAttributesClass", "string", "Name of VolumeAttributesClass to which this persistent volume belongs. Empty value is not allowed. When this field is not set, it indicates that this volume does not belong to any VolumeAttributesClass. This field is mutable and can be changed by the CSI driver after a volume has been updated successfully to a new class. For an unbound PersistentVolume, the volumeAttributesClassName will be matched with unbound PersistentVolumeClaims during the binding process."),
            Column::new("Reason", "string", "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI."),
            AGE_COLUMN,
            Column::new("VolumeMode", "string", "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state. Value of Filesystem is implied when not included in spec.").wide(),
        ]
    }

    fn cells(&self, pv: &PersistentVolume) -> Vec<Value> {
        let spec = pv.spec.clone().unwrap_or_default();
        let status = pv.status.clone().unwrap_or_default();
        let capacity = spec.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default();
        let claim = spec
            .claim_ref
            .as_ref()
            .map(|c| format!("{}/{}", c.namespace.clone().unwrap_or_default(), c.name.clone().unwrap_or_default()))
            .unwrap_or_default();
        let phase = if pv.metadata.deletion_timestamp.is_some() {
            "Terminating".to_string()
        } else {
            status.phase.unwrap_or_default()
        };
        vec![
            name_cell(&pv.metadata),
            json!(capacity),
            json!(access_modes_cell(spec.access_modes.as_ref())),
            json!(spec.persistent_volume_reclaim_policy.unwrap_or_default()),
            json!(phase),
            json!(claim),
            json!(spec.storage_class_name.unwrap_or_default()),
            json!(spec.volume_attributes_class_name.unwrap_or_else(|| "<unset>".into())),
            json!(status.reason.unwrap_or_default()),
            age_cell(&pv.metadata),
            json!(spec.volume_mode.unwrap_or_else(|| "<unset>".into())),
        ]
    }
}

impl Kind for PersistentVolumeClaims {
    type Obj = PersistentVolumeClaim;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        namespaced: true,
        short_names: &["pvc"],
        categories: &[],
        subresources: &[Subresource::Status],
        storage: "persistentvolumeclaims",
        return_deleted_object: false,
    };

    fn prepare_create(&self, pvc: &mut PersistentVolumeClaim) {
        let spec = pvc.spec.get_or_insert_with(Default::default);
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
        pvc.status = Some(PersistentVolumeClaimStatus { phase: Some("Pending".into()), ..Default::default() });
        add_finalizer(&mut pvc.metadata, PVC_PROTECTION);
    }

    fn validate(&self, pvc: &PersistentVolumeClaim) -> ErrorList {
        let mut out = Vec::new();
        let spec = pvc.spec.clone().unwrap_or_default();
        validate_access_modes(
            spec.access_modes.as_deref().unwrap_or_default(),
            "spec.accessModes",
            "at least 1 access mode is required",
            &mut out,
        );
        let requests = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
        match requests.and_then(|r| r.get("storage")) {
            None => out.push(FieldError::required("spec.resources[storage]", "")),
            Some(q) => {
                if parse_quantity(&q.0).is_none_or(|b| b <= 0) {
                    out.push(FieldError::invalid(
                        "spec.resources.requests[storage]",
                        &q.0,
                        "must be greater than zero",
                    ));
                }
            }
        }
        if let Some(class) = spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
            for e in validation::is_dns1123_subdomain(class) {
                out.push(FieldError::invalid("spec.storageClassName", class, e));
            }
        }
        validate_volume_mode(spec.volume_mode.as_ref(), "spec.volumeMode", &mut out);
        super::pod_rules::validate_label_selector(spec.selector.as_ref(), "spec.selector", &mut out);
        out
    }

    fn prepare_update(&self, new: &mut PersistentVolumeClaim, old: &PersistentVolumeClaim) {
        new.status = old.status.clone();
    }

    /// `ValidatePersistentVolumeClaimUpdate`: the spec is fixed once made, but for a bound claim's
    /// storage request (expansion; never below its capacity) and `volumeName` set once by binding.
    fn validate_update(&self, new: &PersistentVolumeClaim, old: &PersistentVolumeClaim) -> ErrorList {
        let mut out = self.validate(new);
        let (ns, os) = (new.spec.clone().unwrap_or_default(), old.spec.clone().unwrap_or_default());
        let mut comparable = ns.clone();
        if os.volume_name.as_deref().unwrap_or("").is_empty() {
            comparable.volume_name = os.volume_name.clone();
        }
        // A claim without a class may get one (the retroactive default class).
        if os.storage_class_name.is_none() {
            comparable.storage_class_name = None;
        }
        let bound = old.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if bound {
            comparable.resources = os.resources.clone();
            comparable.volume_attributes_class_name = os.volume_attributes_class_name.clone();
        }
        if comparable != os {
            out.push(FieldError::forbidden(
                "spec",
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ));
        } else if bound {
            // Shrinking a request (recovering from a failed expansion) may not go below the capacity.
            let new_size = storage_bytes(ns.resources.as_ref().and_then(|r| r.requests.as_ref()));
            let old_size = storage_bytes(os.resources.as_ref().and_then(|r| r.requests.as_ref()));
            let capacity = storage_bytes(old.status.as_ref().and_then(|s| s.capacity.as_ref()));
            if let (Some(n), Some(o), Some(c)) = (new_size, old_size, capacity)
                && n < o
                && n < c
            {
                out.push(FieldError::forbidden(
                    "spec.resources.requests.storage",
                    "field can not be less than status.capacity",
                ));
            }
        }
        out
    }

    fn prepare_status_update(&self, new: &mut PersistentVolumeClaim, old: &PersistentVolumeClaim) {
        new.spec = old.spec.clone();
    }

    fn validate_status_update(&self, new: &PersistentVolumeClaim, _old: &PersistentVolumeClaim) -> ErrorList {
        validate_phase(new.status.as_ref().and_then(|s| s.phase.as_deref()), &["Bound", "Lost", "Pending"])
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Status", "string", "phase represents the current phase of PersistentVolumeClaim."),
            Column::new("Volume", "string", "volumeName is the binding reference to the PersistentVolume backing this claim."),
            Column::new("Capacity", "string", "capacity represents the actual resources of the underlying volume."),
            Column::new("Access Modes", "string", "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1"),
            Column::new("StorageClass", "string", "storageClassName is the name of the StorageClass required by the claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#class-1"),
            Column::new("VolumeAttributesClass", "string", "volumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim."),
            AGE_COLUMN,
            Column::new("VolumeMode", "string", "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec.").wide(),
        ]
    }

    fn cells(&self, pvc: &PersistentVolumeClaim) -> Vec<Value> {
        let spec = pvc.spec.clone().unwrap_or_default();
        let status = pvc.status.clone().unwrap_or_default();
        let phase = if pvc.metadata.deletion_timestamp.is_some() {
            "Terminating".to_string()
        } else {
            status.phase.clone().unwrap_or_default()
        };
        let volume = spec.volume_name.clone().unwrap_or_default();
        // Capacity and modes are shown once bound, as upstream.
        let (capacity, modes) = if volume.is_empty() {
            (String::new(), String::new())
        } else {
            (
                status.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default(),
                access_modes_cell(status.access_modes.as_ref()),
            )
        };
        vec![
            name_cell(&pvc.metadata),
            json!(phase),
            json!(volume),
            json!(capacity),
            json!(modes),
            json!(spec.storage_class_name.unwrap_or_default()),
            json!(spec.volume_attributes_class_name.unwrap_or_else(|| "<unset>".into())),
            age_cell(&pvc.metadata),
            json!(spec.volume_mode.unwrap_or_else(|| "<unset>".into())),
        ]
    }
}

impl Kind for StorageClasses {
    type Obj = StorageClass;
    const INFO: ResourceInfo = ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        kind: "StorageClass",
        plural: "storageclasses",
        singular: "storageclass",
        namespaced: false,
        short_names: &["sc"],
        categories: &[],
        subresources: &[],
        storage: "storageclasses.storage.k8s.io",
        return_deleted_object: false,
    };

    fn prepare_create(&self, sc: &mut StorageClass) {
        sc.reclaim_policy.get_or_insert_with(|| "Delete".into());
        sc.volume_binding_mode.get_or_insert_with(|| "Immediate".into());
    }

    fn validate(&self, sc: &StorageClass) -> ErrorList {
        let mut out = Vec::new();
        if sc.provisioner.is_empty() {
            out.push(FieldError::required("provisioner", ""));
        } else {
            for e in validation::is_qualified_name(&sc.provisioner.to_lowercase()) {
                out.push(FieldError::invalid("provisioner", &sc.provisioner, e));
            }
        }
        let params = sc.parameters.clone().unwrap_or_default();
        let size: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
        if params.len() > 512 {
            out.push(FieldError::too_long("parameters", 512));
        } else if size > 256 * 1024 {
            out.push(FieldError::too_long("parameters", 256 * 1024));
        }
        if let Some(p) = &sc.reclaim_policy
            && !CLASS_RECLAIM.contains(&p.as_str())
        {
            out.push(FieldError::not_supported("reclaimPolicy", p, CLASS_RECLAIM));
        }
        match sc.volume_binding_mode.as_deref() {
            None => out.push(FieldError::required("volumeBindingMode", "")),
            Some(m) if !BINDING_MODES.contains(&m) => {
                out.push(FieldError::not_supported("volumeBindingMode", m, BINDING_MODES))
            }
            Some(_) => {}
        }
        out
    }

    fn validate_update(&self, new: &StorageClass, old: &StorageClass) -> ErrorList {
        let mut out = self.validate(new);
        let immutable = |field: &str, new: Value, old: Value, out: &mut ErrorList| {
            if new != old {
                out.push(FieldError::invalid(field, new, "field is immutable"));
            }
        };
        immutable("parameters", json!(new.parameters), json!(old.parameters), &mut out);
        immutable("provisioner", json!(new.provisioner), json!(old.provisioner), &mut out);
        immutable("reclaimPolicy", json!(new.reclaim_policy), json!(old.reclaim_policy), &mut out);
        immutable("volumeBindingMode", json!(new.volume_binding_mode), json!(old.volume_binding_mode), &mut out);
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Provisioner", "string", "provisioner indicates the type of the provisioner."),
            Column::new(
                "ReclaimPolicy",
                "string",
                "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class. Defaults to Delete.",
            ),
            Column::new(
                "VolumeBindingMode",
                "string",
                "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.",
            ),
            Column::new(
                "AllowVolumeExpansion",
                "string",
                "allowVolumeExpansion shows whether the storage class allow volume expand.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, sc: &StorageClass) -> Vec<Value> {
        let mut name = sc.metadata.name.clone().unwrap_or_default();
        if is_default_class(&sc.metadata) {
            name.push_str(" (default)");
        }
        vec![
            json!(name),
            json!(sc.provisioner),
            json!(sc.reclaim_policy.clone().unwrap_or_else(|| "Delete".into())),
            json!(sc.volume_binding_mode.clone().unwrap_or_else(|| "Immediate".into())),
            json!(sc.allow_volume_expansion.unwrap_or(false).to_string()),
            age_cell(&sc.metadata),
        ]
    }
}

impl Kind for CsiDrivers {
    type Obj = CSIDriver;
    const INFO: ResourceInfo = ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        kind: "CSIDriver",
        plural: "csidrivers",
        singular: "csidriver",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "csidrivers.storage.k8s.io",
        return_deleted_object: false,
    };

    fn prepare_create(&self, d: &mut CSIDriver) {
        let s = &mut d.spec;
        s.attach_required.get_or_insert(true);
        s.pod_info_on_mount.get_or_insert(false);
        s.requires_republish.get_or_insert(false);
        s.storage_capacity.get_or_insert(false);
        s.se_linux_mount.get_or_insert(false);
        s.fs_group_policy.get_or_insert_with(|| "ReadWriteOnceWithFSType".into());
        s.volume_lifecycle_modes.get_or_insert_with(|| vec!["Persistent".into()]);
    }

    fn validate(&self, d: &CSIDriver) -> ErrorList {
        const POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];
        const MODES: &[&str] = &["Ephemeral", "Persistent"];
        let mut out = Vec::new();
        let name = d.metadata.name.clone().unwrap_or_default();
        if name.len() > 63 {
            out.push(FieldError::too_long("metadata.name", 63));
        }
        if let Some(p) = &d.spec.fs_group_policy
            && !POLICIES.contains(&p.as_str())
        {
            out.push(FieldError::not_supported("spec.fsGroupPolicy", p, POLICIES));
        }
        for m in d.spec.volume_lifecycle_modes.iter().flatten() {
            if !MODES.contains(&m.as_str()) {
                out.push(FieldError::not_supported("spec.volumeLifecycleModes", m, MODES));
            }
        }
        out
    }

    fn validate_update(&self, new: &CSIDriver, old: &CSIDriver) -> ErrorList {
        let mut out = self.validate(new);
        if new.spec.attach_required != old.spec.attach_required {
            // (sic: upstream's path)
            out.push(FieldError::invalid(
                "spec.attachedRequired",
                new.spec.attach_required.unwrap_or(true),
                "field is immutable",
            ));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "AttachRequired",
                "boolean",
                "attachRequired indicates this CSI volume driver requires an attach operation (because it implements the CSI ControllerPublishVolume() method), and that the Kubernetes attach detach controller should call the attach volume interface which checks the volumeattachment status and waits until the volume is attached before proceeding to mounting.",
            ),
            Column::new(
                "PodInfoOnMount",
                "boolean",
                "podInfoOnMount indicates this CSI volume driver requires additional pod information (like podName, podUID, etc.) during mount operations, if set to true.",
            ),
            Column::new(
                "StorageCapacity",
                "boolean",
                "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report by creating CSIStorageCapacity objects with capacity information, if set to true.",
            ),
            Column::new(
                "TokenRequests",
                "string",
                "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication.",
            ),
            Column::new(
                "RequiresRepublish",
                "boolean",
                "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume.",
            ),
            Column::new(
                "Modes",
                "string",
                "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, d: &CSIDriver) -> Vec<Value> {
        let s = &d.spec;
        let tokens: Vec<String> = s.token_requests.iter().flatten().map(|t| t.audience.clone()).collect();
        let modes = s.volume_lifecycle_modes.clone().unwrap_or_default();
        vec![
            name_cell(&d.metadata),
            json!(s.attach_required.unwrap_or(true)),
            json!(s.pod_info_on_mount.unwrap_or(false)),
            json!(s.storage_capacity.unwrap_or(false)),
            json!(if tokens.is_empty() { "<unset>".to_string() } else { tokens.join(",") }),
            json!(s.requires_republish.unwrap_or(false)),
            json!(if modes.is_empty() { "<none>".to_string() } else { modes.join(",") }),
            age_cell(&d.metadata),
        ]
    }
}

impl Kind for CsiNodes {
    type Obj = CSINode;
    const INFO: ResourceInfo = ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        kind: "CSINode",
        plural: "csinodes",
        singular: "csinode",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "csinodes.storage.k8s.io",
        return_deleted_object: false,
    };

    fn validate(&self, n: &CSINode) -> ErrorList {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, d) in n.spec.drivers.iter().enumerate() {
            let path = format!("spec.drivers[{i}]");
            if d.name.is_empty() {
                out.push(FieldError::required(format!("{path}.name"), ""));
            } else if !seen.insert(d.name.as_str()) {
                out.push(FieldError::duplicate(format!("{path}.name"), &d.name));
            }
            if d.node_id.is_empty() {
                out.push(FieldError::required(format!("{path}.nodeID"), ""));
            }
            if d.allocatable.as_ref().and_then(|a| a.count).is_some_and(|c| c < 0) {
                out.push(FieldError::invalid(
                    format!("{path}.allocatable.count"),
                    d.allocatable.as_ref().and_then(|a| a.count).unwrap_or(0),
                    "must be greater than or equal to 0",
                ));
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Drivers",
                "integer",
                "drivers is a list of information of all CSI Drivers existing on a node. If all drivers in the list are uninstalled, this can become empty.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, n: &CSINode) -> Vec<Value> {
        vec![name_cell(&n.metadata), json!(n.spec.drivers.len()), age_cell(&n.metadata)]
    }
}

impl Kind for VolumeAttachments {
    type Obj = VolumeAttachment;
    const INFO: ResourceInfo = ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        kind: "VolumeAttachment",
        plural: "volumeattachments",
        singular: "volumeattachment",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[Subresource::Status],
        storage: "volumeattachments.storage.k8s.io",
        return_deleted_object: false,
    };

    fn prepare_create(&self, va: &mut VolumeAttachment) {
        va.status = None;
    }

    fn validate(&self, va: &VolumeAttachment) -> ErrorList {
        let mut out = Vec::new();
        if va.spec.attacher.is_empty() {
            out.push(FieldError::required("spec.attacher", ""));
        }
        if va.spec.node_name.is_empty() {
            out.push(FieldError::required("spec.nodeName", ""));
        }
        let src = &va.spec.source;
        match (src.persistent_volume_name.is_some(), src.inline_volume_spec.is_some()) {
            (false, false) => out.push(FieldError::required(
                "spec.source",
                "must specify exactly one of persistentVolumeName and inlineVolumeSpec",
            )),
            (true, true) => out.push(FieldError::forbidden(
                "spec.source",
                "must specify exactly one of persistentVolumeName and inlineVolumeSpec",
            )),
            _ => {}
        }
        out
    }

    fn prepare_update(&self, new: &mut VolumeAttachment, old: &VolumeAttachment) {
        new.status = old.status.clone();
    }

    fn validate_update(&self, new: &VolumeAttachment, old: &VolumeAttachment) -> ErrorList {
        let mut out = self.validate(new);
        if new.spec != old.spec {
            out.push(FieldError::invalid("spec", "...", "field is immutable"));
        }
        out
    }

    fn prepare_status_update(&self, new: &mut VolumeAttachment, old: &VolumeAttachment) {
        new.spec = old.spec.clone();
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Attacher",
                "string",
                "attacher indicates the name of the volume driver that MUST handle this request. This is the name returned by GetPluginName().",
            ),
            Column::new("PV", "string", "persistentVolumeName represents the name of the persistent volume to attach."),
            Column::new("Node", "string", "nodeName represents the node that the volume should be attached to."),
            Column::new(
                "Attached",
                "boolean",
                "attached indicates the volume is successfully attached. This field must only be set by the entity completing the attach operation, i.e. the external-attacher.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, va: &VolumeAttachment) -> Vec<Value> {
        vec![
            name_cell(&va.metadata),
            json!(va.spec.attacher),
            json!(va.spec.source.persistent_volume_name.clone().unwrap_or_default()),
            json!(va.spec.node_name),
            json!(va.status.as_ref().is_some_and(|s| s.attached)),
            age_cell(&va.metadata),
        ]
    }
}
