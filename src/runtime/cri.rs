//! CRI v1 client over a Unix socket: the runtime and image services with per-call timeouts and typed
//! errors. The channel reconnects by itself, so a client outlives a runtime restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

pub use k8s_cri::v1::*;

/// How long an ordinary call may take (kubelet's `--runtime-request-timeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an image pull may take.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Largest response accepted (a node with many containers lists a lot).
const MAX_MESSAGE: usize = 16 << 20;

/// Why a CRI call failed.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("the container runtime at {endpoint} is not reachable: {message}")]
    Unavailable { endpoint: String, message: String },
    #[error("{op}: not found: {message}")]
    NotFound { op: &'static str, message: String },
    #[error("{op}: the container runtime did not answer within {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    #[error("{op}: {message}")]
    Runtime { op: &'static str, code: tonic::Code, message: String },
}

/// Parses `unix:///path/to.sock` or a plain socket path.
pub fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        anyhow::bail!("unsupported runtime endpoint {endpoint:?}: expected unix:///path/to/socket");
    }
    Ok(PathBuf::from(path))
}

/// The endpoint and connector of a gRPC channel to a Unix socket. The URI is a placeholder: the
/// connector ignores it and dials the socket.
fn unix_endpoint(
    socket: &Path,
) -> (
    Endpoint,
    impl tower::Service<
        Uri,
        Response = TokioIo<tokio::net::UnixStream>,
        Error = std::io::Error,
        Future = impl std::future::Future<Output = std::io::Result<TokioIo<tokio::net::UnixStream>>> + Send,
    > + Clone
    + Send
    + 'static,
) {
    let socket = socket.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    (Endpoint::from_static("http://[::1]:1").connect_timeout(Duration::from_secs(5)), connector)
}

/// A gRPC channel to a Unix socket, connected lazily and reconnected after failures (within a tokio
/// runtime, which serves it).
pub fn channel(socket: &Path) -> Channel {
    let (endpoint, connector) = unix_endpoint(socket);
    endpoint.connect_with_connector_lazy(connector)
}

/// The same, connected now: fails at once when nothing listens on the socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let (endpoint, connector) = unix_endpoint(socket);
    endpoint.connect_with_connector(connector).await
}

/// A CRI v1 client. Cheap to clone.
#[derive(Clone)]
pub struct Cri {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

macro_rules! calls {
    ($($(#[$doc:meta])* $name:ident: $service:ident . $method:ident ($req:ty) -> $resp:ty, $timeout:expr;)*) => {$(
        $(#[$doc])*
        pub async fn $name(&self, request: $req) -> Result<$resp, CriError> {
            let mut client = self.$service.clone();
            let timeout = $timeout;
            let mut request = tonic::Request::new(request);
            request.set_timeout(timeout);
            let op = stringify!($method);
            match tokio::time::timeout(timeout, client.$method(request)).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(self.error(op, status)),
                Err(_) => Err(CriError::Timeout { op, timeout }),
            }
        }
    )*};
}

impl Cri {
    /// A client for the runtime listening at `socket`. Nothing is dialled until the first call.
    /// Must be called within a tokio runtime, which then serves the connection.
    pub fn new(socket: &Path) -> Self {
        let channel = channel(socket);
        Cri {
            endpoint: format!("unix://{}", socket.display()),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE),
            images: ImageServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn error(&self, op: &'static str, status: tonic::Status) -> CriError {
        let message = status.message().to_string();
        match status.code() {
            tonic::Code::NotFound => CriError::NotFound { op, message },
            tonic::Code::Unavailable => CriError::Unavailable { endpoint: self.endpoint.clone(), message },
            tonic::Code::DeadlineExceeded => CriError::Timeout { op, timeout: REQUEST_TIMEOUT },
            code => CriError::Runtime { op, code, message },
        }
    }

    calls! {
        version: runtime.version(cri::VersionRequest) -> cri::VersionResponse, Duration::from_secs(10);
        /// Runtime conditions (RuntimeReady, NetworkReady).
        status: runtime.status(cri::StatusRequest) -> cri::StatusResponse, Duration::from_secs(10);
        run_pod_sandbox: runtime.run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse, REQUEST_TIMEOUT;
        stop_pod_sandbox: runtime.stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse, REQUEST_TIMEOUT;
        remove_pod_sandbox: runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse, REQUEST_TIMEOUT;
        pod_sandbox_status: runtime.pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse, REQUEST_TIMEOUT;
        list_pod_sandbox: runtime.list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse, REQUEST_TIMEOUT;
        create_container: runtime.create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse, REQUEST_TIMEOUT;
        start_container: runtime.start_container(cri::StartContainerRequest) -> cri::StartContainerResponse, REQUEST_TIMEOUT;
        remove_container: runtime.remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse, REQUEST_TIMEOUT;
        reopen_container_log: runtime.reopen_container_log(cri::ReopenContainerLogRequest) -> cri::ReopenContainerLogResponse, REQUEST_TIMEOUT;
        list_containers: runtime.list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse, REQUEST_TIMEOUT;
        container_status: runtime.container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse, REQUEST_TIMEOUT;
        exec_sync: runtime.exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse, REQUEST_TIMEOUT;
        /// A streaming exec session: the URL on the runtime's streaming server that serves it.
        exec: runtime.exec(cri::ExecRequest) -> cri::ExecResponse, REQUEST_TIMEOUT;
        attach: runtime.attach(cri::AttachRequest) -> cri::AttachResponse, REQUEST_TIMEOUT;
        list_container_stats: runtime.list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse, REQUEST_TIMEOUT;
        list_images: images.list_images(cri::ListImagesRequest) -> cri::ListImagesResponse, REQUEST_TIMEOUT;
        image_status: images.image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse, REQUEST_TIMEOUT;
        pull_image: images.pull_image(cri::PullImageRequest) -> cri::PullImageResponse, PULL_TIMEOUT;
        remove_image: images.remove_image(cri::RemoveImageRequest) -> cri::RemoveImageResponse, REQUEST_TIMEOUT;
        image_fs_info: images.image_fs_info(cri::ImageFsInfoRequest) -> cri::ImageFsInfoResponse, REQUEST_TIMEOUT;
    }

    /// Stops a container: SIGTERM (or the image's stop signal), SIGKILL after `grace`.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let timeout = grace + REQUEST_TIMEOUT;
        let mut request = tonic::Request::new(cri::StopContainerRequest {
            container_id: id.to_string(),
            timeout: grace.as_secs() as i64,
        });
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.stop_container(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(self.error("StopContainer", status)),
            Err(_) => Err(CriError::Timeout { op: "StopContainer", timeout }),
        }
    }

    /// Pulls `reference` unless the runtime already has it.
    pub async fn ensure_image(&self, reference: &str) -> Result<String, CriError> {
        let spec = || Some(cri::ImageSpec { image: reference.to_string(), ..Default::default() });
        let status = self.image_status(cri::ImageStatusRequest { image: spec(), verbose: false }).await?;
        if let Some(image) = status.image {
            return Ok(image.id);
        }
        let pulled = self.pull_image(cri::PullImageRequest { image: spec(), ..Default::default() }).await?;
        Ok(pulled.image_ref)
    }

    /// The runtime's name and version, and whether its RuntimeReady and NetworkReady conditions hold
    /// (with the reason of the first that does not).
    pub async fn readiness(&self) -> Result<Readiness, CriError> {
        let version = self.version(cri::VersionRequest { version: "v1".into() }).await?;
        let status = self.status(cri::StatusRequest { verbose: false }).await?;
        let mut problem = None;
        for cond in status.status.map(|s| s.conditions).unwrap_or_default() {
            if !cond.status && problem.is_none() {
                problem =
                    Some(format!("{} is false: {} {}", cond.r#type, cond.reason, cond.message).trim().to_string());
            }
        }
        Ok(Readiness {
            runtime: format!("{}://{}", version.runtime_name, version.runtime_version),
            api_version: version.runtime_api_version,
            problem,
        })
    }
}

/// What `Cri::readiness` found.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// e.g. `containerd://1.6.20`, as nodeInfo.containerRuntimeVersion shows it.
    pub runtime: String,
    pub api_version: String,
    /// `None` when RuntimeReady and NetworkReady both hold.
    pub problem: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(socket_path("/run/x.sock").unwrap(), Path::new("/run/x.sock"));
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
        assert!(socket_path("relative.sock").is_err());
    }

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let cri = Cri::new(&dir.path().join("none.sock"));
        let err = cri.version(cri::VersionRequest::default()).await.unwrap_err();
        assert!(matches!(err, CriError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("none.sock"), "{err}");
    }
}
