//! The container runtime as the pod workers use it: the calls of CRI's `RuntimeService` and
//! `ImageService` they make, behind [`ContainerRuntime`] so that a worker runs against [`Cri`] in
//! cairn and against a fake runtime in its unit tests (kubelet's `kubecontainer.Runtime` seam);
//! the node endpoint asks it for streaming sessions.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::probes;
use crate::runtime::cri::{self, Cri, CriError};

type Call<'a, T> = BoxFuture<'a, Result<T, CriError>>;

/// The CRI calls of a pod worker, the pod manager's relist and housekeeping, and probes.
pub trait ContainerRuntime: Send + Sync + 'static {
    fn run_pod_sandbox(&self, r: cri::RunPodSandboxRequest) -> Call<'_, cri::RunPodSandboxResponse>;
    fn stop_pod_sandbox(&self, r: cri::StopPodSandboxRequest) -> Call<'_, cri::StopPodSandboxResponse>;
    fn remove_pod_sandbox(&self, r: cri::RemovePodSandboxRequest) -> Call<'_, cri::RemovePodSandboxResponse>;
    fn pod_sandbox_status(&self, r: cri::PodSandboxStatusRequest) -> Call<'_, cri::PodSandboxStatusResponse>;
    fn list_pod_sandbox(&self, r: cri::ListPodSandboxRequest) -> Call<'_, cri::ListPodSandboxResponse>;
    fn create_container(&self, r: cri::CreateContainerRequest) -> Call<'_, cri::CreateContainerResponse>;
    fn start_container(&self, r: cri::StartContainerRequest) -> Call<'_, cri::StartContainerResponse>;
    /// SIGTERM (or the image's stop signal), SIGKILL after `grace`.
    fn stop_container<'a>(&'a self, id: &'a str, grace: Duration) -> Call<'a, ()>;
    fn remove_container(&self, r: cri::RemoveContainerRequest) -> Call<'_, cri::RemoveContainerResponse>;
    fn list_containers(&self, r: cri::ListContainersRequest) -> Call<'_, cri::ListContainersResponse>;
    fn container_status(&self, r: cri::ContainerStatusRequest) -> Call<'_, cri::ContainerStatusResponse>;
    fn reopen_container_log(&self, r: cri::ReopenContainerLogRequest) -> Call<'_, cri::ReopenContainerLogResponse>;
    fn exec_sync(&self, r: cri::ExecSyncRequest) -> Call<'_, cri::ExecSyncResponse>;
    /// Streaming sessions (the node endpoint's exec, attach and port-forward): the runtime's URL.
    fn exec(&self, r: cri::ExecRequest) -> Call<'_, cri::ExecResponse>;
    fn attach(&self, r: cri::AttachRequest) -> Call<'_, cri::AttachResponse>;
    /// CPU and memory of containers (the node's stats).
    fn list_container_stats(&self, r: cri::ListContainerStatsRequest) -> Call<'_, cri::ListContainerStatsResponse>;
    fn image_status(&self, r: cri::ImageStatusRequest) -> Call<'_, cri::ImageStatusResponse>;
    fn pull_image(&self, r: cri::PullImageRequest) -> Call<'_, cri::PullImageResponse>;
}

macro_rules! delegate {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {$(
        fn $name(&self, r: $req) -> Call<'_, $resp> {
            Box::pin(Cri::$name(self, r))
        }
    )*};
}

impl ContainerRuntime for Cri {
    delegate! {
        run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
        stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
        remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
        pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
        list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse;
        create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse;
        start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
        remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse;
        list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse;
        container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
        reopen_container_log(cri::ReopenContainerLogRequest) -> cri::ReopenContainerLogResponse;
        exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse;
        exec(cri::ExecRequest) -> cri::ExecResponse;
        attach(cri::AttachRequest) -> cri::AttachResponse;
        list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse;
        image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse;
        pull_image(cri::PullImageRequest) -> cri::PullImageResponse;
    }

    fn stop_container<'a>(&'a self, id: &'a str, grace: Duration) -> Call<'a, ()> {
        Box::pin(Cri::stop_container(self, id, grace))
    }
}

/// Runs probe and hook commands through CRI `ExecSync`.
pub struct RuntimeExec(pub Arc<dyn ContainerRuntime>);

impl probes::Exec for RuntimeExec {
    fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'_, anyhow::Result<probes::ExecOutput>> {
        let request =
            cri::ExecSyncRequest { container_id: container_id.into(), cmd, timeout: timeout.as_secs() as i64 };
        Box::pin(async move {
            let r = match self.0.exec_sync(request).await {
                Ok(r) => r,
                Err(CriError::Timeout { .. }) => return Err(probes::ExecTimeout.into()),
                Err(e) => return Err(e.into()),
            };
            Ok(probes::ExecOutput { exit_code: r.exit_code, stdout: r.stdout, stderr: r.stderr })
        })
    }
}
