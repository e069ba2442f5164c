//! containerd's task service, for what CRI does not offer: the exec processes running in a
//! container, and killing one. A streaming exec whose client went away leaves its process running
//! (containerd's CRI never kills it, and kubelet has no call to), so the node endpoint ends it.

use std::path::Path;
use std::time::Duration;

use containerd_client::services::v1 as api;
use containerd_client::services::v1::tasks_client::TasksClient;
use tonic::transport::Channel;

use super::images::NAMESPACE;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// runc's `ProcessDetails` (`containerd.runc.v1`): the `info` ListPids gives an exec process.
#[derive(Clone, PartialEq, prost::Message)]
struct ProcessDetails {
    #[prost(string, tag = "1")]
    exec_id: String,
}

/// One exec process of a container: containerd's exec ID and its host PID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecProcess {
    pub exec_id: String,
    pub pid: u32,
}

/// A client of containerd's task service. Cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    client: TasksClient<Channel>,
}

impl Tasks {
    pub fn new(socket: &Path) -> Self {
        Tasks { client: TasksClient::new(super::cri::channel(socket)) }
    }

    fn request<T>(msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.metadata_mut().insert("containerd-namespace", tonic::metadata::MetadataValue::from_static(NAMESPACE));
        req.set_timeout(CALL_TIMEOUT);
        req
    }

    /// The exec processes running in `container_id` (its init process and that one's children
    /// are not among them).
    pub async fn exec_processes(&self, container_id: &str) -> Result<Vec<ExecProcess>, tonic::Status> {
        let req = Self::request(api::ListPidsRequest { container_id: container_id.into() });
        let processes = self.client.clone().list_pids(req).await?.into_inner().processes;
        Ok(processes
            .into_iter()
            .filter_map(|p| {
                let info = p.info?;
                let details: ProcessDetails = prost::Message::decode(info.value.as_slice()).ok()?;
                (!details.exec_id.is_empty()).then_some(ExecProcess { exec_id: details.exec_id, pid: p.pid })
            })
            .collect())
    }

    /// SIGKILL to one exec process.
    pub async fn kill_exec(&self, container_id: &str, exec_id: &str) -> Result<(), tonic::Status> {
        let req = Self::request(api::KillRequest {
            container_id: container_id.into(),
            exec_id: exec_id.into(),
            signal: libc::SIGKILL as u32,
            all: false,
        });
        self.client.clone().kill(req).await.map(|_| ())
    }
}
