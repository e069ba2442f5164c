//! cairn's built-in CSI driver: each volume is a directory under the node's storage directory
//! (`--default-local-storage-path`, k3s's local-path-provisioner layout `pvc-<uid>_<namespace>_<claim>`),
//! bind-mounted to its staging path and from there to each pod's target path. It serves the CSI
//! Identity, Controller and Node services on a Unix socket like any driver; the node registers it
//! through `plugins_registry/` like any driver.
//!
//! Capacity is recorded, not enforced (as local-path-provisioner): a directory has no size.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use super::HOSTNAME_KEY;
use super::proto::{
    self, controller_service_capability as ccap, node_service_capability as ncap, plugin_capability as pcap,
};
use crate::volumes::mount;

/// The parameters external-provisioner adds with `--extra-create-metadata` (cairn's provisioner always
/// does): the claim a volume is made for.
pub const PVC_NAME_PARAM: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_PARAM: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_PARAM: &str = "csi.storage.k8s.io/pv/name";

/// One node's hostpath driver.
#[derive(Debug, Clone)]
pub struct HostPath {
    /// The driver name it answers with (the built-in one's is [`super::HOSTPATH_DRIVER`]).
    pub name: String,
    /// This node's name: the driver's node ID and the topology of every volume it makes.
    pub node_id: String,
    /// Where volume directories are made.
    pub root: PathBuf,
    /// Offers ControllerPublish/Unpublish (a driver whose volumes are attached to a node first, as a
    /// disk is), and then stages only what was published to this node.
    pub attach: bool,
    /// The most volumes a node takes (`NodeGetInfo`'s `max_volumes_per_node`; 0: no limit).
    pub max_volumes: i64,
}

/// The `publish_context` key ControllerPublishVolume answers with: the node the volume went to.
pub const ATTACHED_TO: &str = "attachedTo";

type Reply<T> = Result<Response<T>, Status>;

/// Serves `driver` on `<plugins>/<name>/csi.sock` and announces it in `plugins_registry/` (what a
/// driver's DaemonSet does with node-driver-registrar), until `shutdown`.
pub fn run(
    driver: HostPath,
    dirs: &super::PluginDirs,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let socket = dirs.plugin(&driver.name).join("csi.sock");
    let registration = dirs.registry().join(format!("{}-reg.sock", driver.name));
    serve_with_registration(driver, socket, Some(registration), shutdown)
}

/// Serves `driver` on `socket`, and its registration on `registration` when given.
pub fn serve_with_registration(
    driver: HostPath,
    socket: PathBuf,
    registration: Option<PathBuf>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&driver.root)
        .map_err(|e| anyhow::anyhow!("creating the storage directory {}: {e}", driver.root.display()))?;
    let listener =
        super::bind_socket(&socket).map_err(|e| anyhow::anyhow!("listening on {}: {e}", socket.display()))?;
    let info = super::registration::csi_info(&driver.name, &socket);
    let name = driver.name.clone();
    let stop = shutdown.clone();
    let served = socket.clone();
    tokio::spawn(async move {
        if let Err(e) = driver.serve(listener, stop.cancelled()).await {
            tracing::error!("CSI driver {name}: {e:#}");
        }
        let _ = std::fs::remove_file(served);
    });
    if let Some(path) = registration {
        tokio::spawn(async move {
            if let Err(e) = super::registration::serve_registrar(info, path.clone(), shutdown).await {
                tracing::error!("CSI registration socket {}: {e:#}", path.display());
            }
        });
    }
    Ok(())
}

/// What a volume directory may be called: one path segment made by [`HostPath::create_volume`].
fn volume_dir(root: &Path, id: &str) -> Result<PathBuf, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("volume ID missing in request"));
    }
    if id.contains('/') || id.starts_with('.') {
        return Err(Status::invalid_argument(format!("volume ID {id:?} is not one of this driver's")));
    }
    Ok(root.join(id))
}

fn io_status(what: String, e: std::io::Error) -> Status {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Status::resource_exhausted(format!("{what}: {e}")),
        _ if e.kind() == std::io::ErrorKind::NotFound => Status::not_found(format!("{what}: {e}")),
        _ => Status::internal(format!("{what}: {e}")),
    }
}

fn topology(node: &str) -> proto::Topology {
    proto::Topology { segments: HashMap::from([(HOSTNAME_KEY.to_string(), node.to_string())]) }
}

/// Whether a capability is one this driver serves: a mount (any access mode on the one node).
fn check_capability(cap: Option<&proto::VolumeCapability>) -> Result<(), Status> {
    match cap.and_then(|c| c.access_type.as_ref()) {
        Some(proto::volume_capability::AccessType::Mount(_)) => Ok(()),
        Some(proto::volume_capability::AccessType::Block(_)) => {
            Err(Status::invalid_argument("block volumes are not supported by this driver; use volumeMode: Filesystem"))
        }
        None => Err(Status::invalid_argument("volume capability missing in request")),
    }
}

/// Runs blocking filesystem work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Status> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(e.to_string()))?
}

impl HostPath {
    /// Serves the three CSI services on `listener` until `shutdown`.
    pub async fn serve(
        self,
        listener: tokio::net::UnixListener,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(proto::identity_server::IdentityServer::new(self.clone()))
            .add_service(proto::controller_server::ControllerServer::new(self.clone()))
            .add_service(proto::node_server::NodeServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }

    /// The directory name of a new volume: `name` (`pvc-<uid>`), and the claim it is for when known.
    fn dir_name(name: &str, params: &HashMap<String, String>) -> String {
        match (params.get(PVC_NAMESPACE_PARAM), params.get(PVC_NAME_PARAM)) {
            (Some(ns), Some(claim)) => format!("{name}_{ns}_{claim}"),
            _ => name.to_string(),
        }
    }
}

#[tonic::async_trait]
impl proto::identity_server::Identity for HostPath {
    async fn get_plugin_info(&self, _: Request<proto::GetPluginInfoRequest>) -> Reply<proto::GetPluginInfoResponse> {
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Reply<proto::GetPluginCapabilitiesResponse> {
        let service = |t: pcap::service::Type| proto::PluginCapability {
            r#type: Some(pcap::Type::Service(pcap::Service { r#type: t as i32 })),
        };
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(pcap::service::Type::ControllerService),
                service(pcap::service::Type::VolumeAccessibilityConstraints),
                proto::PluginCapability {
                    r#type: Some(pcap::Type::VolumeExpansion(pcap::VolumeExpansion {
                        r#type: pcap::volume_expansion::Type::Online as i32,
                    })),
                },
            ],
        }))
    }

    async fn probe(&self, _: Request<proto::ProbeRequest>) -> Reply<proto::ProbeResponse> {
        let ready = self.root.is_dir() || std::fs::create_dir_all(&self.root).is_ok();
        Ok(Response::new(proto::ProbeResponse { ready: Some(proto::BoolValue { value: ready }) }))
    }
}

#[tonic::async_trait]
impl proto::controller_server::Controller for HostPath {
    /// Makes the directory (under a temporary name, renamed into place, so a crash never leaves a
    /// half-made volume under a volume's name). Idempotent: the same name gives the same volume.
    async fn create_volume(&self, req: Request<proto::CreateVolumeRequest>) -> Reply<proto::CreateVolumeResponse> {
        let req = req.into_inner();
        if req.name.is_empty() {
            return Err(Status::invalid_argument("volume name missing in request"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume capabilities missing in request"));
        }
        for cap in &req.volume_capabilities {
            check_capability(Some(cap))?;
        }
        if let Some(wanted) = &req.accessibility_requirements {
            let here = topology(&self.node_id);
            let listed: Vec<&proto::Topology> = wanted.requisite.iter().chain(&wanted.preferred).collect();
            if !listed.is_empty() && !listed.contains(&&here) {
                return Err(Status::resource_exhausted(format!(
                    "volumes of this driver are made on node {} only, which the requested topology does not include",
                    self.node_id
                )));
            }
        }
        let id = Self::dir_name(&req.name, &req.parameters);
        let dir = volume_dir(&self.root, &id)?;
        let capacity = req.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        let root = self.root.clone();
        let made = id.clone();
        blocking(move || {
            if dir.is_dir() {
                return Ok(());
            }
            let tmp = root.join(format!(".{made}.tmp"));
            let what = || format!("creating the volume directory {}", dir.display());
            std::fs::create_dir_all(&tmp).map_err(|e| io_status(what(), e))?;
            // Any user of any container may write, as local-path-provisioner's directories.
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777)).map_err(|e| io_status(what(), e))?;
            std::fs::rename(&tmp, &dir).map_err(|e| io_status(what(), e))
        })
        .await?;
        tracing::info!(volume = %id, node = %self.node_id, "hostpath volume created");
        Ok(Response::new(proto::CreateVolumeResponse {
            volume: Some(proto::Volume {
                capacity_bytes: capacity,
                volume_id: id,
                volume_context: HashMap::new(),
                accessible_topology: vec![topology(&self.node_id)],
            }),
        }))
    }

    async fn delete_volume(&self, req: Request<proto::DeleteVolumeRequest>) -> Reply<proto::DeleteVolumeResponse> {
        let id = req.into_inner().volume_id;
        let dir = volume_dir(&self.root, &id)?;
        blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io_status(format!("removing the volume directory {}", dir.display()), e))
            }
            _ => Ok(()),
        })
        .await?;
        tracing::info!(volume = %id, "hostpath volume deleted");
        Ok(Response::new(proto::DeleteVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Reply<proto::ControllerGetCapabilitiesResponse> {
        let rpc = |t: ccap::rpc::Type| proto::ControllerServiceCapability {
            r#type: Some(ccap::Type::Rpc(ccap::Rpc { r#type: t as i32 })),
        };
        let mut capabilities = vec![rpc(ccap::rpc::Type::CreateDeleteVolume), rpc(ccap::rpc::Type::ExpandVolume)];
        if self.attach {
            capabilities.push(rpc(ccap::rpc::Type::PublishUnpublishVolume));
        }
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse { capabilities }))
    }

    /// "Attaches" a volume to its node: checks it exists there and says so in the publish context.
    async fn controller_publish_volume(
        &self,
        req: Request<proto::ControllerPublishVolumeRequest>,
    ) -> Reply<proto::ControllerPublishVolumeResponse> {
        if !self.attach {
            return Err(Status::unimplemented("this driver does not attach volumes"));
        }
        let req = req.into_inner();
        check_capability(req.volume_capability.as_ref())?;
        let dir = volume_dir(&self.root, &req.volume_id)?;
        if req.node_id != self.node_id {
            return Err(Status::not_found(format!(
                "node {} is not this driver's node ({}): its volumes are on {} only",
                req.node_id, self.node_id, self.node_id
            )));
        }
        if !dir.is_dir() {
            return Err(Status::not_found(format!("volume {} does not exist", req.volume_id)));
        }
        tracing::info!(volume = %req.volume_id, node = %req.node_id, "hostpath volume attached");
        Ok(Response::new(proto::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(ATTACHED_TO.to_string(), req.node_id)]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Reply<proto::ControllerUnpublishVolumeResponse> {
        if !self.attach {
            return Err(Status::unimplemented("this driver does not attach volumes"));
        }
        let req = req.into_inner();
        tracing::info!(volume = %req.volume_id, node = %req.node_id, "hostpath volume detached");
        Ok(Response::new(proto::ControllerUnpublishVolumeResponse {}))
    }

    /// A directory grows by itself: only the recorded capacity changes.
    async fn controller_expand_volume(
        &self,
        req: Request<proto::ControllerExpandVolumeRequest>,
    ) -> Reply<proto::ControllerExpandVolumeResponse> {
        let req = req.into_inner();
        let dir = volume_dir(&self.root, &req.volume_id)?;
        if !dir.is_dir() {
            return Err(Status::not_found(format!("volume {} does not exist", req.volume_id)));
        }
        let capacity = req.capacity_range.map_or(0, |c| c.required_bytes);
        Ok(Response::new(proto::ControllerExpandVolumeResponse {
            capacity_bytes: capacity,
            node_expansion_required: false,
        }))
    }
}

#[tonic::async_trait]
impl proto::node_server::Node for HostPath {
    async fn node_stage_volume(
        &self,
        req: Request<proto::NodeStageVolumeRequest>,
    ) -> Reply<proto::NodeStageVolumeResponse> {
        let req = req.into_inner();
        check_capability(req.volume_capability.as_ref())?;
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging target path missing in request"));
        }
        let dir = volume_dir(&self.root, &req.volume_id)?;
        if self.attach && req.publish_context.get(ATTACHED_TO) != Some(&self.node_id) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not attached to node {} (no ControllerPublishVolume context)",
                req.volume_id, self.node_id
            )));
        }
        let staging = PathBuf::from(req.staging_target_path);
        blocking(move || {
            if !dir.is_dir() {
                return Err(Status::not_found(format!("volume {} does not exist on this node", dir.display())));
            }
            let what = || format!("staging {} at {}", dir.display(), staging.display());
            std::fs::create_dir_all(&staging).map_err(|e| io_status(what(), e))?;
            mount::bind(&dir, &staging, false).map_err(|e| io_status(what(), e))
        })
        .await?;
        Ok(Response::new(proto::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<proto::NodeUnstageVolumeRequest>,
    ) -> Reply<proto::NodeUnstageVolumeResponse> {
        let staging = PathBuf::from(req.into_inner().staging_target_path);
        blocking(move || unmount_and_remove(&staging)).await?;
        Ok(Response::new(proto::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<proto::NodePublishVolumeRequest>,
    ) -> Reply<proto::NodePublishVolumeResponse> {
        let req = req.into_inner();
        check_capability(req.volume_capability.as_ref())?;
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target path missing in request"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition("the volume must be staged first (staging target path missing)"));
        }
        let (staging, target, read_only) =
            (PathBuf::from(req.staging_target_path), PathBuf::from(req.target_path), req.readonly);
        blocking(move || {
            let what = || format!("publishing {} at {}", staging.display(), target.display());
            if !mount::is_mounted(&staging).map_err(|e| io_status(what(), e))? {
                return Err(Status::failed_precondition(format!("the volume is not staged at {}", staging.display())));
            }
            std::fs::create_dir_all(&target).map_err(|e| io_status(what(), e))?;
            mount::bind(&staging, &target, read_only).map_err(|e| io_status(what(), e))
        })
        .await?;
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Reply<proto::NodeUnpublishVolumeResponse> {
        let target = PathBuf::from(req.into_inner().target_path);
        blocking(move || unmount_and_remove(&target)).await?;
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Reply<proto::NodeGetVolumeStatsResponse> {
        let path = PathBuf::from(req.into_inner().volume_path);
        let stat = blocking(move || {
            nix::sys::statvfs::statvfs(&path)
                .map_err(|e| io_status(format!("statfs of {}", path.display()), std::io::Error::from(e)))
        })
        .await?;
        let (frsize, blocks) = (stat.fragment_size() as i64, stat.blocks() as i64);
        let usage = |unit: proto::volume_usage::Unit, total: i64, available: i64, free: i64| proto::VolumeUsage {
            available,
            total,
            used: total - free,
            unit: unit as i32,
        };
        Ok(Response::new(proto::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(
                    proto::volume_usage::Unit::Bytes,
                    blocks * frsize,
                    stat.blocks_available() as i64 * frsize,
                    stat.blocks_free() as i64 * frsize,
                ),
                usage(
                    proto::volume_usage::Unit::Inodes,
                    stat.files() as i64,
                    stat.files_available() as i64,
                    stat.files_free() as i64,
                ),
            ],
        }))
    }

    async fn node_expand_volume(
        &self,
        req: Request<proto::NodeExpandVolumeRequest>,
    ) -> Reply<proto::NodeExpandVolumeResponse> {
        let capacity = req.into_inner().capacity_range.map_or(0, |c| c.required_bytes);
        Ok(Response::new(proto::NodeExpandVolumeResponse { capacity_bytes: capacity }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Reply<proto::NodeGetCapabilitiesResponse> {
        let rpc = |t: ncap::rpc::Type| proto::NodeServiceCapability {
            r#type: Some(ncap::Type::Rpc(ncap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: vec![rpc(ncap::rpc::Type::StageUnstageVolume), rpc(ncap::rpc::Type::GetVolumeStats)],
        }))
    }

    async fn node_get_info(&self, _: Request<proto::NodeGetInfoRequest>) -> Reply<proto::NodeGetInfoResponse> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes,
            accessible_topology: Some(topology(&self.node_id)),
        }))
    }
}

/// Unmounts a staging or target path and removes the directory (idempotent).
fn unmount_and_remove(path: &Path) -> Result<(), Status> {
    let what = || format!("unmounting {}", path.display());
    mount::unmount(path).map_err(|e| io_status(what(), e))?;
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_status(what(), e)),
        _ => Ok(()),
    }
}
