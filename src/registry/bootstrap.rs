//! What the API server itself makes at start, as kube-apiserver's system-namespaces controller does.

use serde_json::json;

use super::{Registry, StatusError, WriteOptions};

/// Namespaces every cluster starts with.
pub const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Creates the system namespaces if they are missing.
pub async fn system_namespaces(registry: &Registry) -> Result<(), StatusError> {
    let namespaces =
        registry.find("", "v1", "namespaces").ok_or_else(|| StatusError::internal("namespaces are not served"))?;
    for name in SYSTEM_NAMESPACES {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match registry.create(&namespaces, None, ns, &WriteOptions::default()).await {
            Ok(_) => tracing::info!("created namespace {name}"),
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The built-in CSI driver's CSIDriver object (no attach; `fsGroup` applied to its files), and the
/// default `local-path` StorageClass (k3s's name, so its users' manifests work), made once: a user who
/// deletes the class keeps it deleted (`<server-dir>/local-path-class` records that it was made).
pub async fn local_storage(registry: &Registry, server_dir: &std::path::Path) -> Result<(), StatusError> {
    let find = |plural: &str| {
        registry
            .find("storage.k8s.io", "v1", plural)
            .ok_or_else(|| StatusError::internal(format!("{plural} are not served")))
    };
    let driver = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": crate::csi::HOSTPATH_DRIVER},
        "spec": {
            "attachRequired": false,
            "podInfoOnMount": false,
            "fsGroupPolicy": "File",
            "volumeLifecycleModes": ["Persistent"],
        },
    });
    match registry.create(&find("csidrivers")?, None, driver, &WriteOptions::default()).await {
        Ok(_) => tracing::info!("created CSIDriver {}", crate::csi::HOSTPATH_DRIVER),
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let marker = server_dir.join("local-path-class");
    if marker.exists() {
        return Ok(());
    }
    let class = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": "local-path",
            "annotations": {super::kinds::storage::DEFAULT_CLASS: "true"},
        },
        "provisioner": crate::csi::HOSTPATH_DRIVER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true,
    });
    match registry.create(&find("storageclasses")?, None, class, &WriteOptions::default()).await {
        Ok(_) => tracing::info!("created the default StorageClass local-path"),
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    if let Err(e) = std::fs::write(&marker, b"") {
        tracing::warn!("recording that the local-path StorageClass was made ({}): {e}", marker.display());
    }
    Ok(())
}
