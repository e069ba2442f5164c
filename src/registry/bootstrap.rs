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
