//! kubelet's pod-resources API (v1 List, Get, GetAllocatableResources) on
//! `<kubelet-root>/pod-resources/kubelet.sock`: which devices each container of the node's active
//! pods holds, and which devices the node can hand out. GPU monitoring exporters (dcgm-exporter)
//! read it to put pod names on their metrics.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::Manager;

/// The pod-resources API, as generated from `proto/podresources.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}

/// The pods the node runs now (kubelet's active pods: admitted, not finished).
pub trait ActivePods: Send + Sync + 'static {
    fn active_pods(&self) -> Vec<Pod>;
}

/// The directory of the socket under kubelet's root directory.
pub fn dir(kubelet_root_dir: &Path) -> std::path::PathBuf {
    kubelet_root_dir.join("pod-resources")
}

/// Serves the API on `<dir>/kubelet.sock` until `shutdown`.
pub fn serve(
    dir: &Path,
    manager: Manager,
    pods: Arc<dyn ActivePods>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let socket = dir.join("kubelet.sock");
    let listener =
        crate::csi::bind_socket(&socket).map_err(|e| anyhow::anyhow!("listening on {}: {e}", socket.display()))?;
    let lister = Lister { manager, pods };
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(proto::pod_resources_lister_server::PodResourcesListerServer::new(lister))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                shutdown.cancelled(),
            )
            .await;
        if let Err(e) = served {
            tracing::error!("pod resources API on {}: {e}", socket.display());
        }
        let _ = std::fs::remove_file(&socket);
    });
    Ok(())
}

struct Lister {
    manager: Manager,
    pods: Arc<dyn ActivePods>,
}

fn devices(resource: String, device_ids: Vec<String>) -> proto::ContainerDevices {
    proto::ContainerDevices { resource_name: resource, device_ids, topology: None }
}

impl Lister {
    /// Every container of the pod, with the devices each holds.
    fn resources_of(&self, pod: &Pod) -> proto::PodResources {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let assigned = self.manager.assigned(uid);
        let spec = pod.spec.as_ref();
        let containers = spec.map(|s| s.init_containers.iter().flatten().chain(&s.containers)).into_iter().flatten();
        proto::PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers: containers
                .map(|c| proto::ContainerResources {
                    name: c.name.clone(),
                    devices: assigned
                        .iter()
                        .filter(|(container, _, _)| *container == c.name)
                        .map(|(_, resource, ids)| devices(resource.clone(), ids.clone()))
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl proto::pod_resources_lister_server::PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        let pod_resources = self.pods.active_pods().iter().map(|p| self.resources_of(p)).collect();
        Ok(Response::new(proto::ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        let devices = self.manager.allocatable().into_iter().map(|(resource, ids)| devices(resource, ids)).collect();
        Ok(Response::new(proto::AllocatableResourcesResponse { devices, ..Default::default() }))
    }

    /// Upstream's text for a pod the node does not run.
    async fn get(
        &self,
        req: Request<proto::GetPodResourcesRequest>,
    ) -> Result<Response<proto::GetPodResourcesResponse>, Status> {
        let req = req.into_inner();
        let pods = self.pods.active_pods();
        let pod = pods.iter().find(|p| {
            p.metadata.name.as_deref() == Some(req.pod_name.as_str())
                && p.metadata.namespace.as_deref() == Some(req.pod_namespace.as_str())
        });
        let Some(pod) = pod else {
            return Err(Status::unknown(format!("pod {} in namespace {} not found", req.pod_name, req.pod_namespace)));
        };
        Ok(Response::new(proto::GetPodResourcesResponse { pod_resources: Some(self.resources_of(pod)) }))
    }
}
