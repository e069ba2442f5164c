//! What runs on every node once its container runtime is up, the same in `cairn server` and a
//! joined `cairn agent`: the node agent (kubelet's job) with its endpoint, the cluster DNS, the
//! service proxy, and the routes to the other nodes' pods.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::agent;
use crate::api::join::ClusterConfig;
use crate::net::Cidr;
use crate::runtime;

/// A node's own settings (its flags), beside what it learns from the cluster.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_name: String,
    pub data_dir: PathBuf,
    /// `--node-ip`, else the host's first address.
    pub node_ips: Vec<IpAddr>,
    pub runtime: runtime::Config,
    /// `--system-reserved` plus `--kube-reserved`.
    pub reserved: agent::node::Reserved,
    /// The agent's `/healthz` port on 127.0.0.1 (0: none).
    pub healthz_port: u16,
    /// The node endpoint's port (0: any free one).
    pub kubelet_port: u16,
    /// `--device RESOURCE=GLOB` flags.
    pub devices: Vec<crate::devices::generic::DeviceGlob>,
    /// The NVIDIA GPUs found at start.
    pub gpus: Option<crate::devices::nvidia::Gpus>,
    /// `--kubelet-root-dir`: plugin registration and CSI staging.
    pub kubelet_root_dir: PathBuf,
    /// `--cgroup-root`: the cgroup the agent's `kubepods` goes under.
    pub cgroup_root: String,
    /// `--default-local-storage-path`: the built-in driver's volumes.
    pub local_storage_path: PathBuf,
    /// `--resolv-conf`.
    pub resolv_conf: Option<PathBuf>,
    /// Whether this node runs the control plane (its Node is labelled so).
    pub control_plane: bool,
    /// `--pod-manifest-path`: the static pods' manifests.
    pub pod_manifest_path: PathBuf,
    /// `--image-gc-*`: when unused images are removed.
    pub image_gc: agent::image_gc::Policy,
    /// `--eviction-*`: when pods are evicted to keep the node up.
    pub eviction: agent::eviction::Config,
}

/// The clients the node's parts act through: the agent as the node (`system:node:<name>`), the
/// rest as the node's controllers (`system:cairn-controller`).
pub struct Clients {
    pub agent: kube::Client,
    pub controller: kube::Client,
}

/// Starts the agent, the cluster DNS, the service proxy and the pod routes on a node whose runtime
/// is up (`cri`) and whose pod range is `pod_cidr`; they run until `shutdown`.
pub async fn start(
    cfg: &NodeConfig,
    cluster: &ClusterConfig,
    pod_cidr: Cidr,
    cri: runtime::Cri,
    clients: Clients,
    endpoint: Option<agent::endpoint::Listener>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let kubelet_port = endpoint.as_ref().and_then(|e| e.listener.local_addr().ok()).map_or(0, |a| a.port());
    let agent = agent::Config {
        node_name: cfg.node_name.clone(),
        data_dir: cfg.data_dir.clone(),
        node_ip: cfg.node_ips.first().copied(),
        pod_cidr,
        reserved: cfg.reserved.clone(),
        healthz_port: cfg.healthz_port,
        kubelet_port,
        storage: crate::csi::NodeStorage {
            kubelet_root_dir: cfg.kubelet_root_dir.clone(),
            local_storage_path: cfg.local_storage_path.clone(),
            agent_dir: cfg.data_dir.join("agent"),
        },
        devices: cfg.devices.clone(),
        gpus: cfg.gpus.clone(),
        // Without the cluster DNS, ClusterFirst pods get the host's resolvers, as kubelet
        // without --cluster-dns.
        cluster_dns: agent::dns::ClusterDns {
            servers: if cluster.dns { vec![cluster.cluster_dns.to_string()] } else { Vec::new() },
            domain: cluster.cluster_domain.clone(),
            resolv_conf: cfg.resolv_conf.clone(),
        },
        cgroup_root: cfg.cgroup_root.clone(),
        control_plane: cfg.control_plane,
        pod_manifest_path: cfg.pod_manifest_path.clone(),
        image_gc: cfg.image_gc.clone(),
        eviction: cfg.eviction.clone(),
    };
    if cluster.dns {
        start_cluster_dns(cluster, cfg.resolv_conf.as_deref(), clients.controller.clone(), shutdown)
            .await
            .context("starting the cluster DNS")?;
    }
    agent::start(clients.agent, clients.controller.clone(), cri, agent, endpoint, shutdown.clone());
    let stop = shutdown.clone();
    let routes_client = clients.controller.clone();
    let me = crate::net::routes::Me {
        name: cfg.node_name.clone(),
        pods: pod_cidr,
        ip: cfg.node_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        }),
    };
    let backend = cluster.flannel_backend;
    tokio::spawn(async move {
        if let Err(e) = crate::net::routes::run(routes_client, me, backend, stop).await {
            tracing::error!("the routes to other nodes' pods stopped: {e:#}");
        }
    });
    if cluster.proxy {
        let proxy = crate::proxy::Config::new(&cfg.node_name, cfg.node_ips.clone(), cluster.cluster_cidr);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::proxy::run(clients.controller, proxy, stop).await {
                tracing::error!("the service proxy stopped: {e:#}");
            }
        });
    }
    Ok(())
}

/// Binds the node endpoint (`--kubelet-port` on `address`) with `tls`. A port another process
/// holds costs only what goes through the endpoint (`kubectl logs`), with a warning, as with
/// `/healthz`.
pub async fn bind_endpoint(
    address: IpAddr,
    port: u16,
    tls: Result<Arc<rustls::ServerConfig>, impl std::fmt::Display>,
) -> Option<agent::endpoint::Listener> {
    let addr = SocketAddr::new(address, port);
    let tls = match tls {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("node endpoint: {e}; pod logs are not served");
            return None;
        }
    };
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => Some(agent::endpoint::Listener { listener, tls, local: None }),
        Err(e) => {
            tracing::warn!("node endpoint: cannot listen on {addr}: {e}; pod logs are not served (see --kubelet-port)");
            None
        }
    }
}

/// Binds the cluster DNS on its address, which the loopback link holds (pods reach it through their
/// default route, with no proxy rule: NodeLocal DNSCache's way), and serves it until `shutdown`.
/// The `kube-dns` Service at that address opts out of the service proxy. The address stays when
/// cairn stops, as the proxy's rules do.
async fn start_cluster_dns(
    cluster: &ClusterConfig,
    resolv_conf: Option<&std::path::Path>,
    client: kube::Client,
    shutdown: &CancellationToken,
) -> Result<()> {
    let handle = crate::net::netlink()?;
    crate::net::ensure_loopback_address(&handle, cluster.cluster_dns).await?;
    let mut dns = crate::dns::Config::new(vec![SocketAddr::from((cluster.cluster_dns, 53))], &cluster.cluster_domain);
    if let Some(path) = resolv_conf {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading --resolv-conf {}", path.display()))?;
        dns.upstreams =
            crate::dns::resolv::upstreams_in(&crate::dns::resolv::ResolvConf::parse(&text), cluster.cluster_dns);
    }
    let listeners = crate::dns::server::Listeners::bind(&dns.listen).await?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::dns::run(client, dns, listeners, stop).await {
            tracing::error!("the cluster DNS stopped: {e:#}");
        }
    });
    Ok(())
}

/// The host's addresses: not the loopback link's (which holds the cluster DNS address too), nor
/// the pod bridge's (pod gateways, which the network sets up after this is read).
pub fn local_ips(pod_bridge: Option<&str>) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.name != "lo" && Some(i.name.as_str()) != pod_bridge)
        .map(|i| i.ip())
        .filter(|ip| !ip.is_loopback() && !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .collect();
    ips.dedup();
    ips
}
