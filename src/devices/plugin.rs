//! What cairn's own device plugins (`generic.rs`, `nvidia.rs`) share: serving on a socket in the
//! device-plugins directory and registering through `kubelet.sock`, the path an external plugin
//! takes, and a ListAndWatch stream that sends the whole list again at each change.

use std::path::Path;
use std::pin::Pin;

use futures::StreamExt as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::proto::{self, device_plugin_server::DevicePlugin};
use super::{HEALTHY, VERSION};

/// The ListAndWatch stream of cairn's plugins.
pub type Listing = Pin<Box<dyn futures::Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

/// Device IDs and whether each is healthy, as a plugin knows them now.
pub type Devices = watch::Receiver<Vec<(String, bool)>>;

/// Sends the devices, and again at every change.
pub fn listing(devices: Devices) -> Listing {
    Box::pin(tokio_stream::wrappers::WatchStream::new(devices).map(|devices| {
        let devices = devices
            .into_iter()
            .map(|(id, healthy)| proto::Device {
                id,
                health: if healthy { HEALTHY } else { "Unhealthy" }.into(),
                topology: None,
            })
            .collect();
        Ok(proto::ListAndWatchResponse { devices })
    }))
}

/// The socket name of cairn's plugin for `resource` in the device-plugins directory.
pub fn socket_name(resource: &str) -> String {
    let name: String = resource.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    format!("cairn-{name}.sock")
}

/// What a built-in plugin answers to Allocate for one container's devices.
pub trait Allocator: Send + Sync + 'static {
    fn allocate(&self, ids: &[String]) -> Result<proto::ContainerAllocateResponse, Status>;
}

/// A built-in plugin: its devices as a watch channel, its Allocate answers from `allocator`; no
/// preferred allocation, nothing to do before a container starts.
struct Builtin<A> {
    devices: Devices,
    allocator: A,
}

#[tonic::async_trait]
impl<A: Allocator> DevicePlugin for Builtin<A> {
    type ListAndWatchStream = Listing;

    async fn get_device_plugin_options(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(proto::DevicePluginOptions::default()))
    }

    async fn list_and_watch(&self, _: Request<proto::Empty>) -> Result<Response<Listing>, Status> {
        Ok(Response::new(listing(self.devices.clone())))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preference"))
    }

    async fn allocate(
        &self,
        req: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let requests = req.into_inner().container_requests;
        let container_responses =
            requests.iter().map(|c| self.allocator.allocate(&c.devices_ids)).collect::<Result<_, _>>()?;
        Ok(Response::new(proto::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

/// Serves a built-in plugin for `resource` (its `devices`, answered by `allocator`) in the
/// device-plugins directory `dir` until `shutdown`, and registers it.
pub async fn serve_and_register(
    devices: Devices,
    allocator: impl Allocator,
    resource: &str,
    dir: &Path,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let plugin = Builtin { devices, allocator };
    let socket = dir.join(socket_name(resource));
    let listener =
        crate::csi::bind_socket(&socket).map_err(|e| anyhow::anyhow!("listening on {}: {e}", socket.display()))?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(proto::device_plugin_server::DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), stop.cancelled())
            .await;
        if let Err(e) = served {
            tracing::error!("device plugin {}: {e}", socket.display());
        }
    });
    let channel = crate::runtime::cri::connect(&dir.join("kubelet.sock")).await?;
    let req = proto::RegisterRequest {
        version: VERSION.into(),
        endpoint: socket_name(resource),
        resource_name: resource.to_string(),
        options: Some(proto::DevicePluginOptions::default()),
    };
    proto::registration_client::RegistrationClient::new(channel)
        .register(req)
        .await
        .map_err(|e| anyhow::anyhow!("registering {resource}: {}", e.message()))?;
    Ok(())
}
