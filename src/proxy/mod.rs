//! The node's service proxy: kube-proxy's nftables mode inside the process.
//!
//! [`run`] watches Services and EndpointSlices (kube-runtime reflectors), builds the model
//! ([`model`]: each Service port with its usable endpoints), translates it ([`rules`]) and brings
//! the kernel's `ip cairn-proxy` table to it ([`nft`]), one atomic transaction per sync holding
//! only what changed. Stale UDP/SCTP flows are cleared afterwards ([`conntrack`]).
//!
//! # Guarantees
//! - The table is never flushed: a (re)started proxy reads what the kernel holds and changes only
//!   the difference, so traffic keeps flowing while cairn is down or restarting, and the rules stay
//!   when it stops (`nft delete table ip cairn-proxy` removes them; tests use [`cleanup`]).
//! - Anything in the table that the model does not ask for (a stale chain, a rule added by hand) is
//!   removed by the next full resync, every [`Config::sync_period`] (kube-proxy's `syncPeriod`).
//! - It coexists with the CNI's iptables(-nft) chains: other tables, its own mark bit (0x4000, the
//!   CNI's is 0x2000), DNAT at the same priority as iptables' nat PREROUTING (before any filter
//!   FORWARD rule), masquerade in postrouting.
//!
//! # Left out
//! `healthCheckNodePort` (no health server for Local external traffic), topology-aware hints,
//! `loadBalancerSourceRanges`, the cluster-IP "no such port" reject, IPv6.

pub mod conntrack;
pub mod model;
pub mod nft;
pub mod rules;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::net::Cidr;
use model::ServicePort;
use nft::{Counts, Host};
use rules::{Ruleset, Settings};

/// kube-proxy's `--sync-period` default: how often the kernel's table is read back and repaired.
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);

/// What the server tells the proxy about its node.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name: endpoints with this `nodeName` are local (the Local traffic policies).
    pub node_name: String,
    /// The node's addresses (IPv6 ones are ignored).
    pub node_ips: Vec<IpAddr>,
    /// The cluster's pod CIDR: traffic to a cluster IP from outside it is masqueraded.
    pub cluster_cidr: Cidr,
    /// Where node ports answer (kube-proxy's `--nodeport-addresses`); `None`: every node address
    /// and 127.0.0.1.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    pub sync_period: Duration,
    /// Apply the rules in this named network namespace instead of ours (tests, benchmarks).
    pub netns: Option<String>,
}

impl Config {
    pub fn new(node_name: impl Into<String>, node_ips: Vec<IpAddr>, cluster_cidr: Cidr) -> Config {
        Config {
            node_name: node_name.into(),
            node_ips,
            cluster_cidr,
            node_port_addresses: None,
            sync_period: DEFAULT_SYNC_PERIOD,
            netns: None,
        }
    }

    pub fn settings(&self) -> Settings {
        let v4 = |ips: &[IpAddr]| -> Vec<Ipv4Addr> {
            ips.iter()
                .filter_map(|ip| match ip {
                    IpAddr::V4(v4) => Some(*v4),
                    IpAddr::V6(_) => None,
                })
                .collect()
        };
        let mut addrs = match &self.node_port_addresses {
            Some(a) => v4(a),
            None => {
                let mut a = v4(&self.node_ips);
                a.push(Ipv4Addr::LOCALHOST);
                a
            }
        };
        addrs.sort();
        addrs.dedup();
        Settings { cluster_cidr: self.cluster_cidr, node_port_addresses: addrs }
    }

    fn host(&self) -> Host {
        Host { netns: self.netns.clone() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the {table} table: {source}")]
    Read {
        table: &'static str,
        #[source]
        source: nft::Error,
    },
    #[error("applying {counts:?} to the {table} table: {source}")]
    Apply {
        table: &'static str,
        counts: Counts,
        #[source]
        source: nft::Error,
    },
}

/// The syncer (kube-proxy's nftables `Proxier`): remembers what the kernel holds and brings it to
/// each new model.
#[derive(Debug)]
pub struct Proxier {
    host: Host,
    settings: Settings,
    /// The table as of the last sync; `None`: read the kernel first.
    kernel: Option<Ruleset>,
    /// The model of the last successful sync (for conntrack cleanup).
    last: Vec<ServicePort>,
    conntrack: conntrack::Conntrack,
    localnet_set: bool,
}

impl Proxier {
    pub fn new(cfg: &Config) -> Proxier {
        Proxier {
            host: cfg.host(),
            settings: cfg.settings(),
            kernel: None,
            last: Vec::new(),
            conntrack: conntrack::Conntrack::new(cfg.host()),
            localnet_set: false,
        }
    }

    /// One sync (kube-proxy's `syncProxyRules`): `resync` reads the kernel's table back first, so
    /// that anything changed behind our back is repaired. Returns what was changed.
    pub async fn sync(&mut self, ports: Vec<ServicePort>, resync: bool) -> Result<Counts, Error> {
        if self.settings.localhost_node_ports() && !self.localnet_set {
            // 127.0.0.1:<nodePort> is DNATed to pods, out of the loopback (kube-proxy sets it too).
            match self.sysctl("net.ipv4.conf.all.route_localnet").await {
                Ok(()) => self.localnet_set = true,
                Err(e) => tracing::warn!("node ports on 127.0.0.1 will not work: setting route_localnet: {e}"),
            }
        }
        let kernel = match self.kernel.take() {
            Some(k) if !resync => k,
            _ => self.host.read().await.map_err(|source| Error::Read { table: rules::TABLE, source })?,
        };
        let desired = rules::desired(&self.settings, &ports);
        let counts = match nft::plan(&kernel, &desired) {
            None => Counts::default(),
            Some((script, counts)) => {
                tracing::trace!("nft script:\n{script}");
                if let Err(source) = self.host.apply(&script).await {
                    // Whatever the kernel holds now, the next sync reads it.
                    return Err(Error::Apply { table: rules::TABLE, counts, source });
                }
                counts
            }
        };
        self.kernel = Some(desired);
        let stale = conntrack::stale(&self.last, &ports);
        if !stale.is_empty() {
            self.conntrack.clear(&stale).await;
        }
        self.last = ports;
        Ok(counts)
    }

    async fn sysctl(&self, key: &str) -> Result<(), nft::Error> {
        if self.host.netns.is_none() {
            let path = format!("/proc/sys/{}", key.replace('.', "/"));
            if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
                return Ok(());
            }
            return std::fs::write(&path, "1")
                .map_err(|source| nft::Error::Spawn { program: format!("writing {path}"), source });
        }
        self.host.run("sysctl", &["-q", "-w", &format!("{key}=1")], None).await.map(drop)
    }
}

/// Checks that the host has `nft`, or says what to install.
pub fn check_host() -> anyhow::Result<()> {
    if crate::net::find_system_binary("nft").is_none() {
        bail!("nft was not found: cairn's service proxy needs nftables (Debian/Ubuntu: apt-get install nftables)");
    }
    Ok(())
}

/// Removes everything the proxy put in the kernel (its table; `route_localnet` is left as it is).
pub async fn cleanup(netns: Option<&str>) -> anyhow::Result<()> {
    let host = Host { netns: netns.map(str::to_string) };
    host.delete_table().await.with_context(|| format!("deleting the {} table", rules::TABLE))
}

/// A watch of one kind feeding a reflector cache and waking the syncer on every change.
fn watch<K>(api: Api<K>, config: watcher::Config, wake: Arc<Notify>, shutdown: CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let events = reflector::reflector(writer, watcher(api, config).default_backoff());
        let mut events = std::pin::pin!(events.take_until(shutdown.cancelled_owned()));
        while let Some(event) = events.next().await {
            match event {
                // A page of the initial list is not a state to sync to: wait for InitDone.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => wake.notify_one(),
                // The watcher retries with backoff; the API is away meanwhile.
                Err(e) => tracing::debug!("service proxy's watch of {}: {e}", K::kind(&())),
            }
        }
    });
    reader
}

/// The proxy of this node, until `shutdown` (the rules stay in place after it).
///
/// A sync runs once Services and EndpointSlices are both listed, then after every change, changes
/// that arrive during a sync coalesced into the next one, and every `sync_period` as a full
/// resync (kube-proxy's `BoundedFrequencyRunner` with `minSyncPeriod` 0). A failed sync is retried
/// with a backoff (1 s doubling to the sync period), reading the kernel's table again.
pub async fn run(client: kube::Client, cfg: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    check_host()?;
    let wake = Arc::new(Notify::new());
    let services: Store<Service> =
        watch(Api::all(client.clone()), watcher::Config::default(), wake.clone(), shutdown.clone());
    let slices: Store<EndpointSlice> = watch(
        Api::all(client),
        watcher::Config::default().labels(model::SERVICE_NAME_LABEL),
        wake.clone(),
        shutdown.clone(),
    );
    tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        r = async { tokio::try_join!(services.wait_until_ready(), slices.wait_until_ready()) } => {
            if r.is_err() {
                return Ok(()); // the watches stopped: shutting down
            }
        }
    }
    tracing::info!(
        "service proxy: syncing the {} table for node {} (node ports on {:?})",
        rules::TABLE,
        cfg.node_name,
        cfg.settings().node_port_addresses
    );
    let mut proxier = Proxier::new(&cfg);
    let mut next_resync = Instant::now();
    let mut backoff = Duration::ZERO;
    loop {
        let now = Instant::now();
        let resync = now >= next_resync;
        let svcs = services.state();
        let eps = slices.state();
        let ports = model::build(
            &svcs.iter().map(|s| s.as_ref()).collect::<Vec<_>>(),
            &eps.iter().map(|s| s.as_ref()).collect::<Vec<_>>(),
            &cfg.node_name,
        );
        let started = Instant::now();
        match proxier.sync(ports, resync).await {
            Ok(n) => {
                backoff = Duration::ZERO;
                if resync {
                    next_resync = now + cfg.sync_period;
                }
                if !n.is_empty() {
                    tracing::debug!("service proxy synced in {:?}: {n:?}", started.elapsed());
                }
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_secs(1), cfg.sync_period);
                tracing::warn!("service proxy sync failed, retrying in {backoff:?}: {e:#}");
            }
        }
        let wait_until = if backoff.is_zero() { next_resync } else { Instant::now() + backoff };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            // After a failure only the backoff ends the wait: changes are picked up by the retry.
            _ = wake.notified(), if backoff.is_zero() => {}
            _ = tokio::time::sleep_until(wait_until.into()) => {}
        }
    }
}
