//! Netlink plumbing: the bridge, veth pairs, addresses and routes, and running netlink work inside
//! a pod's network namespace (on a thread of its own, which is the only thread ever switched).

use std::fs::{self, File};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use anyhow::{Context, Result, anyhow, bail};
use futures::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha2::{Digest, Sha256};

use super::spec::{Cidr, format_mac};

/// Opens an rtnetlink connection in the calling thread's network namespace; its driver runs on
/// the current tokio runtime.
pub fn connect() -> Result<Handle> {
    let (conn, handle, _) = rtnetlink::new_connection().context("opening a netlink socket")?;
    tokio::spawn(conn);
    Ok(handle)
}

/// What ADD needs to know about a link.
#[derive(Debug)]
pub struct Link {
    pub index: u32,
    pub mac: String,
    pub up: bool,
    pub kind: Option<InfoKind>,
}

impl From<LinkMessage> for Link {
    fn from(m: LinkMessage) -> Link {
        let mut link =
            Link { index: m.header.index, mac: String::new(), up: m.header.flags.contains(LinkFlags::Up), kind: None };
        for attr in m.attributes {
            match attr {
                LinkAttribute::Address(a) => link.mac = format_mac(&a),
                LinkAttribute::LinkInfo(infos) => {
                    link.kind = infos.into_iter().find_map(|i| if let LinkInfo::Kind(k) = i { Some(k) } else { None })
                }
                _ => {}
            }
        }
        link
    }
}

/// The errno of a netlink error reply.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// Treats `EEXIST` as success.
fn exists_ok(r: Result<(), rtnetlink::Error>) -> Result<(), rtnetlink::Error> {
    match r {
        Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

pub async fn get_link(h: &Handle, name: &str) -> Result<Option<Link>> {
    match h.link().get().match_name(name.to_string()).execute().try_next().await {
        Ok(m) => Ok(m.map(Link::from)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
    }
}

async fn set_up(h: &Handle, link: &Link, name: &str) -> Result<()> {
    if link.up {
        return Ok(());
    }
    let msg = LinkUnspec::new_with_index(link.index).up().build();
    h.link().set(msg).execute().await.with_context(|| format!("setting {name} up"))
}

/// Creates the bridge if it is missing (gateway address, MTU, a fixed MAC so that it does not
/// follow its ports' addresses around) and makes sure it is up and has the gateway address.
pub async fn ensure_bridge(h: &Handle, name: &str, gateway: Cidr, mtu: u32) -> Result<Link> {
    let link = match get_link(h, name).await? {
        Some(link) => link,
        None => {
            let mac = bridge_mac(name, gateway.addr);
            let msg = LinkBridge::new(name).mtu(mtu).address(mac.to_vec()).build();
            // EEXIST: another ADD created it at the same time.
            exists_ok(h.link().add(msg).execute().await).with_context(|| format!("creating bridge {name}"))?;
            get_link(h, name).await?.ok_or_else(|| anyhow!("bridge {name} vanished right after it was created"))?
        }
    };
    if link.kind != Some(InfoKind::Bridge) {
        bail!("link {name} exists but is not a bridge");
    }
    set_up(h, &link, name).await?;
    exists_ok(h.address().add(link.index, gateway.addr.into(), gateway.prefix).execute().await)
        .with_context(|| format!("adding {gateway} to bridge {name}"))?;
    Ok(link)
}

/// Adds `addr`/32 to the loopback link if it is missing: an address of this host that pods reach
/// through their default route, with no rule in between (NodeLocal DNSCache's way of owning its
/// address, on `lo` because not every kernel has dummy links).
pub async fn ensure_loopback_address(h: &Handle, addr: Ipv4Addr) -> Result<()> {
    let link = get_link(h, "lo").await?.ok_or_else(|| anyhow!("this network namespace has no loopback link"))?;
    exists_ok(h.address().add(link.index, addr.into(), 32).execute().await)
        .with_context(|| format!("adding {addr}/32 to the loopback link"))
}

/// A locally administered unicast MAC derived from the bridge's name and gateway.
fn bridge_mac(name: &str, gateway: Ipv4Addr) -> [u8; 6] {
    let d = Sha256::new().chain_update(name).chain_update(gateway.octets()).finalize();
    [0x02, d[0], d[1], d[2], d[3], d[4]]
}

/// The pod interface's MAC: `0a:58:` and its IPv4 address, as kubenet did. Whoever holds an
/// address has the same MAC, so neighbour caches stay right when a pod's interface is re-created.
pub fn pod_mac(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [0x0a, 0x58, a, b, c, d]
}

/// Creates the veth pair: `host` attached to bridge `bridge` and up, its peer `peer` created
/// directly inside the namespace `netns` (down) with MAC `peer_mac`, both with `mtu`. A leftover
/// host side of an earlier ADD for the same container is replaced.
pub async fn create_veth(
    h: &Handle,
    (host, peer): (&str, &str),
    peer_mac: [u8; 6],
    mtu: u32,
    bridge: u32,
    netns: &File,
) -> Result<()> {
    let msg = || {
        // Not up yet: the kernel opens the peer before pairing it, which veth refuses (ENOTCONN).
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer)
            .mtu(mtu)
            .address(peer_mac.to_vec())
            .setns_by_fd(netns.as_raw_fd())
            .build();
        LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(host)
            .mtu(mtu)
            .controller(bridge)
            .up()
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build()
    };
    match h.link().add(msg()).execute().await {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == Some(libc::EEXIST) && delete_link(h, host).await? => {}
        Err(e) => return Err(e).with_context(|| format!("creating veth pair {host} / {peer}")),
    }
    h.link().add(msg()).execute().await.with_context(|| format!("re-creating veth pair {host} / {peer}"))
}

/// Turns on hairpin mode of a bridge port, so that a pod can reach itself through the bridge.
pub async fn set_hairpin(h: &Handle, index: u32, name: &str) -> Result<()> {
    let msg = LinkBridgePort::new(index).hairpin(true).build();
    h.link().set_port(msg).execute().await.with_context(|| format!("setting hairpin mode on {name}"))
}

/// Deletes a link by name; returns whether it existed. Deleting one end of a veth pair deletes
/// both.
pub async fn delete_link(h: &Handle, name: &str) -> Result<bool> {
    let Some(link) = get_link(h, name).await? else { return Ok(false) };
    match h.link().del(link.index).execute().await {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("deleting link {name}")),
    }
}

/// Inside the pod's namespace: gives `ifname` its address, brings it up and routes the default
/// route via `gateway`. Returns the interface's MAC.
pub async fn configure_pod_iface(h: &Handle, ifname: &str, addr: Cidr, gateway: Ipv4Addr) -> Result<String> {
    let link = get_link(h, ifname).await?.ok_or_else(|| anyhow!("{ifname} is missing in the pod namespace"))?;
    exists_ok(h.address().add(link.index, addr.addr.into(), addr.prefix).execute().await)
        .with_context(|| format!("adding {addr} to {ifname}"))?;
    set_up(h, &link, ifname).await?;
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
        .gateway(gateway)
        .output_interface(link.index)
        .build();
    h.route().add(route).replace().execute().await.with_context(|| format!("adding default route via {gateway}"))?;
    Ok(link.mac)
}

/// The addresses (with prefix lengths) of a link.
pub async fn addresses(h: &Handle, index: u32) -> Result<Vec<(IpAddr, u8)>> {
    let msgs: Vec<_> = h.address().get().set_link_index_filter(index).execute().try_collect().await?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| {
            let ip =
                m.attributes.iter().find_map(|a| if let AddressAttribute::Address(ip) = a { Some(*ip) } else { None });
            ip.map(|ip| (ip, m.header.prefix_len))
        })
        .collect())
}

/// Inside a pod's namespace: brings `lo` up and returns its addresses.
pub async fn loopback_up(h: &Handle) -> Result<Vec<(IpAddr, u8)>> {
    let lo = get_link(h, "lo").await?.ok_or_else(|| anyhow!("the namespace has no lo"))?;
    set_up(h, &lo, "lo").await?;
    addresses(h, lo.index).await.context("listing the addresses of lo")
}

/// Runs `f` with a netlink connection inside the network namespace `netns`, on a dedicated thread
/// with its own single-threaded runtime. Only that thread enters the namespace, and it ends with
/// `f`, so no other code ever runs in the wrong namespace.
pub async fn in_netns<T, F, Fut>(netns: File, f: F) -> Result<T>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let run = move || -> Result<T> {
        // SAFETY: setns on a valid descriptor; it switches only this thread, which exits after `f`.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error()).context("entering the pod network namespace");
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().context("starting a runtime")?;
        rt.block_on(async move { f(connect()?).await })
    };
    std::thread::Builder::new()
        .name("cni-netns".into())
        .spawn(move || {
            let _ = tx.send(run());
        })
        .context("spawning the netns thread")?;
    rx.await.map_err(|_| anyhow!("the netns thread panicked"))?
}

/// Sets a boolean sysctl (a path under /proc/sys) to 1 unless it already is.
pub fn enable_sysctl(path: &str) -> Result<()> {
    if fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    fs::write(path, "1").with_context(|| format!("setting {path} to 1"))
}
