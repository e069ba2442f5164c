//! The cluster DNS, in process: what CoreDNS does with k3s's Corefile
//! (`kubernetes cluster.local in-addr.arpa ip6.arpa { pods insecure; fallthrough in-addr.arpa
//! ip6.arpa; ttl 5 }`, `forward . /etc/resolv.conf`, `cache 30`).
//!
//! - [`records`]: the record set, a snapshot of Services, EndpointSlices and Namespaces answering
//!   queries as CoreDNS's kubernetes plugin does;
//! - [`watch`]: the reflectors it is rebuilt from, swapped in atomically (queries never wait);
//! - [`forward`]: the upstream forwarder with its bounded cache;
//! - [`server`]: the UDP and TCP listeners (hickory-server) and the request handler;
//! - [`resolv`]: the host's resolv.conf, which upstreams come from (`host_upstreams`).
//!
//! **Caching.** Cluster answers are never cached: each query reads the current snapshot, so a change
//! is visible as soon as its rebuild is swapped in, and clients may keep them for their TTL (5 s).
//! Upstream answers are cached for their TTL, at most 30 s (k3s's `cache 30`), in at most
//! [`forward::CACHE_ENTRIES`] entries.
//!
//! Nothing here reaches into the rest of cairn: it takes a `kube::Client` and a [`Config`].

pub mod forward;
pub mod records;
pub mod resolv;
pub mod server;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

pub use resolv::host_upstreams;

/// The default cluster domain (kubelet's `--cluster-domain`, k3s's default).
pub const DEFAULT_DOMAIN: &str = "cluster.local";
/// How long the server waits for its first lists before answering anyway (CoreDNS: 5 s).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// What the cluster DNS serves and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// UDP and TCP both, on each (k3s: the `kube-dns` Service's ClusterIP, 10.43.0.10:53).
    pub listen: Vec<SocketAddr>,
    /// The cluster domain, `cluster.local`.
    pub domain: String,
    /// Where other names are asked: [`host_upstreams`] in production. Never a loopback stub.
    pub upstreams: Vec<SocketAddr>,
    /// How long one upstream gets before the next is asked.
    pub upstream_timeout: Duration,
    /// Upstream answers kept at most.
    pub cache_entries: usize,
}

impl Config {
    /// `listen` and `domain` with the host's upstreams and the default timeout and cache size.
    pub fn new(listen: Vec<SocketAddr>, domain: impl Into<String>) -> Self {
        Config {
            listen,
            domain: domain.into(),
            upstreams: host_upstreams(),
            upstream_timeout: forward::UPSTREAM_TIMEOUT,
            cache_entries: forward::CACHE_ENTRIES,
        }
    }
}

/// Runs the cluster DNS on `listeners` (bound from `cfg.listen` by the caller, so that a taken
/// address fails the start) until `shutdown`: starts the watches, waits up to [`SYNC_TIMEOUT`] for
/// their first lists, then serves.
pub async fn run(
    client: kube::Client,
    cfg: Config,
    listeners: server::Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let snapshot: server::Snapshot =
        Arc::new(ArcSwap::from_pointee(records::RecordSet::empty(&cfg.domain).context("starting the cluster DNS")?));
    if cfg.upstreams.is_empty() {
        tracing::warn!("cluster DNS has no upstream resolvers: names outside {} will fail", cfg.domain);
    }
    tracing::info!(
        "cluster DNS listening on {:?} for {}, forwarding other names to {:?}",
        listeners.local_addrs(),
        cfg.domain,
        cfg.upstreams
    );
    let caches = watch::start(client, cfg.domain.clone(), snapshot.clone(), shutdown.clone());
    match tokio::time::timeout(SYNC_TIMEOUT, caches.ready()).await {
        Ok(true) => {}
        Ok(false) => return Ok(()),
        Err(_) => tracing::warn!("cluster DNS starts before Services and EndpointSlices are listed"),
    }
    serve(listeners, &cfg, snapshot, shutdown).await
}

/// Serves `snapshot` on already bound `listeners` until `shutdown` (the part of [`run`] without
/// the API: tests and the benchmark give it a fixed record set).
pub async fn serve(
    listeners: server::Listeners,
    cfg: &Config,
    snapshot: server::Snapshot,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let forwarder = Arc::new(forward::Forwarder::new(cfg.upstreams.clone(), cfg.upstream_timeout, cfg.cache_entries));
    server::serve(listeners, server::Handler::new(snapshot, forwarder), shutdown).await.context("serving cluster DNS")
}

#[cfg(test)]
mod tests;
