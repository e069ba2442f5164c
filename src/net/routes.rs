//! Routes to the other nodes' pods (flannel's `host-gw` backend): each other Node's `spec.podCIDR`
//! via its InternalIP, for nodes on a network this host is directly on. The routes carry cairn's
//! own routing protocol number, so that after a restart cairn finds the ones it made and removes
//! those of Nodes that are gone, and never touches anyone else's.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio_util::sync::CancellationToken;

use super::spec::Cidr;

/// The routing protocol number on cairn's routes (`ip route show proto 202`); unassigned in
/// iproute2's `rt_protos`.
pub const PROTOCOL: u8 = 202;
/// How often the routes are checked even without a Node change (an address may have changed).
const RESYNC: Duration = Duration::from_secs(60);

/// The routes wanted: pod range → gateway, for every other Node with a pod range and an IPv4
/// InternalIP on one of `local` (this host's networks). Nodes with an address elsewhere, which
/// cannot be routed to directly, are returned apart; nodes that have reported no address yet are
/// left out.
pub fn wanted(nodes: &[Node], me: &str, local: &[Cidr]) -> (BTreeMap<Cidr, Ipv4Addr>, Vec<String>) {
    let mut routes = BTreeMap::new();
    let mut unreachable = Vec::new();
    for node in nodes.iter().filter(|n| n.name_any() != me) {
        let Some(cidr) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).and_then(|c| c.parse::<Cidr>().ok())
        else {
            continue;
        };
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .and_then(|a| a.address.parse::<Ipv4Addr>().ok());
        match ip {
            Some(ip) if local.iter().any(|net| net.contains(ip) && net.addr != ip) => {
                routes.insert(cidr.net(), ip);
            }
            Some(_) => unreachable.push(node.name_any()),
            None => {}
        }
    }
    (routes, unreachable)
}

/// Keeps the routes to the other nodes' pods until `shutdown`, following the Nodes.
pub async fn run(client: kube::Client, me: String, shutdown: CancellationToken) -> Result<()> {
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
        let (routes, unreachable) = wanted(&nodes, &me, &local_networks());
        for name in unreachable.iter().filter(|n| !reported.contains(n)) {
            tracing::warn!(
                "node {name} has no InternalIP on a network this node is on: its pods cannot be reached from here"
            );
        }
        reported = unreachable;
        if let Err(e) = sync(&handle, &routes).await {
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

/// Makes cairn's routes exactly `wanted`: adds or changes what differs, removes the rest.
async fn sync(h: &Handle, wanted: &BTreeMap<Cidr, Ipv4Addr>) -> Result<()> {
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
            (Some(dst), Some(gw)) if wanted.get(&dst) == Some(&gw) => {
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
    for (dst, gw) in wanted.iter().filter(|(dst, _)| !have.contains_key(dst)) {
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.addr, dst.prefix)
            .gateway(*gw)
            .protocol(RouteProtocol::Other(PROTOCOL))
            .build();
        h.route().add(route).replace().execute().await.with_context(|| format!("routing {dst} via {gw}"))?;
        tracing::info!("routing pods {dst} via node address {gw}");
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
    fn routes_go_to_other_nodes_on_a_shared_network() {
        let nodes = [
            node("me", Some("10.42.0.0/24"), Some("192.168.5.2")),
            node("b", Some("10.42.1.0/24"), Some("192.168.5.3")),
            node("far", Some("10.42.2.0/24"), Some("172.16.0.9")),
            node("new", None, Some("192.168.5.4")),
            node("unaddressed", Some("10.42.3.0/24"), None),
        ];
        let local = ["192.168.5.2/24".parse().unwrap()];
        let (routes, unreachable) = wanted(&nodes, "me", &local);
        assert_eq!(routes, BTreeMap::from([("10.42.1.0/24".parse().unwrap(), Ipv4Addr::new(192, 168, 5, 3))]));
        assert_eq!(unreachable, ["far"]);
    }
}
