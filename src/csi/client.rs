//! The CSI calls the node makes, behind [`Driver`] so that the volume manager and the provisioner run
//! against any driver over gRPC ([`GrpcDriver`]) and against a fake in unit tests. [`Drivers`] is
//! kubelet's `csiDrivers` map: the drivers registered on this node, by name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::transport::Channel;

use super::proto::{
    self, controller_service_capability as ccap, node_service_capability as ncap, plugin_capability as pcap,
};

/// kubelet's `csiTimeout` for node operations, and external-provisioner's default `--timeout` is shorter
/// but retried: one call may take this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A failed CSI call, with the driver's gRPC code and message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rpc error: code = {code:?} desc = {message}")]
pub struct CsiError {
    pub code: tonic::Code,
    pub message: String,
}

impl From<tonic::Status> for CsiError {
    fn from(s: tonic::Status) -> Self {
        CsiError { code: s.code(), message: s.message().to_string() }
    }
}

type Call<'a, T> = BoxFuture<'a, Result<T, CsiError>>;

/// What a driver can do, learned once at registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Node: `STAGE_UNSTAGE_VOLUME` (NodeStageVolume before NodePublishVolume).
    pub stage_unstage: bool,
    /// Controller service with `CREATE_DELETE_VOLUME`: the driver provisions.
    pub create_delete: bool,
    /// Controller `EXPAND_VOLUME`.
    pub expand: bool,
    /// Node `EXPAND_VOLUME`.
    pub node_expand: bool,
    /// Controller `PUBLISH_UNPUBLISH_VOLUME`: volumes are attached to a node before they are staged.
    pub publish_unpublish: bool,
}

/// The CSI services of one driver, as the node uses them.
pub trait Driver: Send + Sync {
    fn capabilities(&self) -> &Capabilities;
    fn create_volume(&self, req: proto::CreateVolumeRequest) -> Call<'_, proto::Volume>;
    fn delete_volume(&self, volume_id: String) -> Call<'_, ()>;
    fn expand_volume(
        &self,
        req: proto::ControllerExpandVolumeRequest,
    ) -> Call<'_, proto::ControllerExpandVolumeResponse>;
    /// ControllerPublishVolume: attaches the volume to the node; its answer is the publish context.
    fn controller_publish(&self, req: proto::ControllerPublishVolumeRequest) -> Call<'_, HashMap<String, String>>;
    fn controller_unpublish(&self, volume_id: String, node_id: String) -> Call<'_, ()>;
    fn stage(&self, req: proto::NodeStageVolumeRequest) -> Call<'_, ()>;
    fn unstage(&self, volume_id: String, staging_target_path: String) -> Call<'_, ()>;
    fn publish(&self, req: proto::NodePublishVolumeRequest) -> Call<'_, ()>;
    fn unpublish(&self, volume_id: String, target_path: String) -> Call<'_, ()>;
}

/// A driver reached over gRPC on its Unix socket.
pub struct GrpcDriver {
    channel: Channel,
    caps: Capabilities,
}

/// What registration learns from a driver's Identity and Node services.
pub struct Registered {
    pub driver: GrpcDriver,
    pub name: String,
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
}

fn timed<T>(req: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(req);
    req.set_timeout(CALL_TIMEOUT);
    req
}

impl GrpcDriver {
    /// Connects to the driver at `socket` and asks what it is (kubelet's `RegisterPlugin`: NodeGetInfo
    /// and the capabilities).
    pub async fn connect(socket: &Path) -> Result<Registered, CsiError> {
        let channel = crate::runtime::cri::connect(socket)
            .await
            .map_err(|e| CsiError { code: tonic::Code::Unavailable, message: format!("{}: {e}", socket.display()) })?;
        let mut identity = proto::identity_client::IdentityClient::new(channel.clone());
        let mut node = proto::node_client::NodeClient::new(channel.clone());
        let info = identity.get_plugin_info(timed(proto::GetPluginInfoRequest {})).await?.into_inner();
        let plugin_caps =
            identity.get_plugin_capabilities(timed(proto::GetPluginCapabilitiesRequest {})).await?.into_inner();
        let node_info = node.node_get_info(timed(proto::NodeGetInfoRequest {})).await?.into_inner();
        let node_caps = node.node_get_capabilities(timed(proto::NodeGetCapabilitiesRequest {})).await?.into_inner();
        let node_rpc = |t: ncap::rpc::Type| {
            node_caps.capabilities.iter().any(|c| matches!(&c.r#type, Some(ncap::Type::Rpc(r)) if r.r#type == t as i32))
        };
        let has_controller = plugin_caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(pcap::Type::Service(s)) if s.r#type == pcap::service::Type::ControllerService as i32)
        });
        let mut caps = Capabilities {
            stage_unstage: node_rpc(ncap::rpc::Type::StageUnstageVolume),
            node_expand: node_rpc(ncap::rpc::Type::ExpandVolume),
            ..Default::default()
        };
        if has_controller {
            let mut controller = proto::controller_client::ControllerClient::new(channel.clone());
            let cc = controller
                .controller_get_capabilities(timed(proto::ControllerGetCapabilitiesRequest {}))
                .await?
                .into_inner();
            let rpc = |t: ccap::rpc::Type| {
                cc.capabilities.iter().any(|c| matches!(&c.r#type, Some(ccap::Type::Rpc(r)) if r.r#type == t as i32))
            };
            caps.create_delete = rpc(ccap::rpc::Type::CreateDeleteVolume);
            caps.expand = rpc(ccap::rpc::Type::ExpandVolume);
            caps.publish_unpublish = rpc(ccap::rpc::Type::PublishUnpublishVolume);
        }
        Ok(Registered {
            driver: GrpcDriver { channel, caps },
            name: info.name,
            node_id: node_info.node_id,
            max_volumes: node_info.max_volumes_per_node,
            topology: node_info.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default(),
        })
    }

    fn controller(&self) -> proto::controller_client::ControllerClient<Channel> {
        proto::controller_client::ControllerClient::new(self.channel.clone())
    }

    fn node(&self) -> proto::node_client::NodeClient<Channel> {
        proto::node_client::NodeClient::new(self.channel.clone())
    }
}

impl Driver for GrpcDriver {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn create_volume(&self, req: proto::CreateVolumeRequest) -> Call<'_, proto::Volume> {
        Box::pin(async move {
            let resp = self.controller().create_volume(timed(req)).await?.into_inner();
            resp.volume.ok_or_else(|| CsiError {
                code: tonic::Code::Internal,
                message: "CreateVolume answered without a volume".into(),
            })
        })
    }

    fn delete_volume(&self, volume_id: String) -> Call<'_, ()> {
        Box::pin(async move {
            self.controller()
                .delete_volume(timed(proto::DeleteVolumeRequest { volume_id, secrets: HashMap::new() }))
                .await?;
            Ok(())
        })
    }

    fn expand_volume(
        &self,
        req: proto::ControllerExpandVolumeRequest,
    ) -> Call<'_, proto::ControllerExpandVolumeResponse> {
        Box::pin(async move { Ok(self.controller().controller_expand_volume(timed(req)).await?.into_inner()) })
    }

    fn controller_publish(&self, req: proto::ControllerPublishVolumeRequest) -> Call<'_, HashMap<String, String>> {
        Box::pin(async move {
            Ok(self.controller().controller_publish_volume(timed(req)).await?.into_inner().publish_context)
        })
    }

    fn controller_unpublish(&self, volume_id: String, node_id: String) -> Call<'_, ()> {
        Box::pin(async move {
            let req = proto::ControllerUnpublishVolumeRequest { volume_id, node_id, secrets: HashMap::new() };
            self.controller().controller_unpublish_volume(timed(req)).await?;
            Ok(())
        })
    }

    fn stage(&self, req: proto::NodeStageVolumeRequest) -> Call<'_, ()> {
        Box::pin(async move {
            self.node().node_stage_volume(timed(req)).await?;
            Ok(())
        })
    }

    fn unstage(&self, volume_id: String, staging_target_path: String) -> Call<'_, ()> {
        Box::pin(async move {
            self.node()
                .node_unstage_volume(timed(proto::NodeUnstageVolumeRequest { volume_id, staging_target_path }))
                .await?;
            Ok(())
        })
    }

    fn publish(&self, req: proto::NodePublishVolumeRequest) -> Call<'_, ()> {
        Box::pin(async move {
            self.node().node_publish_volume(timed(req)).await?;
            Ok(())
        })
    }

    fn unpublish(&self, volume_id: String, target_path: String) -> Call<'_, ()> {
        Box::pin(async move {
            self.node()
                .node_unpublish_volume(timed(proto::NodeUnpublishVolumeRequest { volume_id, target_path }))
                .await?;
            Ok(())
        })
    }
}

/// One registered driver.
#[derive(Clone)]
pub struct Entry {
    pub driver: Arc<dyn Driver>,
    /// The driver's ID of this node (`NodeGetInfo`), what ControllerPublishVolume is told.
    pub node_id: String,
    /// The topology segments of this node that the driver reported.
    pub topology: BTreeMap<String, String>,
}

/// The drivers registered on this node, by name (kubelet's `csiDrivers`), and a signal of each
/// change. Cheap to clone.
#[derive(Clone)]
pub struct Drivers {
    map: Arc<RwLock<HashMap<String, Entry>>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for Drivers {
    fn default() -> Self {
        Drivers { map: Arc::default(), changed: Arc::new(tokio::sync::watch::Sender::new(0)) }
    }
}

impl Drivers {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, name: &str) -> Option<Entry> {
        self.read().get(name).cloned()
    }

    pub fn insert(&self, name: String, entry: Entry) {
        self.write().insert(name, entry);
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn remove(&self, name: &str) -> Option<Entry> {
        let gone = self.write().remove(name);
        self.changed.send_modify(|n| *n += 1);
        gone
    }

    /// Whether `name` is registered here and provisions volumes.
    pub fn provisions(&self, name: &str) -> bool {
        self.read().get(name).is_some_and(|e| e.driver.capabilities().create_delete)
    }

    /// One item per registration or deregistration from now on.
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        use futures::StreamExt as _;
        let mut rx = self.changed.subscribe();
        rx.mark_unchanged();
        tokio_stream::wrappers::WatchStream::from_changes(rx).map(|_| ())
    }
}
