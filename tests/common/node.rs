//! A cairn server running its node agent, for the end-to-end tests of pods (include with
//! `#[path = "common/node.rs"] mod node;` beside `common`, `busybox` and `cri`).

#![allow(dead_code)]

use std::time::Duration;

use serde_json::Value;

use super::busybox::busybox_image;
use super::common::Server;
use super::cri;

/// A cairn server with the agent, its images directory holding the busybox image. Dropping it
/// removes every pod sandbox (even after a failed check) and stops cairn and its containerd.
pub struct Node {
    server: Option<Server>,
    cidr: &'static str,
}

impl Node {
    pub fn start(cidr: &'static str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("data/agent/images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("busybox.tar"), busybox_image()).unwrap();
        Node { server: Some(Server::start_with(dir, &["--disable-agent=false", "--cluster-cidr", cidr])), cidr }
    }

    /// Kills cairn with SIGKILL (containerd and the containers stay) and starts it on the same data.
    pub fn restart_after_kill9(&mut self) {
        let dir = self.server.take().expect("running").kill9();
        self.server = Some(Server::start_with(dir, &["--disable-agent=false", "--cluster-cidr", self.cidr]));
    }
}

impl std::ops::Deref for Node {
    type Target = Server;
    fn deref(&self) -> &Server {
        self.server.as_ref().expect("running")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let Some(server) = self.server.take() else { return };
        // Pods first, or the agent would make new sandboxes for them.
        let _ = server.kubectl(&["delete", "pods", "--all", "--force", "--grace-period", "0", "--wait=false"]);
        let socket = server.dir.path().join("data/agent/containerd/containerd.sock");
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(async {
                let cri = cri::Cri::new(&socket);
                for _ in 0..20 {
                    let pods = cri.list_pod_sandbox(Default::default()).await.map(|r| r.items).unwrap_or_default();
                    if pods.is_empty() {
                        break;
                    }
                    for pod in pods {
                        let id = pod.id;
                        let _ = cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await;
                        let _ = cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id }).await;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            });
        }
        let _ = server.terminate(Duration::from_secs(30));
    }
}

/// Whether the node reports Ready.
pub fn node_ready(node: &Server) -> Option<()> {
    let nodes: Value = serde_json::from_str(&node.ok(&["get", "nodes", "-o", "json"])).ok()?;
    nodes["items"][0]["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
        .then_some(())
}
