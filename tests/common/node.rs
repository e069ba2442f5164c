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
    /// The flags it runs with (again after a restart).
    args: Vec<String>,
}

impl Node {
    pub fn start(cidr: &'static str) -> Node {
        Self::start_with(cidr, &[])
    }

    /// With more flags.
    pub fn start_with(cidr: &str, extra: &[&str]) -> Node {
        Self::start_in(tempfile::tempdir().unwrap(), cidr, extra)
    }

    /// In a directory the test prepared (its data directory is `dir/data`).
    pub fn start_in(dir: tempfile::TempDir, cidr: &str, extra: &[&str]) -> Node {
        let images = dir.path().join("data/agent/images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("busybox.tar"), busybox_image()).unwrap();
        let mut args: Vec<String> = ["--disable-agent=false", "--cluster-cidr", cidr].map(String::from).to_vec();
        // The service proxy and the cluster DNS own host-wide state (one nftables table, the cluster
        // DNS address): only the test of Services traffic, which runs one node, asks for them.
        if !extra.iter().any(|a| a.starts_with("--disable-kube-proxy")) {
            args.extend(["--disable-kube-proxy", "--disable=coredns"].map(String::from));
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let server = Server::start_with(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
        Node { server: Some(server), args }
    }

    /// Kills cairn with SIGKILL (containerd and the containers stay) and starts it on the same data.
    pub fn restart_after_kill9(&mut self) {
        let dir = self.kill9_keep();
        self.start_again(dir);
    }

    /// Kills cairn with SIGKILL and keeps its data for [`Node::start_again`] (checks in between).
    pub fn kill9_keep(&mut self) -> tempfile::TempDir {
        self.server.take().expect("running").kill9()
    }

    /// Starts cairn again on the data [`Node::kill9_keep`] kept.
    pub fn start_again(&mut self, dir: tempfile::TempDir) {
        self.server = Some(Server::start_with(dir, &self.args.iter().map(String::as_str).collect::<Vec<_>>()));
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
        // Workloads, then pods, or their controllers and the agent would make new ones.
        let _ = server.kubectl(&[
            "delete",
            "deployments,replicasets,statefulsets,daemonsets,jobs",
            "--all",
            "--wait=false",
        ]);
        let _ = server.kubectl(&["delete", "pods", "--all", "--force", "--grace-period", "0", "--wait=false"]);
        remove_sandboxes(&server.dir.path().join("data/agent/containerd/containerd.sock"));
        let (dir, _) = server.terminate(Duration::from_secs(30));
        super::common::remove_cgroups(&dir);
        unmount_below(dir.path());
    }
}

/// Unmounts what a stopped node left mounted under `dir` (the volumes of pods removed with it),
/// deepest first, so that the directory can be removed.
pub fn unmount_below(dir: &std::path::Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| std::path::Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Stops and removes every pod sandbox of the containerd at `socket` (its containers go with them).
pub fn remove_sandboxes(socket: &std::path::Path) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    rt.block_on(async {
        let cri = cri::Cri::new(socket);
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

/// One HTTPS request to 127.0.0.1:`port`, verified against the cluster CA, with the client
/// certificate `client` of the server's TLS directory (none when `None`): its status and body.
pub fn https_request(
    node: &Server,
    port: u16,
    method: &str,
    path: &str,
    client: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    use http_body_util::BodyExt as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let tls = node.dir.path().join("data/server/tls");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(tls.join("server-ca.crt")).unwrap()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(name) => {
            let cert = CertificateDer::from_pem_file(tls.join(format!("{name}.crt"))).unwrap();
            let key = PrivateKeyDer::from_pem_file(tls.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(vec![cert], key).unwrap()
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder().method(method).uri(path).header("host", format!("127.0.0.1:{port}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (code, String::from_utf8_lossy(&body).trim().to_string())
    })
}
