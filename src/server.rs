//! `cairn server`: the composition root. Flags become one [`ServerConfig`], validated before anything
//! starts; then store, PKI, registry, API and controllers start in order under one cancellation token.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result, bail};
use tokio_util::sync::CancellationToken;

use crate::api::join::ClusterConfig;
use crate::api::{self, AppState, Tokens, User, pki};
use crate::client;
use crate::controllers;
use crate::node;
use crate::registry::{self, Registry};
use crate::runtime;
use crate::scheduler;
use crate::store::{self, Store};

/// Everything `cairn server` needs, after flags and the config file are merged.
#[derive(Debug)]
pub struct ServerConfig {
    /// This server's own node (runtime and agent); `None` when the agent is disabled.
    pub node: Option<node::NodeConfig>,
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
    pub services: ServicesConfig,
    /// `--node-monitor-grace-period`.
    pub node_monitor_grace_period: std::time::Duration,
    /// `--cluster-cidr` when it is IPv4: the pod ranges Nodes are given.
    pub cluster_cidr: Option<crate::net::Cidr>,
    /// `--flannel-backend`.
    pub flannel_backend: crate::net::routes::Backend,
    /// `--authorization-mode`.
    pub authorization: api::authz::Modes,
    /// `--service-account-issuer`.
    pub service_account_issuer: String,
    /// `--datastore-endpoint` and its TLS files: etcd instead of the embedded store.
    pub datastore: Option<store::etcd::Config>,
    /// `--server`: a server whose datastore this one shares, when `datastore` is not given.
    pub join: Option<JoinServer>,
    /// `--api-audiences` and the service account token lifetimes.
    pub token_policy: registry::token_request::TokenPolicy,
}

/// A server to join (`--server`), and how this server reaches the etcd it learns there (its own
/// TLS files; the endpoints come from that server).
#[derive(Debug)]
pub struct JoinServer {
    pub url: String,
    pub datastore: store::etcd::Config,
}

/// How Services are served: their ranges, the cluster DNS and which built-in parts run.
#[derive(Debug, Clone)]
pub struct ServicesConfig {
    /// `--service-cidr` and `--service-node-port-range`.
    pub ranges: registry::ServiceRanges,
    /// `--cluster-dns`, `--cluster-domain`.
    pub cluster_dns: std::net::Ipv4Addr,
    pub cluster_domain: String,
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
    /// What every node learns of the cluster (a pod network needs an IPv4 cluster CIDR).
    fn cluster(&self) -> Option<ClusterConfig> {
        Some(ClusterConfig {
            cluster_cidr: self.cluster_cidr?,
            cluster_dns: self.services.cluster_dns,
            cluster_domain: self.services.cluster_domain.clone(),
            dns: self.services.dns,
            proxy: self.services.proxy,
            flannel_backend: self.flannel_backend,
        })
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
    crate::memory::release_startup_code_later(shutdown.clone());
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
    let runtime = cfg.node.as_ref().map(|n| n.runtime.clone()).map(|rc| {
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
    mut cfg: ServerConfig,
    shutdown: CancellationToken,
    runtime_ready: Option<tokio::sync::oneshot::Receiver<Result<runtime::Cri>>>,
) -> Result<Started> {
    std::fs::create_dir_all(cfg.data_dir.join("server"))
        .with_context(|| format!("creating the data directory {}", cfg.data_dir.display()))?;

    if let (Some(join), None) = (&cfg.join, &cfg.datastore) {
        let endpoints = tokio::select! {
            found = datastore_of(&join.url, cfg.token.as_deref().unwrap_or_default()) => found?,
            () = shutdown.cancelled() => bail!("stopped while asking {} how to join it", join.url),
        };
        let endpoints = store::etcd::Config::parse_endpoints(&endpoints).map_err(anyhow::Error::msg)?;
        cfg.datastore = Some(store::etcd::Config { endpoints, ..join.datastore.clone() });
    }
    let options = store::Options {
        cache_bytes: cfg.store_cache_mib << 20,
        expiring: vec![("events/".into(), controllers::EVENT_TTL)],
        deferred: registry::deferred_keys(),
        ..Default::default()
    };
    let store = match &cfg.datastore {
        None => Store::open(&cfg.db_dir(), options)
            .with_context(|| format!("opening the store in {}", cfg.db_dir().display()))?,
        Some(etcd) => {
            tracing::info!("connecting to etcd at {}", etcd.endpoints.join(","));
            tokio::select! {
                store = Store::open_etcd(etcd.clone(), options) => store.context("opening the etcd datastore")?,
                () = shutdown.cancelled() => anyhow::bail!("stopped while waiting for etcd"),
            }
        }
    };
    tracing::info!("store opened at revision {}", store.revision());

    let hostname = hostname::get().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into());
    let mut node_ips = cfg.node.as_ref().map_or_else(|| node::local_ips(None), |n| n.node_ips.clone());
    if !cfg.bind_address.is_unspecified() && !node_ips.contains(&cfg.bind_address) {
        node_ips.push(cfg.bind_address);
    }
    // In-cluster clients reach the API at the `kubernetes` Service's address and check it.
    let mut sans = cfg.tls_san.clone();
    sans.push(cfg.services.ranges.nth_ip(1).to_string());
    let token = match &cfg.token {
        Some(t) => Some(pki::JoinToken::parse(t).map_err(|e| anyhow::anyhow!("invalid --token: {e}"))?),
        None => None,
    };
    let secret = match &token {
        Some(token) => token.secret.clone(),
        None => load_or_create_secret(&cfg.token_file())?,
    };
    let (pki, issuer) = load_keys(&cfg, &store, &secret, &hostname, &node_ips, &sans).await?;
    let tls = pki.server_config().context("building the TLS configuration")?;
    let ours = pki::ca_hash(pki.ca_pem());
    if let Some(hash) = token.and_then(|t| t.ca_hash).filter(|h| *h != ours) {
        bail!("the --token pins the CA {hash}, but this server's CA is {ours}: the token belongs to another server");
    }
    // The file always holds the full token, pinning this server's CA (k3s's `server/token`).
    let full = pki::JoinToken::full(pki.ca_pem(), &secret);
    write_token(&cfg.token_file(), &full)?;
    let mut tokens = Tokens::default();
    let node = User::new("cairn:node", vec!["system:masters".into(), "system:nodes".into()]);
    tokens.add(secret, node.clone());
    tokens.add(full, node);

    let registry = Registry::new(store).with_service_ranges(cfg.services.ranges);
    registry::bootstrap::system_namespaces(&registry).await.context("creating the system namespaces")?;
    registry::bootstrap::rbac_policy(&registry).await.context("creating the bootstrap RBAC roles and bindings")?;
    registry::bootstrap::system_priority_classes(&registry).await.context("creating the system PriorityClasses")?;
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
    // With servers sharing the store, the endpoints list every live one (see below).
    let shared = registry.store().is_shared();
    registry::bootstrap::kubernetes_service(&registry, advertised, !shared)
        .await
        .context("creating the kubernetes Service")?;
    if cfg.services.dns {
        registry::bootstrap::kube_dns_service(&registry, cfg.services.cluster_dns)
            .await
            .context("creating the kube-dns Service")?;
    }
    registry.spawn_service_repair(shutdown.clone());
    let state = Arc::new(
        AppState::new(registry.clone(), tokens, advertised.to_string()).with_authorization(cfg.authorization.clone()),
    );
    let _ = state.node_client.set(api::node_client::NodeClient::new(pki.clone()));
    let _ = state.pki.set(pki.clone());
    if let Some(etcd) = &cfg.datastore {
        let _ = state.datastore_endpoint.set(etcd.endpoints.join(","));
    }
    let _ = state.sa_tokens.set(issuer.clone());
    let app = api::router(state.clone());
    // On etcd other servers may share the cluster: the scheduler and the controllers then run where
    // they hold their Lease, as kube-scheduler's and kube-controller-manager's `--leader-elect`.
    let elect = cfg.datastore.is_some();
    if let Some(config) = cfg.scheduler.take() {
        let client = client::in_process(app.clone(), client::scheduler());
        let node_name = cfg.node_name.clone();
        if elect {
            let election = client::leader::Election::new("kube-scheduler", &cfg.node_name);
            let stop = shutdown.clone();
            tokio::spawn(client::leader::run(client.clone(), election, shutdown.clone(), move |term| {
                if let Err(e) = scheduler::Scheduler::start(client.clone(), &config, &node_name, term) {
                    tracing::error!("starting the scheduler: {e:#}");
                    stop.cancel();
                }
            }));
        } else {
            scheduler::Scheduler::start(client, &config, &node_name, shutdown.clone())?;
        }
    }
    let mut done = tokio::spawn(api::serve(listener, tls, app.clone(), shutdown.clone()));
    // The live servers of a shared datastore, which the admin kubeconfig names.
    let (live_servers, servers) = tokio::sync::watch::channel(Vec::new());
    if shared && !(advertised.ip().is_loopback() || advertised.ip().is_unspecified()) {
        let client = client::in_process(app.clone(), client::controller_manager());
        let endpoints =
            tokio::spawn(controllers::apiserverendpoints::run(client, advertised, shutdown.clone(), live_servers));
        let api = done;
        // Stopping waits for this server to leave the endpoints.
        done = tokio::spawn(async move {
            let _ = api.await;
            let _ = endpoints.await;
        });
    }
    // A clean stop takes the deferred writes (node Lease renewals) to disk once the API is done.
    let (api, store) = (done, registry.store().clone());
    done = tokio::spawn(async move {
        let _ = api.await;
        if let Err(e) = store.sync().await {
            tracing::warn!("taking the last node Lease renewals to disk failed: {e}");
        }
    });
    let cluster = cfg.cluster();
    if let Some(c) = &cluster {
        let _ = state.cluster.set(c.clone());
    }
    if let (Some(ready), Some(nc), Some(cluster)) = (runtime_ready, &cfg.node, &cluster) {
        let cri = match ready.await {
            Ok(Ok(cri)) => cri,
            Ok(Err(e)) => return Err(e.context("starting the container runtime")),
            Err(_) => bail!("the container runtime's start-up task ended without an answer"),
        };
        tracing::info!("node {}: the container runtime and pod network are ready", nc.node_name);
        let mut endpoint = node::bind_endpoint(cfg.bind_address, nc.kubelet_port, pki.kubelet_server_config()).await;
        if let Some(e) = endpoint.as_mut() {
            // The API calls this process's node endpoint in memory.
            let state = state.clone();
            e.local = Some(Box::new(move |router| {
                if let Some(nodes) = state.node_client.get() {
                    nodes.set_local_endpoint(router);
                }
            }));
        }
        if let Some(nodes) = state.node_client.get() {
            nodes.set_local_node(&nc.node_name);
        }
        let clients = node::Clients {
            agent: client::in_process(app.clone(), client::node(&nc.node_name)),
            controller: client::in_process(app.clone(), client::node_controller()),
        };
        node::start(nc, cluster, nc.runtime.network().subnet, cri, clients, endpoint, &shutdown).await?;
    }

    let url = format!("https://127.0.0.1:{}", local.port());
    let kubeconfig = AdminKubeconfig {
        path: cfg.write_kubeconfig.clone(),
        mode: cfg.write_kubeconfig_mode,
        url: url.clone(),
        advertised,
    };
    kubeconfig
        .write(&pki, &servers.borrow())
        .with_context(|| format!("writing the kubeconfig {}", cfg.write_kubeconfig.display()))?;

    let controller_client = client::in_process(app, client::controller_manager());
    let options = controllers::Options {
        servicelb: cfg.services.servicelb,
        node_monitor_grace_period: cfg.node_monitor_grace_period,
        cluster_cidr: cfg.cluster_cidr,
        reserved_pod_ranges: cfg.node.iter().map(|n| n.runtime.network().subnet).collect(),
        root_ca: pki.ca_pem().to_string(),
        sign_client: {
            let pki = pki.clone();
            Arc::new(move |request: &str, lifetime| pki.sign_client_request(request, lifetime))
        },
        mint_token: {
            let issuer = issuer.clone();
            Arc::new(move |ns: &str, name: &str, uid: &str, secret: &str| {
                let account = api::sa_token::Ref { name: name.into(), uid: uid.into() };
                issuer.issue_legacy(ns, &account, secret)
            })
        },
    };
    if elect {
        let election = client::leader::Election::new("kube-controller-manager", &cfg.node_name);
        let client = controller_client.clone();
        tokio::spawn(client::leader::run(controller_client, election, shutdown.clone(), move |term| {
            controllers::spawn_all(&client, &options, &term)
        }));
    } else {
        controllers::spawn_all(&controller_client, &options, &shutdown);
    }
    let kubeconfig = Arc::new(kubeconfig);
    let handle = pki.clone().spawn_renewal(pki::RENEWAL_CHECK_INTERVAL, {
        let (kubeconfig, servers) = (kubeconfig.clone(), servers.clone());
        move |p| {
            if let Err(e) = kubeconfig.write(p, &servers.borrow()) {
                tracing::error!("rewriting the kubeconfig after certificate renewal failed: {e}");
            }
        }
    });
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        handle.abort();
    });
    // Servers joining or leaving the cluster: the kubeconfig names the live ones.
    let mut servers = servers;
    let stop = shutdown.clone();
    let pki_now = pki.clone();
    tokio::spawn(async move {
        while tokio::select! { changed = servers.changed() => changed.is_ok(), () = stop.cancelled() => false } {
            let live = servers.borrow_and_update().clone();
            if let Err(e) = kubeconfig.write(&pki_now, &live) {
                tracing::error!("rewriting the kubeconfig with the cluster's servers failed: {e}");
            }
        }
    });
    state.ready.store(true, Ordering::Release);
    Ok(Started { url, kubeconfig: cfg.write_kubeconfig, done })
}

/// The admin kubeconfig this server writes: itself as `default` (on loopback), and on a shared
/// datastore every other live server by its address, so `kubectl --context 10.0.0.2:6443` reaches
/// another server when this one is gone.
struct AdminKubeconfig {
    path: PathBuf,
    mode: u32,
    url: String,
    advertised: SocketAddr,
}

impl AdminKubeconfig {
    fn write(&self, pki: &pki::Pki, live: &[SocketAddr]) -> pki::Result<()> {
        let others = live.iter().filter(|a| **a != self.advertised).map(|a| (a.to_string(), format!("https://{a}")));
        let servers: Vec<_> = std::iter::once(("default".to_string(), self.url.clone())).chain(others).collect();
        pki::write_kubeconfig(&self.path, self.mode, &servers, pki)
    }
}

/// The cluster CA with this server's certificates, and the service account key. On a shared
/// datastore they are the cluster's: taken from it when another server put them there, else this
/// server's own, put there for the next (k3s's bootstrap data).
async fn load_keys(
    cfg: &ServerConfig,
    store: &Store,
    secret: &str,
    hostname: &str,
    node_ips: &[IpAddr],
    sans: &[String],
) -> Result<(Arc<pki::Pki>, Arc<api::sa_token::ServiceAccountTokens>)> {
    let dir = cfg.tls_dir();
    let load = || -> Result<_> {
        let pki = pki::Pki::load_or_create(&dir, hostname, node_ips, sans).context("preparing TLS certificates")?;
        let issuer = api::sa_token::ServiceAccountTokens::load_or_create(
            &dir,
            &cfg.service_account_issuer,
            cfg.token_policy.clone(),
        )
        .context("loading the service account key")?;
        Ok((Arc::new(pki), Arc::new(issuer)))
    };
    let key = api::shared_keys::DATASTORE_KEY;
    let install = |sealed: &[u8]| -> Result<()> {
        if api::shared_keys::install(&dir, sealed, secret)? {
            tracing::info!("took the cluster CA and service account key from the datastore");
        }
        Ok(())
    };
    if !store.is_shared() {
        return load();
    }
    if let Some(sealed) = store.shared(key).await.context("reading the cluster's keys from the datastore")? {
        install(&sealed)?;
        return load();
    }
    let keys = load()?;
    let sealed = api::shared_keys::seal(&dir, secret)?;
    let held = store.share(key, sealed.clone()).await.context("putting the cluster's keys in the datastore")?;
    if held == sealed {
        tracing::info!("put the cluster CA and service account key in the datastore for other servers");
        return Ok(keys);
    }
    // Another server was first.
    install(&held)?;
    load()
}

/// The etcd of the cluster the server at `server` belongs to, asked with its join `token` (k3s's
/// `--server` on a server), retried while that server cannot be reached.
async fn datastore_of(server: &str, token: &str) -> Result<String> {
    let token = pki::JoinToken::parse(token).map_err(|e| anyhow::anyhow!("invalid --token: {e}"))?;
    let mut wait = std::time::Duration::from_secs(1);
    loop {
        match crate::agent::credentials::server_bootstrap(server, &token).await {
            Ok(answer) => {
                return answer.datastore_endpoint.with_context(|| {
                    format!(
                        "the server at {server} keeps its cluster in its embedded store, which no other server can \
                         share: start the first server with --datastore-endpoint (etcd), or move it there with \
                         `cairn datastore migrate`"
                    )
                });
            }
            Err(e) if e.is::<crate::agent::credentials::Refused>() => return Err(e),
            Err(e) => {
                tracing::warn!("cannot join the server at {server}: {e:#}; trying again in {}s", wait.as_secs());
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(30));
            }
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
    Ok(pki::write_atomic(path, 0o600, format!("{token}\n").as_bytes())?)
}

pub async fn wait_for_signal() {
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
