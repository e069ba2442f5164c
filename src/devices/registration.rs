//! The device manager's two ends of the device-plugin API: the Registration service on
//! `kubelet.sock`, and a client per registered plugin that follows its ListAndWatch stream.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::proto::{self, device_plugin_client::DevicePluginClient};
use super::{HEALTHY, Manager, VERSION};
use crate::registry::kinds::pod_rules::is_extended_resource;

/// Serves the Registration service on `<dir>/kubelet.sock` (replacing a stale socket, which tells
/// running plugins to register again) until `shutdown`.
pub fn serve(dir: &Path, manager: Manager, shutdown: CancellationToken) -> anyhow::Result<()> {
    let socket = dir.join("kubelet.sock");
    let listener =
        crate::csi::bind_socket(&socket).map_err(|e| anyhow::anyhow!("listening on {}: {e}", socket.display()))?;
    let registrar = Registrar { dir: dir.to_path_buf(), manager, shutdown: shutdown.clone() };
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let served = tonic::transport::Server::builder()
            .add_service(proto::registration_server::RegistrationServer::new(registrar))
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
            .await;
        if let Err(e) = served {
            tracing::error!("device plugin registration on {}: {e}", socket.display());
        }
        let _ = std::fs::remove_file(&socket);
    });
    Ok(())
}

struct Registrar {
    dir: PathBuf,
    manager: Manager,
    shutdown: CancellationToken,
}

#[tonic::async_trait]
impl proto::registration_server::Registration for Registrar {
    /// Upstream's checks and texts; then the plugin's stream is followed in the background.
    async fn register(&self, req: Request<proto::RegisterRequest>) -> Result<Response<proto::Empty>, Status> {
        let req = req.into_inner();
        if !is_extended_resource(&req.resource_name) {
            return Err(Status::unknown(format!("the ResourceName {:?} is invalid", req.resource_name)));
        }
        if req.version != VERSION {
            return Err(Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are [\"{VERSION}\"]",
                req.version
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(Status::unknown(format!(
                "the endpoint {:?} is not a socket name in {}",
                req.endpoint,
                self.dir.display()
            )));
        }
        let generation = self.manager.registered(&req.resource_name, &req.options.unwrap_or_default());
        tracing::info!("device plugin for {} registered at {}", req.resource_name, req.endpoint);
        tokio::spawn(follow(
            self.manager.clone(),
            req.resource_name,
            self.dir.join(req.endpoint),
            generation,
            self.shutdown.clone(),
        ));
        Ok(Response::new(proto::Empty {}))
    }
}

/// Follows one plugin's ListAndWatch until it ends (the plugin went away) or `shutdown`.
async fn follow(manager: Manager, resource: String, endpoint: PathBuf, generation: u64, shutdown: CancellationToken) {
    let listed = async {
        let channel = crate::runtime::cri::connect(&endpoint).await.map_err(|e| e.to_string())?;
        let mut client = DevicePluginClient::new(channel);
        manager.connected(&resource, generation, client.clone());
        let mut stream =
            client.list_and_watch(proto::Empty {}).await.map_err(|e| e.message().to_string())?.into_inner();
        while let Some(answer) = stream.message().await.map_err(|e| e.message().to_string())? {
            let devices: BTreeMap<String, bool> =
                answer.devices.into_iter().map(|d| (d.id, d.health == HEALTHY)).collect();
            tracing::debug!("device plugin for {resource}: {} devices", devices.len());
            manager.listed(&resource, generation, devices);
        }
        Ok::<(), String>(())
    };
    let ended = tokio::select! {
        r = listed => r,
        _ = shutdown.cancelled() => return,
    };
    match ended {
        Ok(()) => tracing::info!("device plugin for {resource} ended its device list: its devices are unhealthy"),
        Err(e) => {
            tracing::warn!("device plugin for {resource} at {}: {e}; its devices are unhealthy", endpoint.display())
        }
    }
    manager.disconnected(&resource, generation);
}
