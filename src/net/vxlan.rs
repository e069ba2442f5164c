//! The VXLAN overlay to nodes not on a network this node is on (flannel's `vxlan` backend): one
//! device, [`DEVICE`] (VNI 1, UDP 8472, no learning), with the first address of this node's pod
//! range; per peer node a permanent neighbour entry (the peer's first pod address → its device's
//! MAC) and a forwarding-database entry (that MAC → the peer's node address), and a route to its
//! pod range through the device ([`super::routes`]).
//!
//! Unlike flannel, no node annotation carries a device's MAC: it is derived from the node's pod
//! range ([`vtep_mac`]), which every node already reads from the peer's `spec.podCIDR`.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context as _, Result, anyhow};
use futures::TryStreamExt as _;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan};

use super::spec::Cidr;

/// The device's name (flannel's is `flannel.1`: the VNI after the dot).
pub const DEVICE: &str = "cairn.1";
const VNI: u32 = 1;
/// The Linux and flannel VXLAN port.
const PORT: u16 = 8472;
/// What VXLAN adds to every packet (outer IPv4, UDP, VXLAN and Ethernet headers).
const OVERHEAD: u32 = 50;

/// A node reached through the overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// Its pod range.
    pub pods: Cidr,
    /// Its node address, where its VXLAN packets go.
    pub node: Ipv4Addr,
}

impl Peer {
    /// The address of its device: the first of its pod range, the next hop of the route to it.
    pub fn gateway(&self) -> Ipv4Addr {
        self.pods.net().addr
    }
}

/// The MAC of the device of the node whose pod range is `pods`: locally administered, unicast,
/// `0e:ca:` and the range's first address.
pub fn vtep_mac(pods: Cidr) -> [u8; 6] {
    let [a, b, c, d] = pods.net().addr.octets();
    [0x0e, 0xca, a, b, c, d]
}

/// Makes the device for this node (pod range `own`, node address `local`) if it is missing or
/// not what it should be, up, with its address; returns its index.
pub async fn ensure(h: &Handle, own: Cidr, local: Ipv4Addr) -> Result<u32> {
    let (uplink, uplink_mtu) = uplink(h, local).await?;
    let mac = vtep_mac(own);
    if let Some(link) = device(h).await? {
        if is_ours(&link, mac, local, uplink) {
            let index = link.header.index;
            address(h, index, own).await?;
            return Ok(index);
        }
        tracing::info!("re-creating {DEVICE}: the node's address or pod range changed");
        h.link().del(link.header.index).execute().await.with_context(|| format!("removing {DEVICE}"))?;
    }
    let msg = LinkVxlan::new(DEVICE, VNI)
        .dev(uplink)
        .local(local)
        .port(PORT)
        .learning(false)
        .mtu(uplink_mtu.saturating_sub(OVERHEAD))
        .address(mac.to_vec())
        .build();
    h.link().add(msg).execute().await.with_context(|| {
        format!("creating the VXLAN device {DEVICE} (is the kernel's vxlan module there? `cairn check-config` says)")
    })?;
    let link = device(h).await?.ok_or_else(|| anyhow!("{DEVICE} vanished right after it was created"))?;
    let index = link.header.index;
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .with_context(|| format!("setting {DEVICE} up"))?;
    address(h, index, own).await?;
    tracing::info!("made the VXLAN device {DEVICE} over the link of {local}");
    Ok(index)
}

/// Removes the device (with its routes and entries) if it is there.
pub async fn remove(h: &Handle) -> Result<()> {
    if let Some(link) = device(h).await? {
        h.link().del(link.header.index).execute().await.with_context(|| format!("removing {DEVICE}"))?;
        tracing::info!("removed the VXLAN device {DEVICE}: no node needs it");
    }
    Ok(())
}

/// Makes the device's neighbour and forwarding entries exactly those of `peers`.
pub async fn sync_peers(h: &Handle, index: u32, peers: &[Peer]) -> Result<()> {
    for family in [AddressFamily::Inet, AddressFamily::Bridge] {
        let current: Vec<NeighbourMessage> = h
            .neighbours()
            .get()
            .set_address_family(family)
            .execute()
            .try_collect()
            .await
            .context("listing neighbours")?;
        for msg in current.into_iter().filter(|m| m.header.ifindex == index) {
            let wanted = match family {
                AddressFamily::Inet => {
                    destination(&msg).is_some_and(|d| peers.iter().any(|p| IpAddr::V4(p.gateway()) == d))
                }
                _ => peers.iter().any(|p| {
                    lladdr(&msg) == Some(&vtep_mac(p.pods)[..]) && destination(&msg) == Some(IpAddr::V4(p.node))
                }),
            };
            if !wanted {
                h.neighbours().del(msg).execute().await.context("removing an entry of a node that is gone")?;
            }
        }
    }
    for peer in peers {
        let mac = vtep_mac(peer.pods);
        h.neighbours()
            .add(index, IpAddr::V4(peer.gateway()))
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .with_context(|| format!("adding the neighbour entry of {}", peer.pods))?;
        h.neighbours()
            .add_bridge(index, &mac)
            .destination(IpAddr::V4(peer.node))
            .flags(NeighbourFlags::Own)
            .replace()
            .execute()
            .await
            .with_context(|| format!("adding the forwarding entry of {} to {}", peer.pods, peer.node))?;
    }
    Ok(())
}

async fn device(h: &Handle) -> Result<Option<LinkMessage>> {
    match h.link().get().match_name(DEVICE.to_string()).execute().try_next().await {
        Ok(m) => Ok(m),
        Err(rtnetlink::Error::NetlinkError(e)) if e.code.map(|c| -c.get()) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("looking up {DEVICE}")),
    }
}

/// Whether an existing device is a VXLAN device as this node would make it.
fn is_ours(link: &LinkMessage, mac: [u8; 6], local: Ipv4Addr, uplink: u32) -> bool {
    let mut vxlan = None;
    let mut address_ok = false;
    for attr in &link.attributes {
        match attr {
            LinkAttribute::Address(a) => address_ok = a[..] == mac[..],
            LinkAttribute::LinkInfo(infos) => {
                let kind_ok = infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vxlan)));
                vxlan = infos.iter().find_map(|i| match i {
                    LinkInfo::Data(InfoData::Vxlan(data)) if kind_ok => Some(data.clone()),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    let Some(data) = vxlan else { return false };
    address_ok
        && data.contains(&InfoVxlan::Id(VNI))
        && data.contains(&InfoVxlan::Local(local))
        && data.contains(&InfoVxlan::Link(uplink))
        && data.contains(&InfoVxlan::Port(PORT))
}

/// The index and MTU of the link that has `local`.
async fn uplink(h: &Handle, local: Ipv4Addr) -> Result<(u32, u32)> {
    let addrs: Vec<_> = h.address().get().execute().try_collect().await.context("listing addresses")?;
    let index = addrs
        .iter()
        .find(|m| m.attributes.iter().any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == local)))
        .map(|m| m.header.index)
        .ok_or_else(|| anyhow!("no link of this host has the node address {local}"))?;
    let link = h
        .link()
        .get()
        .match_index(index)
        .execute()
        .try_next()
        .await
        .context("looking up the node address's link")?
        .ok_or_else(|| anyhow!("the link of {local} vanished"))?;
    let mtu = link.attributes.iter().find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None });
    Ok((index, mtu.unwrap_or(1500)))
}

/// Gives the device the first address of `own`, as a /32 (flannel's way: the rest of the range is
/// on the pod bridge).
async fn address(h: &Handle, index: u32, own: Cidr) -> Result<()> {
    let addr = own.net().addr;
    let have: Vec<_> =
        h.address().get().set_link_index_filter(index).execute().try_collect().await.context("listing addresses")?;
    let present = have.iter().any(|m| {
        m.header.prefix_len == 32
            && m.attributes.iter().any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == addr))
    });
    if !present {
        h.address()
            .add(index, addr.into(), 32)
            .execute()
            .await
            .with_context(|| format!("adding {addr}/32 to {DEVICE}"))?;
    }
    Ok(())
}

fn destination(msg: &NeighbourMessage) -> Option<IpAddr> {
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    })
}

fn lladdr(msg: &NeighbourMessage) -> Option<&[u8]> {
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) => Some(&l[..]),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_mac_follows_the_pod_range() {
        let pods: Cidr = "10.42.7.0/24".parse().unwrap();
        assert_eq!(vtep_mac(pods), [0x0e, 0xca, 10, 42, 7, 0]);
        // Locally administered (bit 1) and unicast (bit 0 clear).
        assert_eq!(vtep_mac(pods)[0] & 0b11, 0b10);
        let peer = Peer { pods: "10.42.7.5/24".parse().unwrap(), node: Ipv4Addr::new(192, 0, 2, 9) };
        assert_eq!(peer.gateway(), Ipv4Addr::new(10, 42, 7, 0));
    }
}
