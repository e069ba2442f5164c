//! The pod network across nodes: each other Node's `spec.podCIDR` routed to it, directly via its
//! InternalIP when it is on a network this host is on (flannel's `host-gw`), through the VXLAN
//! overlay ([`super::vxlan`]) when it is not, as `--flannel-backend` chooses. The routes carry
//! cairn's own routing protocol number, so that after a restart cairn finds the ones it made and
//! removes those of Nodes that are gone, and never touches anyone else's.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::spec::Cidr;
use super::vxlan::{self, Peer};

/// The routing protocol number on cairn's routes (`ip route show proto 202`); unassigned in
/// iproute2's `rt_protos`.
pub const PROTOCOL: u8 = 202;
/// How often the routes are checked even without a Node change (an address may have changed).
const RESYNC: Duration = Duration::from_secs(60);

/// How pods on other nodes are reached (k3s's `--flannel-backend`, with `auto` first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// Directly to nodes on a network this node is on, through VXLAN to the others.
    #[default]
    Auto,
    /// Directly only (flannel's host-gw): nodes on other networks are not reached.
    HostGw,
    /// Through VXLAN to every other node (flannel's vxlan).
    Vxlan,
    /// Not at all: something else routes the pod ranges.
    None,
}

/// The next hop to another node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// The node's address, on a network this host is on.
    Direct(Ipv4Addr),
    /// Through the VXLAN device, to this peer.
    Vxlan(Peer),
}

impl Hop {
    fn gateway(&self) -> Ipv4Addr {
        match self {
            Hop::Direct(ip) => *ip,
            Hop::Vxlan(peer) => peer.gateway(),
        }
    }
}

/// The routes wanted: pod range → next hop, for every other Node with a pod range and an IPv4
/// InternalIP, as `backend` says (nodes not on one of `local`, this host's networks, go through
/// VXLAN or, with `host-gw`, are returned apart as unreachable); nodes that have reported no
/// address yet are left out.
pub fn wanted(nodes: &[Node], me: &str, local: &[Cidr], backend: Backend) -> (BTreeMap<Cidr, Hop>, Vec<String>) {
    let mut routes = BTreeMap::new();
    let mut unreachable = Vec::new();
    for node in nodes.iter().filter(|n| n.name_any() != me) {
        let Some(cidr) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).and_then(|c| c.parse::<Cidr>().ok())
        else {
            continue;
        };
        let Some(ip) = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .and_then(|a| a.address.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        let direct = local.iter().any(|net| net.contains(ip) && net.addr != ip);
        let overlay = Hop::Vxlan(Peer { pods: cidr.net(), node: ip });
        let hop = match backend {
            Backend::Auto if direct => Hop::Direct(ip),
            Backend::HostGw if direct => Hop::Direct(ip),
            Backend::Auto | Backend::Vxlan => overlay,
            Backend::HostGw | Backend::None => {
                unreachable.push(node.name_any());
                continue;
            }
        };
        routes.insert(cidr.net(), hop);
    }
    (routes, unreachable)
}

/// This node, as the pod network sees it.
pub struct Me {
    pub name: String,
    pub pods: Cidr,
    /// Its node address (where VXLAN packets to it go); without one, VXLAN is not used.
    pub ip: Option<Ipv4Addr>,
}

/// Keeps the routes to the other nodes' pods until `shutdown`, following the Nodes.
pub async fn run(client: kube::Client, me: Me, backend: Backend, shutdown: CancellationToken) -> Result<()> {
    if backend == Backend::None {
        tracing::info!("not routing other nodes' pods (--flannel-backend=none)");
        return Ok(());
    }
    let handle = super::netlink()?;
    let (nodes, mut changed) =
        crate::client::notified_cache(kube::Api::<Node>::all(client), Default::default(), &shutdown);
    let mut reported: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { return Ok(()) },
            _ = tokio::time::sleep(RESYNC) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
        let nodes: Vec<Node> = nodes.state().iter().map(|n| (**n).clone()).collect();
        let (mut routes, mut unreachable) = wanted(&nodes, &me.name, &local_networks(), backend);
        if me.ip.is_none() {
            routes.retain(|_, hop| match hop {
                Hop::Vxlan(_) => false,
                Hop::Direct(_) => true,
            });
        }
        for name in unreachable.iter().filter(|n| !reported.contains(n)) {
            tracing::warn!(
                "node {name} has no InternalIP on a network this node is on: its pods cannot be reached from here \
                 (--flannel-backend=host-gw)"
            );
        }
        reported = std::mem::take(&mut unreachable);
        if let Err(e) = sync(&handle, &me, &routes).await {
            tracing::warn!("updating the routes to other nodes' pods: {e:#}");
        }
    }
}

/// The IPv4 networks this host has an address on.
fn local_networks() -> Vec<Cidr> {
    let ifaces = if_addrs::get_if_addrs().unwrap_or_default();
    ifaces
        .into_iter()
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) if !a.ip.is_loopback() => {
                Some(Cidr { addr: a.ip, prefix: u32::from(a.netmask).count_ones() as u8 })
            }
            _ => None,
        })
        .collect()
}

/// Makes the VXLAN device and its peers what `wanted` needs, then cairn's routes exactly
/// `wanted`: adds or changes what differs, removes the rest.
async fn sync(h: &Handle, me: &Me, wanted: &BTreeMap<Cidr, Hop>) -> Result<()> {
    let peers: Vec<Peer> =
        wanted.values().filter_map(|hop| if let Hop::Vxlan(p) = hop { Some(*p) } else { None }).collect();
    let device = match (me.ip, peers.is_empty()) {
        (Some(local), false) => {
            let index = vxlan::ensure(h, me.pods, local).await?;
            vxlan::sync_peers(h, index, &peers).await?;
            Some(index)
        }
        _ => {
            vxlan::remove(h).await?;
            None
        }
    };
    let current: Vec<RouteMessage> = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .context("listing routes")?;
    let mut have = BTreeMap::new();
    for msg in current.into_iter().filter(|m| m.header.protocol == RouteProtocol::Other(PROTOCOL)) {
        let (dst, gw) = (destination(&msg), gateway(&msg));
        match (dst, gw) {
            // A VXLAN route's gateway is a pod address, never a node's: the same gateway is the same hop.
            (Some(dst), Some(gw)) if wanted.get(&dst).map(Hop::gateway) == Some(gw) => {
                have.insert(dst, gw);
            }
            _ => {
                h.route().del(msg).execute().await.context("removing a route to a node that is gone")?;
                if let Some(dst) = dst {
                    tracing::info!("removed the route to pods {dst}");
                }
            }
        }
    }
    for (dst, hop) in wanted.iter().filter(|(dst, _)| !have.contains_key(dst)) {
        let gw = hop.gateway();
        let mut route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.addr, dst.prefix)
            .gateway(gw)
            .protocol(RouteProtocol::Other(PROTOCOL));
        if let (Hop::Vxlan(_), Some(index)) = (hop, device) {
            route = route.output_interface(index);
            route.get_mut().header.flags |= RouteFlags::Onlink;
        }
        h.route().add(route.build()).replace().execute().await.with_context(|| format!("routing {dst} via {gw}"))?;
        match hop {
            Hop::Direct(_) => tracing::info!("routing pods {dst} via node address {gw}"),
            Hop::Vxlan(p) => tracing::info!("routing pods {dst} through {} to node address {}", vxlan::DEVICE, p.node),
        }
    }
    Ok(())
}

fn destination(msg: &RouteMessage) -> Option<Cidr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
            Some(Cidr { addr: *ip, prefix: msg.header.destination_prefix_length })
        }
        _ => None,
    })
}

fn gateway(msg: &RouteMessage) -> Option<Ipv4Addr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: Option<&str>, ip: Option<&str>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": cidr},
            "status": {"addresses": ip.map(|ip| vec![
                serde_json::json!({"type": "Hostname", "address": name}),
                serde_json::json!({"type": "InternalIP", "address": ip}),
            ]).unwrap_or_default()},
        }))
        .unwrap()
    }

    #[test]
    fn nodes_on_a_shared_network_are_routed_directly_the_others_through_vxlan() {
        let nodes = [
            node("me", Some("10.42.0.0/24"), Some("192.168.5.2")),
            node("b", Some("10.42.1.0/24"), Some("192.168.5.3")),
            node("far", Some("10.42.2.0/24"), Some("172.16.0.9")),
            node("new", None, Some("192.168.5.4")),
            node("unaddressed", Some("10.42.3.0/24"), None),
        ];
        let local = ["192.168.5.2/24".parse().unwrap()];
        let b = ("10.42.1.0/24".parse().unwrap(), Ipv4Addr::new(192, 168, 5, 3));
        let far = Peer { pods: "10.42.2.0/24".parse().unwrap(), node: Ipv4Addr::new(172, 16, 0, 9) };

        let (routes, unreachable) = wanted(&nodes, "me", &local, Backend::Auto);
        assert_eq!(routes, BTreeMap::from([(b.0, Hop::Direct(b.1)), (far.pods, Hop::Vxlan(far))]));
        assert!(unreachable.is_empty());
        assert_eq!(routes[&far.pods].gateway(), Ipv4Addr::new(10, 42, 2, 0));

        let (routes, unreachable) = wanted(&nodes, "me", &local, Backend::HostGw);
        assert_eq!(routes, BTreeMap::from([(b.0, Hop::Direct(b.1))]));
        assert_eq!(unreachable, ["far"]);

        let (routes, _) = wanted(&nodes, "me", &local, Backend::Vxlan);
        let b_peer = Peer { pods: b.0, node: b.1 };
        assert_eq!(routes, BTreeMap::from([(b.0, Hop::Vxlan(b_peer)), (far.pods, Hop::Vxlan(far))]));
    }

    #[test]
    fn backends_are_named_as_the_flag_takes_them() {
        use clap::ValueEnum as _;
        let names: Vec<String> =
            Backend::value_variants().iter().map(|b| b.to_possible_value().unwrap().get_name().to_string()).collect();
        assert_eq!(names, ["auto", "host-gw", "vxlan", "none"]);
        assert_eq!(serde_json::to_string(&Backend::HostGw).unwrap(), "\"host-gw\"");
    }
}
