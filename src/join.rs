//! `cairn agent`: the composition root of a node joining a server (k3s's `k3s agent`). The node
//! trusts the server through its token's CA pin, gets its own credentials, registers its Node and
//! waits for the pod range the server's node IPAM gives it, then starts its container runtime and
//! everything else a node runs ([`crate::node::start`]), all reaching the API over HTTPS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::agent::credentials::{self, Join, Refused};
use crate::api::join::ClusterConfig;
use crate::api::pki::{self, JoinToken};
use crate::net::Cidr;
use crate::node::{self, NodeConfig};
use crate::runtime;

/// Everything `cairn agent` needs, after flags and the config file are merged.
#[derive(Debug)]
pub struct AgentConfig {
    /// `--server`, without a trailing slash: the first of `servers`.
    pub server: String,
    /// Every server `--server` names; with more than one, the node reaches them through a local
    /// load balancer that moves on to the next when one is gone.
    pub servers: Vec<String>,
    pub token: JoinToken,
    pub node: NodeConfig,
}

/// Start-up waits on the server retry after this long at most.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How often a wait for the pod range says it is still waiting.
const PROGRESS: Duration = Duration::from_secs(10);

/// What the node last learned from the server, kept for a start while the server is away.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Learned {
    cluster: ClusterConfig,
    #[serde(rename = "podCIDR")]
    pod_cidr: Cidr,
}

/// Runs the node until SIGINT or SIGTERM.
pub async fn run(cfg: AgentConfig) -> Result<()> {
    let shutdown = CancellationToken::new();
    let done = tokio::select! {
        started = start(cfg, shutdown.clone()) => started?,
        _ = crate::server::wait_for_signal() => return Ok(()),
    };
    crate::memory::release_startup_code_later(shutdown.clone());
    crate::server::wait_for_signal().await;
    tracing::info!("shutting down");
    shutdown.cancel();
    done.await.ok();
    Ok(())
}

/// Joins and starts every part of the node; returns once they run, with a handle that resolves
/// when the container runtime has stopped after `shutdown`.
pub async fn start(mut cfg: AgentConfig, shutdown: CancellationToken) -> Result<tokio::task::JoinHandle<()>> {
    let started = std::time::Instant::now();
    let dir = cfg.node.data_dir.join("agent");
    if cfg.servers.len() > 1 {
        cfg.server = crate::client::balancer::start(&cfg.servers, shutdown.clone()).await?;
    }
    let join = Join {
        server: cfg.server.clone(),
        token: cfg.token.clone(),
        node_name: cfg.node.node_name.clone(),
        addresses: cfg.node.node_ips.clone(),
        dir: dir.clone(),
    };
    let creds = Arc::new(retry(&cfg.server, "joining", || join.credentials()).await?);
    let client = credentials::api_client(&cfg.server, &creds, &creds.client)?;
    let controller = credentials::api_client(&cfg.server, &creds, &creds.controller)?;
    let learned = learn(&client, &cfg.node, &dir).await?;
    tracing::info!(
        "node {} joined {}: pod range {}, cluster network {}",
        cfg.node.node_name,
        cfg.server,
        learned.pod_cidr,
        learned.cluster.cluster_cidr
    );
    cfg.node.runtime.cluster_cidr = learned.cluster.cluster_cidr;
    cfg.node.runtime.pod_cidr = Some(learned.pod_cidr);
    let rt = runtime::start(&cfg.node.runtime, shutdown.clone()).await.context("starting the container runtime")?;
    let ca_path = dir.join("server-ca.crt");
    let tls = pki::server_tls(creds.roots.clone(), &ca_path, creds.serving.clone(), "the node endpoint's TLS");
    let endpoint = node::bind_endpoint(std::net::Ipv4Addr::UNSPECIFIED.into(), cfg.node.kubelet_port, tls).await;
    let clients = node::Clients { agent: client.clone(), controller };
    node::start(&cfg.node, &learned.cluster, learned.pod_cidr, rt.cri, clients, endpoint, &shutdown).await?;
    join.spawn_renewal(creds, pki::RENEWAL_CHECK_INTERVAL, shutdown);
    tracing::info!("node {} is up after {:.1?}", cfg.node.node_name, started.elapsed());
    Ok(rt.done)
}

/// The cluster's settings and this node's pod range: from the server (registering the Node and
/// waiting for its range), or, while the server cannot be reached, from what was kept last time.
async fn learn(client: &kube::Client, cfg: &NodeConfig, dir: &Path) -> Result<Learned> {
    let kept = dir.join("joined.json");
    let from_server = async {
        let cluster = cluster_config(client).await?;
        let pod_cidr = pod_cidr(client, cfg).await?;
        anyhow::Ok(Learned { cluster, pod_cidr })
    };
    match from_server.await {
        Ok(learned) => {
            let text = serde_json::to_string(&learned)?;
            if std::fs::read_to_string(&kept).ok().as_deref() != Some(text.as_str()) {
                pki::write_atomic(&kept, 0o644, text.as_bytes())?;
            }
            Ok(learned)
        }
        Err(e) => {
            let Some(learned) = std::fs::read(&kept).ok().and_then(|b| serde_json::from_slice::<Learned>(&b).ok())
            else {
                return Err(e);
            };
            tracing::warn!("{e:#}: starting from what node {} last learned of the cluster", cfg.node_name);
            Ok(learned)
        }
    }
}

async fn cluster_config(client: &kube::Client) -> Result<ClusterConfig> {
    let req = http::Request::get("/v1-cairn/config").body(Vec::new())?;
    let text = client.request_text(req).await.context("reading the cluster's settings from the server")?;
    serde_json::from_str(&text).context("reading the cluster's settings from the server")
}

/// Registers the Node when it is not there yet, and waits for `spec.podCIDR`.
async fn pod_cidr(client: &kube::Client, cfg: &NodeConfig) -> Result<Cidr> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = &cfg.node_name;
    let range = |n: &Node| n.spec.as_ref()?.pod_cidr.as_deref()?.parse::<Cidr>().ok();
    match nodes.get_opt(name).await.context("reading this node's Node")? {
        Some(n) if let Some(cidr) = range(&n) => return Ok(cidr),
        Some(_) => {}
        None => {
            let node = crate::agent::node::registration(name, cfg.control_plane, &Default::default());
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => tracing::info!("registered node {name}"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e).context("registering the Node"),
            }
        }
    }
    let given = kube::runtime::wait::await_condition(nodes, name, move |n: Option<&Node>| n.and_then(range).is_some());
    tokio::pin!(given);
    let mut progress = tokio::time::interval(PROGRESS);
    progress.tick().await;
    loop {
        tokio::select! {
            node = &mut given => {
                let node = node.context("waiting for this node's pod range")?;
                return node.as_ref().and_then(range).context("the Node was deleted while it waited for its pod range");
            }
            _ = progress.tick() => tracing::info!(
                "node {name}: waiting for the server to give it a pod range (spec.podCIDR): a server whose \
                 --cluster-cidr is used up says CIDRNotAvailable in `kubectl get events`"
            ),
        }
    }
}

/// Runs `step` until it succeeds or the server refuses; retries with backoff while the server
/// cannot be reached, saying so.
async fn retry<T, F, Fut>(server: &str, what: &str, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut wait = Duration::from_secs(1);
    loop {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if e.downcast_ref::<Refused>().is_some() => return Err(e),
            Err(e) => {
                tracing::warn!("{what} {server}: {e:#}; retrying in {}s", wait.as_secs());
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_RETRY);
            }
        }
    }
}
