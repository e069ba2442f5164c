//! `cairn server`: the composition root. Flags become one [`ServerConfig`], validated before anything
//! starts; then store, PKI, registry, API and controllers start in order under one cancellation token.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result, bail};
use tokio_util::sync::CancellationToken;

use crate::agent;
use crate::api::{self, AppState, Tokens, User, pki};
use crate::client;
use crate::controllers;
use crate::registry::{self, Registry};
use crate::runtime;
use crate::scheduler;
use crate::store::{self, Store};

/// Everything `cairn server` needs, after flags and the config file are merged.
#[derive(Debug)]
pub struct ServerConfig {
    /// The node's container runtime and agent; `None` when the agent is disabled.
    pub runtime: Option<runtime::Config>,
    /// `--system-reserved` plus `--kube-reserved`.
    pub reserved: agent::node::Reserved,
    /// The agent's `/healthz` port on 127.0.0.1 (0: none).
    pub healthz_port: u16,
    /// The node endpoint's port (0: any free one).
    pub kubelet_port: u16,
    /// The scheduler's configuration; `None` when it is disabled.
    pub scheduler: Option<scheduler::Config>,
    pub data_dir: PathBuf,
    pub bind_address: IpAddr,
    pub https_listen_port: u16,
    pub write_kubeconfig: PathBuf,
    pub write_kubeconfig_mode: u32,
    pub tls_san: Vec<String>,
    pub token: Option<String>,
    pub node_name: String,
    pub store_cache_mib: u64,
    /// `--device RESOURCE=GLOB` flags.
    pub devices: Vec<crate::devices::generic::DeviceGlob>,
    /// The NVIDIA GPUs found at start.
    pub gpus: Option<crate::devices::nvidia::Gpus>,
    pub services: ServicesConfig,
    /// `--kubelet-root-dir`: plugin registration and CSI staging.
    pub kubelet_root_dir: PathBuf,
    /// `--cgroup-root`: the cgroup the agent's `kubepods` goes under.
    pub cgroup_root: String,
    /// `--node-monitor-grace-period`.
    pub node_monitor_grace_period: std::time::Duration,
    /// `--cluster-cidr` when it is IPv4: the pod ranges Nodes are given.
    pub cluster_cidr: Option<crate::net::Cidr>,
    /// `--default-local-storage-path`: the built-in driver's volumes.
    pub local_storage_path: PathBuf,
}

/// How Services are served: their ranges, the cluster DNS and which built-in parts run.
#[derive(Debug, Clone)]
pub struct ServicesConfig {
    /// `--service-cidr` and `--service-node-port-range`.
    pub ranges: registry::ServiceRanges,
    /// `--cluster-dns`, `--cluster-domain`, `--resolv-conf`.
    pub cluster_dns: std::net::Ipv4Addr,
    pub cluster_domain: String,
    pub resolv_conf: Option<PathBuf>,
    /// The cluster DNS (`--disable coredns` turns it off).
    pub dns: bool,
    /// The built-in load balancer (`--disable servicelb`).
    pub servicelb: bool,
    /// The service proxy (`--disable-kube-proxy`).
    pub proxy: bool,
}

impl ServerConfig {
    fn db_dir(&self) -> PathBuf {
        self.data_dir.join("server").join("db")
    }
    fn tls_dir(&self) -> PathBuf {
        self.data_dir.join("server").join("tls")
    }
    fn token_file(&self) -> PathBuf {
        self.data_dir.join("server").join("token")
    }
}

/// Parses a `--write-kubeconfig-mode` value such as `0644` or `644` (octal, as k3s).
pub fn parse_mode(s: &str) -> Result<u32> {
    let digits = s.trim_start_matches("0o");
    let mode = u32::from_str_radix(digits, 8)
        .with_context(|| format!("invalid write-kubeconfig-mode {s:?}: expected octal such as 0600"))?;
    if mode > 0o777 {
        bail!("invalid write-kubeconfig-mode {s:?}: at most 0777");
    }
    Ok(mode)
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(cfg: ServerConfig) -> Result<()> {
    let shutdown = CancellationToken::new();
    let ready = start(cfg, shutdown.clone()).await?;
    tracing::info!("cairn is ready: API at {}, kubeconfig at {}", ready.url, ready.kubeconfig.display());
    wait_for_signal().await;
    tracing::info!("shutting down");
    shutdown.cancel();
    ready.done.await.ok();
    Ok(())
}

/// A started server.
pub struct Started {
    pub url: String,
    pub kubeconfig: PathBuf,
    /// Resolves when the API has stopped serving.
    pub done: tokio::task::JoinHandle<()>,
}

/// Starts every component; returns once the API answers and the kubeconfig is written.
pub async fn start(cfg: ServerConfig, shutdown: CancellationToken) -> Result<Started> {
    // The runtime (containerd, images, pod network) starts beside the control plane. Its task ends
    // once the runtime has stopped again; `ready` says whether it came up.
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let runtime = cfg.runtime.clone().map(|rc| {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            match runtime::start(&rc, stop).await {
                Ok(rt) => {
                    let _ = ready_tx.send(Ok(rt.cri));
                    let _ = rt.done.await;
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
    });
    match start_control_plane(cfg, shutdown.clone(), runtime.is_some().then_some(ready)).await {
        Ok(mut started) => {
            if let Some(runtime) = runtime {
                let api = started.done;
                started.done = tokio::spawn(async move {
                    let _ = api.await;
                    let _ = runtime.await;
                });
            }
            Ok(started)
        }
        Err(e) => {
            // Whatever failed, containerd must not outlive a server that never started.
            shutdown.cancel();
            if let Some(runtime) = runtime {
                let _ = runtime.await;
            }
            Err(e)
        }
    }
}

async fn start_control_plane(
    cfg: ServerConfig,
    shutdown: CancellationToken,
    runtime_ready: Option<tokio::sync::oneshot::Receiver<Result<runtime::Cri>>>,
) -> Result<Started> {
    std::fs::create_dir_all(cfg.data_dir.join("server"))
        .with_context(|| format!("creating the data directory {}", cfg.data_dir.display()))?;

    let store =
        Store::open(&cfg.db_dir(), store::Options { cache_bytes: cfg.store_cache_mib << 20, ..Default::default() })
            .with_context(|| format!("opening the store in {}", cfg.db_dir().display()))?;
    tracing::info!("store opened at revision {}", store.revision());

    let hostname = hostname::get().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into());
    let bridge = cfg.runtime.as_ref().map(|rc| rc.network().bridge);
    let mut node_ips = local_ips(bridge.as_deref());
    if !cfg.bind_address.is_unspecified() && !node_ips.contains(&cfg.bind_address) {
        node_ips.push(cfg.bind_address);
    }
    let pki = Arc::new(
        pki::Pki::load_or_create(&cfg.tls_dir(), &hostname, &node_ips, &cfg.tls_san)
            .context("preparing TLS certificates")?,
    );
    let tls = pki.server_config().context("building the TLS configuration")?;

    let secret = match &cfg.token {
        Some(t) => {
            let token = pki::JoinToken::parse(t).map_err(|e| anyhow::anyhow!("invalid --token: {e}"))?;
            let ours = pki::ca_hash(pki.ca_pem());
            if let Some(hash) = token.ca_hash.filter(|h| *h != ours) {
                bail!(
                    "the --token pins the CA {hash}, but this server's CA is {ours}: the token belongs to another server"
                );
            }
            token.secret
        }
        None => load_or_create_secret(&cfg.token_file())?,
    };
    // The file always holds the full token, pinning this server's CA (k3s's `server/token`).
    let full = pki::JoinToken::full(pki.ca_pem(), &secret);
    write_token(&cfg.token_file(), &full)?;
    let mut tokens = Tokens::default();
    let node = User { name: "cairn:node".into(), groups: vec!["system:masters".into(), "system:nodes".into()] };
    tokens.add(secret, node.clone());
    tokens.add(full, node);

    let registry = Registry::new(store).with_service_ranges(cfg.services.ranges);
    registry::bootstrap::system_namespaces(&registry).await.context("creating the system namespaces")?;
    registry::bootstrap::local_storage(&registry, &cfg.data_dir.join("server"))
        .await
        .context("creating the local-path StorageClass")?;

    let addr = SocketAddr::new(cfg.bind_address, cfg.https_listen_port);
    let listener = api::bind(addr).await?;
    let local = listener.local_addr().context("reading the listening address")?;
    let advertised = if cfg.bind_address.is_unspecified() {
        SocketAddr::new(node_ips.first().copied().unwrap_or(IpAddr::from([127, 0, 0, 1])), local.port())
    } else {
        local
    };
    registry::bootstrap::kubernetes_service(&registry, advertised).await.context("creating the kubernetes Service")?;
    if cfg.services.dns {
        registry::bootstrap::kube_dns_service(&registry, cfg.services.cluster_dns)
            .await
            .context("creating the kube-dns Service")?;
    }
    registry.spawn_service_repair(shutdown.clone());
    let state = Arc::new(AppState::new(registry.clone(), tokens, advertised.to_string()));
    let _ = state.node_client.set(api::node_client::NodeClient::new(pki.clone()));
    let _ = state.cacerts.set(pki.ca_pem().to_string());
    let app = api::router(state.clone());
    if let Some(config) = &cfg.scheduler {
        let client = client::in_process(app.clone(), client::scheduler());
        scheduler::Scheduler::start(client, config, &cfg.node_name, shutdown.clone())?;
    }
    let done = tokio::spawn(api::serve(listener, tls, app.clone(), shutdown.clone()));
    if let (Some(ready), Some(rc)) = (runtime_ready, &cfg.runtime) {
        let cri = match ready.await {
            Ok(Ok(cri)) => cri,
            Ok(Err(e)) => return Err(e.context("starting the container runtime")),
            Err(_) => bail!("the container runtime's start-up task ended without an answer"),
        };
        tracing::info!("node {}: the container runtime and pod network are ready", cfg.node_name);
        let mut endpoint = node_endpoint(&cfg, &pki).await;
        if let Some(e) = endpoint.as_mut() {
            // The API calls this process's node endpoint in memory.
            let state = state.clone();
            e.local = Some(Box::new(move |router| {
                if let Some(nodes) = state.node_client.get() {
                    nodes.set_local_endpoint(router);
                }
            }));
        }
        let kubelet_port = endpoint.as_ref().and_then(|e| e.listener.local_addr().ok()).map_or(0, |a| a.port());
        if let Some(nodes) = state.node_client.get() {
            nodes.set_local_node(&cfg.node_name);
        }
        let agent = agent::Config {
            node_name: cfg.node_name.clone(),
            data_dir: cfg.data_dir.clone(),
            node_ip: node_ips.first().copied(),
            pod_cidr: rc.network().subnet,
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
                servers: if cfg.services.dns { vec![cfg.services.cluster_dns.to_string()] } else { Vec::new() },
                domain: cfg.services.cluster_domain.clone(),
                resolv_conf: cfg.services.resolv_conf.clone(),
            },
            cgroup_root: cfg.cgroup_root.clone(),
        };
        if cfg.services.dns {
            start_cluster_dns(&cfg.services, client::in_process(app.clone(), client::proxy()), &shutdown)
                .await
                .context("starting the cluster DNS")?;
        }
        let client = client::in_process(app.clone(), client::node(&cfg.node_name));
        agent::start(client, cri, agent, endpoint, shutdown.clone());
        if cfg.services.proxy {
            let proxy = crate::proxy::Config::new(&cfg.node_name, node_ips.clone(), rc.network().cluster_cidr);
            let client = client::in_process(app.clone(), client::proxy());
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::proxy::run(client, proxy, stop).await {
                    tracing::error!("the service proxy stopped: {e:#}");
                }
            });
        }
    }

    let url = format!("https://127.0.0.1:{}", local.port());
    pki::write_kubeconfig(&cfg.write_kubeconfig, cfg.write_kubeconfig_mode, &url, &pki)
        .with_context(|| format!("writing the kubeconfig {}", cfg.write_kubeconfig.display()))?;

    let controller_client = client::in_process(app, client::controller_manager());
    let options = controllers::Options {
        servicelb: cfg.services.servicelb,
        node_monitor_grace_period: cfg.node_monitor_grace_period,
        cluster_cidr: cfg.cluster_cidr,
        reserved_pod_ranges: cfg.runtime.iter().map(|rc| rc.network().subnet).collect(),
    };
    controllers::spawn_all(&controller_client, &options, &shutdown);
    let kubeconfig = cfg.write_kubeconfig.clone();
    let renew_url = url.clone();
    let handle = pki.clone().spawn_renewal(pki::RENEWAL_CHECK_INTERVAL, move |p| {
        if let Err(e) = pki::write_kubeconfig(&kubeconfig, cfg.write_kubeconfig_mode, &renew_url, p) {
            tracing::error!("rewriting the kubeconfig after certificate renewal failed: {e}");
        }
    });
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        handle.abort();
    });
    state.ready.store(true, Ordering::Release);
    Ok(Started { url, kubeconfig: cfg.write_kubeconfig, done })
}

/// Binds the node endpoint (`--kubelet-port` on the bind address). A port another process holds
/// costs only what goes through the endpoint (`kubectl logs`), with a warning, as with `/healthz`.
async fn node_endpoint(cfg: &ServerConfig, pki: &pki::Pki) -> Option<agent::endpoint::Listener> {
    let addr = SocketAddr::new(cfg.bind_address, cfg.kubelet_port);
    let tls = match pki.kubelet_server_config() {
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

/// The join token's secret: the one in the token file (full or bare), or a new one on first start.
fn load_or_create_secret(path: &Path) -> Result<String> {
    if let Ok(token) = std::fs::read_to_string(path).map_err(drop).and_then(|t| pki::JoinToken::parse(&t).map_err(drop))
    {
        return Ok(token.secret);
    }
    use rand::Rng as _;
    let secret: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(48).map(char::from).collect();
    tracing::info!("created the join token at {}", path.display());
    Ok(secret)
}

/// Writes the token file (0600, atomically) unless it already holds `token`.
fn write_token(path: &Path, token: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|t| t.trim() == token) {
        return Ok(());
    }
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{token}").and_then(|_| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", path.display()))
}

/// Addresses of this machine worth putting in the serving certificate.
/// Binds the cluster DNS on its address, which the loopback link holds (pods reach it through their
/// default route, with no proxy rule: NodeLocal DNSCache's way), and serves it until `shutdown`.
/// The `kube-dns` Service at that address opts out of the service proxy. The address stays when
/// cairn stops, as the proxy's rules do.
async fn start_cluster_dns(cfg: &ServicesConfig, client: kube::Client, shutdown: &CancellationToken) -> Result<()> {
    let handle = crate::net::netlink()?;
    crate::net::ensure_loopback_address(&handle, cfg.cluster_dns).await?;
    let mut dns = crate::dns::Config::new(vec![SocketAddr::from((cfg.cluster_dns, 53))], &cfg.cluster_domain);
    if let Some(path) = &cfg.resolv_conf {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading --resolv-conf {}", path.display()))?;
        dns.upstreams =
            crate::dns::resolv::upstreams_in(&crate::dns::resolv::ResolvConf::parse(&text), cfg.cluster_dns);
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
fn local_ips(pod_bridge: Option<&str>) -> Vec<IpAddr> {
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert_eq!(parse_mode("600").unwrap(), 0o600);
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("rw").is_err());
    }
}
