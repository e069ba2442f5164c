//! CSI on the node, as kubelet and the CSI sidecars do it: cairn's built-in hostpath driver
//! (`hostpath.rs`, also `cairn csi-hostpath` as a separate process), kubelet's plugin registration
//! (`registration.rs`: drivers announce themselves with a socket in `plugins_registry/`, the node
//! records them in its CSINode), the client every CSI call goes through (`client.rs`), the
//! provisioner that creates and deletes volumes for claims (`provisioner.rs`, external-provisioner in
//! its per-node deployment) and the attacher that attaches them to nodes (`attacher.rs`,
//! external-attacher). The built-in driver takes exactly the path an external one does.

pub mod attacher;
pub mod client;
pub mod hostpath;
pub mod provisioner;
pub mod registration;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

/// CSI v1, as generated from `proto/csi.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// kubelet's plugin registration API, as generated from `proto/pluginregistration.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod registration_proto {
    tonic::include_proto!("pluginregistration");
}

/// The built-in driver's name: the `provisioner` of the `local-path` StorageClass and the `driver` of
/// the PersistentVolumes it makes.
pub const HOSTPATH_DRIVER: &str = "hostpath.csi.cairn.io";

/// The node topology key of the built-in driver's volumes: each lives on one node.
pub const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// The VolumeAttachment of a CSI volume on a node (upstream's `getAttachmentName`):
/// `csi-<sha256 of handle, driver and node>`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    format!("csi-{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// A CSI volume's unique name in a Node's `volumesInUse` and `volumesAttached`.
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// Whether a driver's volumes are attached before they are mounted: as its CSIDriver says, and yes
/// when it has none (upstream's CSI plugin `CanAttach`).
pub fn attach_required(driver: Option<&k8s_openapi::api::storage::v1::CSIDriver>) -> bool {
    driver.is_none_or(|d| d.spec.attach_required != Some(false))
}

/// kubelet's directories for plugins, under its root directory (`--kubelet-root-dir`, kubelet's
/// `--root-dir`: `/var/lib/kubelet` as root, so stock driver DaemonSets work unchanged).
#[derive(Debug, Clone)]
pub struct PluginDirs {
    pub root: PathBuf,
}

impl PluginDirs {
    /// Where plugins put their registration sockets (kubelet's `plugins_registry/`).
    pub fn registry(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }
    /// A driver's own directory, where its CSI socket conventionally lives.
    pub fn plugin(&self, driver: &str) -> PathBuf {
        self.root.join("plugins").join(driver)
    }
    /// A volume's staging path (kubelet's `plugins/kubernetes.io/csi/<driver>/<sha256 of the handle>/globalmount`).
    pub fn staging(&self, driver: &str, handle: &str) -> PathBuf {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(handle.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.root.join("plugins/kubernetes.io/csi").join(driver).join(hex).join("globalmount")
    }
}

/// The node's storage settings (`--kubelet-root-dir`, `--default-local-storage-path`) and the agent's
/// data directory.
#[derive(Debug, Clone)]
pub struct NodeStorage {
    pub kubelet_root_dir: PathBuf,
    pub local_storage_path: PathBuf,
    /// `<data-dir>/agent`: the provisioner's journal lives under it.
    pub agent_dir: PathBuf,
}

impl NodeStorage {
    pub fn plugin_dirs(&self) -> PluginDirs {
        PluginDirs { root: self.kubelet_root_dir.clone() }
    }
}

/// How long the node waits for its built-in driver to register before it starts pods.
const BUILT_IN_REGISTRATION: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts the node's CSI side: the built-in hostpath driver (its CSI socket and its registration
/// socket), the plugin watcher that registers it and any other driver (as the node, `client`), the
/// provisioner and the attacher (as the node's controllers, `controller`). Returns once the
/// built-in driver is registered (or after a while, with a warning).
pub async fn start_node(
    client: &kube::Client,
    controller: &kube::Client,
    storage: &NodeStorage,
    node_name: &str,
    drivers: client::Drivers,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    use futures::StreamExt as _;
    let dirs = storage.plugin_dirs();
    let mut changes = std::pin::pin!(drivers.changes());
    let driver = hostpath::HostPath {
        name: HOSTPATH_DRIVER.into(),
        node_id: node_name.into(),
        root: storage.local_storage_path.clone(),
        attach: false,
        max_volumes: 0,
    };
    if let Err(e) = hostpath::run(driver, &dirs, shutdown.clone()) {
        tracing::error!("built-in CSI driver {HOSTPATH_DRIVER}: {e:#}; the local-path class cannot provision");
    }
    // The watcher starts after the built-in driver's sockets, so that its first scan sees them.
    let watcher = registration::Watcher {
        dir: dirs.registry(),
        drivers: drivers.clone(),
        client: client.clone(),
        node_name: node_name.into(),
    };
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = watcher.run(stop).await {
            tracing::error!("CSI plugin watcher: {e:#}; no CSI driver can register on this node");
        }
    });
    provisioner::spawn(controller, drivers.clone(), node_name, storage.agent_dir.join("provisioning"), shutdown);
    attacher::spawn(controller, drivers.clone(), node_name, shutdown);
    let registered = async {
        while drivers.get(HOSTPATH_DRIVER).is_none() {
            if changes.next().await.is_none() {
                return;
            }
        }
    };
    if tokio::time::timeout(BUILT_IN_REGISTRATION, registered).await.is_err() {
        tracing::warn!("built-in CSI driver {HOSTPATH_DRIVER} did not register within {BUILT_IN_REGISTRATION:?}");
    }
}

/// `unix:///path` or a plain path, as CSI endpoints are written.
pub fn endpoint_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    crate::runtime::cri::socket_path(endpoint)
}

/// Binds a Unix socket at `path`, replacing a stale one (a socket file left by an earlier process).
pub fn bind_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    tokio::net::UnixListener::bind(path)
}
