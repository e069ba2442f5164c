//! What the API server itself makes at start, as kube-apiserver's system-namespaces controller does.

use serde::Deserialize as _;
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

/// The system PriorityClasses (`system-node-critical`, `system-cluster-critical`), made again if
/// missing at every start, as kube-apiserver's scheduling storage post-start hook does.
pub async fn system_priority_classes(registry: &Registry) -> Result<(), StatusError> {
    let classes = registry
        .find("scheduling.k8s.io", "v1", "priorityclasses")
        .ok_or_else(|| StatusError::internal("priorityclasses are not served"))?;
    for (name, value, description) in super::kinds::scheduling::SYSTEM_CLASSES {
        let class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "description": description});
        match registry.create(&classes, None, class, &WriteOptions::default()).await {
            Ok(_) => tracing::info!("created PriorityClass {name}"),
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

/// The `kubernetes` Service in `default` at the first address of the service CIDR, and its
/// Endpoints and EndpointSlice pointing at this API server (kube-apiserver's
/// `kubernetesservice` controller and endpoint reconciler). Brought back to this shape at every
/// start. A loopback address cannot be an endpoint: the Service is made without one.
pub async fn kubernetes_service(
    registry: &Registry,
    api: std::net::SocketAddr,
    endpoints: bool,
) -> Result<(), StatusError> {
    let find = |group: &str, plural: &str| {
        registry.find(group, "v1", plural).ok_or_else(|| StatusError::internal(format!("{plural} are not served")))
    };
    let ip = registry.service_ranges().nth_ip(1).to_string();
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": api.port()}],
            "sessionAffinity": "None",
        },
    });
    upsert(registry, &find("", "services")?, service, |current, wanted| {
        current["spec"]["ports"] != wanted["spec"]["ports"]
    })
    .await?;
    if api.ip().is_loopback() || api.ip().is_unspecified() {
        tracing::info!("the API server listens on {api} only: the kubernetes Service has no endpoints");
        return Ok(());
    }
    if !endpoints {
        return Ok(());
    }
    let endpoints = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": api.ip().to_string()}],
            "ports": [{"name": "https", "port": api.port(), "protocol": "TCP"}]}],
    });
    upsert(registry, &find("", "endpoints")?, endpoints, |c, w| c["subsets"] != w["subsets"]).await?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if api.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [api.ip().to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": api.port(), "protocol": "TCP"}],
    });
    upsert(registry, &find("discovery.k8s.io", "endpointslices")?, slice, |c, w| {
        c["endpoints"] != w["endpoints"] || c["ports"] != w["ports"]
    })
    .await
}

/// The `kube-dns` Service in `kube-system` at the cluster DNS address, as k3s's (CoreDNS's
/// labels, so `kubectl cluster-info` lists it). It selects nothing: the cluster DNS answers on this
/// address itself on every node, and the service proxy leaves it alone.
pub async fn kube_dns_service(registry: &Registry, ip: std::net::Ipv4Addr) -> Result<(), StatusError> {
    let services =
        registry.find("", "v1", "services").ok_or_else(|| StatusError::internal("services are not served"))?;
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS",
                "service.kubernetes.io/service-proxy-name": "cairn-dns"}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip.to_string(),
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    });
    upsert(registry, &services, service, |c, w| {
        c["spec"]["ports"] != w["spec"]["ports"] || c["metadata"]["labels"] != w["metadata"]["labels"]
    })
    .await
}

/// Creates `wanted`, or replaces the stored object when `differs` says it is not as wanted.
async fn upsert(
    registry: &Registry,
    r: &super::Resource,
    wanted: serde_json::Value,
    differs: impl Fn(&serde_json::Value, &serde_json::Value) -> bool,
) -> Result<(), StatusError> {
    let name = wanted["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = wanted["metadata"]["namespace"].as_str().map(str::to_string);
    match registry.create(r, ns.as_deref(), wanted.clone(), &WriteOptions::default()).await {
        Ok(_) => {
            tracing::info!("created {} {name}", r.info().kind);
            return Ok(());
        }
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let current = registry.get_value(r, ns.as_deref(), &name)?;
    let defaulted = r.admit_create(wanted.clone())?.object;
    if !differs(&current, &defaulted) {
        return Ok(());
    }
    let mut body = current.clone();
    for (k, v) in wanted.as_object().into_iter().flatten().filter(|(k, _)| *k != "metadata") {
        body[k] = v.clone();
    }
    if let Some(spec) = body.get_mut("spec").and_then(serde_json::Value::as_object_mut) {
        // The stored cluster IP stays.
        spec.remove("clusterIPs");
        spec.insert("clusterIP".into(), current["spec"]["clusterIP"].clone());
    }
    registry.update(r, ns.as_deref(), &name, body, None, &WriteOptions::default()).await?;
    tracing::info!("updated {} {name}", r.info().kind);
    Ok(())
}

/// kube-apiserver's bootstrap ClusterRoles and ClusterRoleBindings (`bootstrappolicy`), the ones
/// cairn needs.
const RBAC_POLICY: &str = include_str!("bootstrap-rbac.yaml");
/// The annotation that lets a user keep a bootstrap role or binding as they changed it.
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

/// Creates the bootstrap roles and bindings, or brings them up to date as upstream's RBAC
/// reconciliation does: missing rules, aggregation selectors, subjects, labels and annotations are
/// added, what a user added stays, and one annotated `rbac.authorization.kubernetes.io/autoupdate:
/// "false"` is left alone. A binding whose roleRef changed is re-created.
pub async fn rbac_policy(registry: &Registry) -> Result<(), StatusError> {
    for doc in serde_yaml::Deserializer::from_str(RBAC_POLICY) {
        let wanted = serde_json::Value::deserialize(doc)
            .map_err(|e| StatusError::internal(format!("the built-in RBAC policy does not parse: {e}")))?;
        let plural = match wanted["kind"].as_str() {
            Some("ClusterRole") => "clusterroles",
            Some("ClusterRoleBinding") => "clusterrolebindings",
            other => return Err(StatusError::internal(format!("unexpected {other:?} in the built-in RBAC policy"))),
        };
        let r = registry
            .find(super::kinds::rbac::GROUP, "v1", plural)
            .ok_or_else(|| StatusError::internal(format!("{plural} are not served")))?;
        reconcile_rbac(registry, &r, wanted).await?;
    }
    Ok(())
}

async fn reconcile_rbac(
    registry: &Registry,
    r: &super::Resource,
    wanted: serde_json::Value,
) -> Result<(), StatusError> {
    let name = wanted["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let opts = WriteOptions::default();
    match registry.create(r, None, wanted.clone(), &opts).await {
        Ok(_) => return Ok(()),
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let current = registry.get_value(r, None, &name)?;
    if current["metadata"]["annotations"][AUTOUPDATE] == "false" {
        return Ok(());
    }
    if wanted.get("roleRef").is_some() && current["roleRef"] != wanted["roleRef"] {
        registry.delete(r, None, &name, &Default::default()).await?;
        registry.create(r, None, wanted, &opts).await?;
        tracing::info!("re-created {} {name}: its roleRef was not the built-in one", r.info().kind);
        return Ok(());
    }
    let mut body = current.clone();
    for map in ["labels", "annotations"] {
        for (k, v) in wanted["metadata"][map].as_object().into_iter().flatten() {
            if body["metadata"][map].get(k).is_none() {
                body["metadata"][map][k] = v.clone();
            }
        }
    }
    let union = |body: &mut serde_json::Value, path: &[&str]| {
        let mut want = &wanted;
        for p in path {
            want = &want[*p];
        }
        let Some(items) = want.as_array() else { return };
        let mut have = &mut *body;
        for p in path {
            have = &mut have[*p];
        }
        if !have.is_array() {
            *have = json!([]);
        }
        if let Some(list) = have.as_array_mut() {
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
    };
    if wanted.get("aggregationRule").is_some() {
        union(&mut body, &["aggregationRule", "clusterRoleSelectors"]);
    } else if wanted.get("rules").is_some() {
        union(&mut body, &["rules"]);
    }
    union(&mut body, &["subjects"]);
    if body != current {
        registry.update(r, None, &name, body, None, &opts).await?;
        tracing::info!("brought the built-in {} {name} up to date", r.info().kind);
    }
    Ok(())
}
