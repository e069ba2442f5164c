//! cairn's CNI plugin: one executable that gives a pod its network in a single exec per ADD.
//!
//! containerd's CRI plugin runs cairn's own binary (symlinked into the CNI bin dir under
//! [`PLUGIN_NAMES`]) for the `10-cairn.conflist` network that [`install`] writes, and for the
//! loopback network it adds itself. The `type` field of the config on stdin selects the plugin:
//! - `cairn-cni`: a Linux bridge with the node's pod subnet ([`link`]), host-local-style IPAM
//!   ([`ipam`]), and masquerading, forwarding and host ports through iptables ([`netfilter`]).
//! - `loopback`: brings `lo` up in the pod's namespace.
//!
//! Everything a later DEL needs is derived from the container ID and interface name (the host
//! veth `veth<hash>`, the host-port chain `<P>-HP-<hash>`) or kept on disk under `stateDir`, so
//! DEL works with the namespace gone and after a crash, and repeats harmlessly. On disk:
//! - `ipam/<network>/`: the address allocations, in host-local's layout ([`ipam`]);
//! - `hostports/<network>/<hash>`: marks an attachment that has host ports;
//! - `iptables.lock`: serializes repairs of the shared iptables rules ([`netfilter`]).
//!
//! Nothing is logged: stdout carries the result, and runtimes do not show a plugin's stderr.

mod ipam;
mod link;
mod netfilter;
pub mod routes;
mod spec;
#[cfg(test)]
mod tests;
mod vxlan;

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};

pub use link::{connect as netlink, ensure_loopback_address};
pub use netfilter::{binary as system_binary, find_binary as find_system_binary};
pub use spec::Cidr;
use spec::{AddResult, BridgeConf, CniError, Command, Conf, Dns, Env, Interface, IpConfig, Plugin, Route, code};

/// Names under which containerd finds this binary in the CNI bin dir (symlinks to cairn's executable).
pub const PLUGIN_NAMES: &[&str] = &["cairn-cni", "loopback"];

/// The conflist [`install`] writes; containerd uses the first network config of its conf dir.
const CONFLIST_NAME: &str = "10-cairn.conflist";

/// cairn's pod network, as [`install`] writes it into the conflist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// Network name ("cairn"); 1-8 characters of `[A-Za-z0-9_-]`, as it also names the IPAM
    /// directory and (upper-cased) the iptables chains.
    pub name: String,
    /// Bridge interface ("cni0").
    pub bridge: String,
    /// This node's pod CIDR (10.42.0.0/24); the bridge gets its first address as gateway.
    pub subnet: Cidr,
    /// The cluster's pod CIDR (10.42.0.0/16): traffic within it is not masqueraded.
    pub cluster_cidr: Cidr,
    pub mtu: u32,
    /// Lets a pod reach itself through a Service IP that picks it.
    pub hairpin: bool,
    /// Masquerade pod traffic that leaves the cluster CIDR.
    pub ip_masq: bool,
    /// Where IPAM state lives, e.g. `<data-dir>/agent/cni`.
    pub state_dir: PathBuf,
}

/// Checks that the host has the programs the plugin runs, or says what to install.
pub fn check_host() -> Result<()> {
    for tool in ["iptables-save", "iptables-restore"] {
        if netfilter::find_binary(tool).is_none() {
            bail!(
                "{tool} was not found: cairn's pod network needs iptables (Debian/Ubuntu: apt-get install iptables), \
                 or use other CNI plugins with --cni-bin-dir and --cni-conf-dir"
            );
        }
    }
    Ok(())
}

/// True when this process was started by a container runtime as a CNI plugin (CNI_COMMAND is set).
pub fn is_cni_invocation() -> bool {
    std::env::var_os("CNI_COMMAND").is_some()
}

/// Runs one CNI command from env + stdin, prints the result or a CNI error JSON to stdout, returns the exit code (0 or 1).
pub fn plugin_main() -> i32 {
    let mut stdin = Vec::new();
    let result = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => run(&Env::from_process(), &stdin),
        Err(e) => Err(CniError::new(code::DECODE, "failed to read the network configuration", e.to_string())),
    };
    let (text, status) = match result {
        Ok(Some(out)) => (out, 0),
        Ok(None) => return 0,
        Err(e) => (e.to_json(&error_version(&stdin)), 1),
    };
    let mut out = std::io::stdout().lock();
    // If stdout is gone there is nobody left to tell.
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    status
}

/// The version to write an error in: the config's, if it is one we speak.
fn error_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| spec::SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| spec::LATEST_VERSION.into())
}

/// Runs one command; `Ok(Some(json))` is printed, `Ok(None)` prints nothing.
fn run(env: &Env, stdin: &[u8]) -> Result<Option<String>, CniError> {
    let cmd = env.command()?;
    if cmd == Command::Version {
        return Ok(Some(spec::version_json()));
    }
    let conf = Conf::parse(stdin)?;
    match cmd {
        // CNI 1.1 commands, which a runtime only sends to plugins that claim 1.1.
        Command::Status => return Ok(None),
        Command::Gc => return Err(CniError::new(code::INVALID_ENV, "GC is not supported", "it is a CNI 1.1 command")),
        _ => env.validate(cmd)?,
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(code::FAILED, "failed to start a runtime", e.to_string()))?;
    let out = rt.block_on(async {
        match (&conf.plugin, cmd) {
            (Plugin::Bridge(b), Command::Add) => add(&conf, b, env).await.map(Some),
            (Plugin::Bridge(b), Command::Del) => del(&conf.name, b, env).await.map(|()| None),
            (Plugin::Bridge(b), Command::Check) => check(&conf, b, env).await.map(|()| None),
            (Plugin::Loopback, Command::Add) => loopback_add(&conf, env).await.map(Some),
            (Plugin::Loopback, Command::Check) => loopback_check(env).await.map(|()| None),
            // Loopback DEL (VERSION, STATUS and GC never get here): lo goes away with the pod's
            // namespace, there is nothing to undo.
            _ => Ok(None),
        }
    })?;
    Ok(out.map(|r| serde_json::to_string(&r).expect("results serialize")))
}

/// Hex SHA-256 of the attachment (container ID + interface name): names its host veth and
/// host-port chain so that DEL finds them without any other state.
fn attachment_key(container_id: &str, ifname: &str) -> String {
    Sha256::new()
        .chain_update(container_id)
        .chain_update(ifname)
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn host_veth(key: &str) -> String {
    format!("veth{}", &key[..11])
}

/// Marks an attachment that has host ports, so that DEL of one without skips iptables entirely.
fn hostport_marker(b: &BridgeConf, network: &str, key: &str) -> PathBuf {
    b.state_dir.join("hostports").join(network).join(key)
}

/// Writes the marker; its content (the port mappings) is only for people looking.
fn write_hostport_marker(b: &BridgeConf, network: &str, key: &str) -> Result<()> {
    let marker = hostport_marker(b, network, key);
    if let Some(dir) = marker.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let json = serde_json::to_string(&b.port_mappings).expect("port mappings serialize");
    fs::write(&marker, json).with_context(|| format!("writing {}", marker.display()))
}

async fn add(conf: &Conf, b: &BridgeConf, env: &Env) -> Result<AddResult> {
    let netns = File::open(&env.netns).with_context(|| format!("opening network namespace {}", env.netns))?;
    // The rule check runs in parallel with the netlink work below.
    let snapshot = tokio::spawn(netfilter::snapshot());
    let h = link::connect()?;
    let gateway = b.subnet.with_addr(b.subnet.gateway());
    let bridge = link::ensure_bridge(&h, &b.bridge, gateway, b.mtu).await?;
    link::enable_sysctl("/proc/sys/net/ipv4/ip_forward")?;
    if !b.port_mappings.is_empty() {
        // 127.0.0.1:<hostPort> is DNATed out through the bridge.
        link::enable_sysctl(&format!("/proc/sys/net/ipv4/conf/{}/route_localnet", b.bridge))?;
    }
    let store = ipam::Store::open(&b.state_dir, &conf.name)?;
    let ip = store.allocate(b.subnet, &env.container_id, &env.ifname)?;
    let attached = async {
        let key = attachment_key(&env.container_id, &env.ifname);
        let veth = host_veth(&key);
        link::create_veth(&h, (&veth, &env.ifname), link::pod_mac(ip), b.mtu, bridge.index, &netns).await?;

        let addr = b.subnet.with_addr(ip);
        let pod = {
            let (ifname, gateway) = (env.ifname.clone(), gateway.addr);
            let netns = netns.try_clone().context("duplicating the netns descriptor")?;
            link::in_netns(netns, move |h| async move { link::configure_pod_iface(&h, &ifname, addr, gateway).await })
        };
        let host = async {
            let l = link::get_link(&h, &veth).await?.ok_or_else(|| anyhow!("{veth} vanished after it was created"))?;
            if b.hairpin {
                link::set_hairpin(&h, l.index, &veth).await?;
            }
            anyhow::Ok(l)
        };
        let rules = async {
            let snap = snapshot.await.context("the iptables-save task failed")??;
            let chain = netfilter::hostport_chain(b, &key);
            let hostports = if b.port_mappings.is_empty() {
                None
            } else {
                // Written first: DEL must find the chain even if we crash right after creating it.
                write_hostport_marker(b, &conf.name, &key)?;
                Some((chain.as_str(), ip))
            };
            netfilter::setup(b, &b.state_dir.join("iptables.lock"), snap, hostports).await
        };
        let (pod_mac, host, ()) = tokio::try_join!(pod, host, rules)?;
        anyhow::Ok(AddResult {
            cni_version: conf.cni_version.clone(),
            interfaces: vec![
                Interface { name: b.bridge.clone(), mac: bridge.mac.clone(), sandbox: None },
                Interface { name: veth, mac: host.mac, sandbox: None },
                Interface { name: env.ifname.clone(), mac: pod_mac, sandbox: Some(env.netns.clone()) },
            ],
            ips: vec![IpConfig::new(&conf.cni_version, 2, addr.to_string(), false, Some(gateway.addr.into()))],
            routes: vec![Route { dst: "0.0.0.0/0".into(), gw: Some(gateway.addr.into()) }],
            dns: Dns {},
        })
    };
    match attached.await {
        Ok(result) => Ok(result),
        Err(e) => {
            // Leave nothing half-done behind (the runtime's DEL would do the same).
            let _ = del(&conf.name, b, env).await;
            Err(e)
        }
    }
}

/// Tolerates every piece being gone already.
async fn del(network: &str, b: &BridgeConf, env: &Env) -> Result<()> {
    let key = attachment_key(&env.container_id, &env.ifname);
    let store = ipam::Store::open(&b.state_dir, network)?;
    let allocated = store.find(&env.container_id, &env.ifname)?;
    let marker = hostport_marker(b, network, &key);
    // Host ports are known to be absent only when the allocation is there and no marker says
    // otherwise; without that (state lost, DEL repeated) look at the rules.
    if allocated.is_none() || marker.exists() {
        netfilter::teardown_hostports(&netfilter::hostport_chain(b, &key)).await?;
        match fs::remove_file(&marker) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", marker.display()));
            }
            _ => {}
        }
    }
    let h = link::connect()?;
    link::delete_link(&h, &host_veth(&key)).await?;
    store.release(&env.container_id, &env.ifname)?;
    Ok(())
}

async fn check(conf: &Conf, b: &BridgeConf, env: &Env) -> Result<()> {
    let store = ipam::Store::open(&b.state_dir, &conf.name)?;
    let Some(ip) = store.find(&env.container_id, &env.ifname)? else {
        return Err(CniError::new(
            code::UNKNOWN_CONTAINER,
            "no address is allocated to this container",
            format!("container {} interface {}", env.container_id, env.ifname),
        )
        .into());
    };
    let addr = b.subnet.with_addr(ip);
    if let Some(prev) = &conf.prev_result {
        let listed = prev.get("ips").and_then(|v| v.as_array()).into_iter().flatten();
        if !listed.filter_map(|i| i.get("address")?.as_str()).any(|a| a == addr.to_string()) {
            bail!("prevResult does not list the allocated address {addr}");
        }
    }
    let h = link::connect()?;
    let veth = host_veth(&attachment_key(&env.container_id, &env.ifname));
    link::get_link(&h, &veth).await?.ok_or_else(|| anyhow!("host interface {veth} is missing"))?;
    let netns = File::open(&env.netns).with_context(|| format!("opening network namespace {}", env.netns))?;
    let ifname = env.ifname.clone();
    link::in_netns(netns, move |h| async move {
        let l =
            link::get_link(&h, &ifname).await?.ok_or_else(|| anyhow!("{ifname} is missing in the pod namespace"))?;
        if !link::addresses(&h, l.index).await?.contains(&(IpAddr::V4(addr.addr), addr.prefix)) {
            bail!("{ifname} does not have its address {addr}");
        }
        Ok(())
    })
    .await
}

async fn loopback_add(conf: &Conf, env: &Env) -> Result<AddResult> {
    let netns = File::open(&env.netns).with_context(|| format!("opening network namespace {}", env.netns))?;
    let addrs = link::in_netns(netns, |h| async move { link::loopback_up(&h).await }).await?;
    Ok(AddResult {
        cni_version: conf.cni_version.clone(),
        interfaces: vec![Interface {
            name: "lo".into(),
            mac: "00:00:00:00:00:00".into(),
            sandbox: Some(env.netns.clone()),
        }],
        ips: addrs
            .into_iter()
            .map(|(ip, prefix)| IpConfig::new(&conf.cni_version, 0, format!("{ip}/{prefix}"), ip.is_ipv6(), None))
            .collect(),
        routes: vec![],
        dns: Dns {},
    })
}

async fn loopback_check(env: &Env) -> Result<()> {
    let netns = File::open(&env.netns).with_context(|| format!("opening network namespace {}", env.netns))?;
    link::in_netns(netns, |h| async move {
        match link::get_link(&h, "lo").await? {
            Some(lo) if lo.up => Ok(()),
            _ => bail!("lo is not up"),
        }
    })
    .await
}

/// Writes the conflist (only if its bytes changed, atomically: tmp + rename) into conf_dir as `10-cairn.conflist`
/// and symlinks every PLUGIN_NAMES entry in bin_dir to `exe` (replacing stale links). Idempotent.
pub fn install(cfg: &NetworkConfig, exe: &Path, bin_dir: &Path, conf_dir: &Path) -> Result<()> {
    if !exe.is_absolute() {
        bail!("the plugin executable path {} is not absolute", exe.display());
    }
    let conflist = conflist(cfg)?;
    fs::create_dir_all(conf_dir).with_context(|| format!("creating {}", conf_dir.display()))?;
    write_if_changed(&conf_dir.join(CONFLIST_NAME), conflist.as_bytes())?;
    fs::create_dir_all(bin_dir).with_context(|| format!("creating {}", bin_dir.display()))?;
    for name in PLUGIN_NAMES {
        let path = bin_dir.join(name);
        if fs::read_link(&path).is_ok_and(|target| target == exe) {
            continue;
        }
        // A new link renamed over the old one (or over a plugin binary of the same name).
        let tmp = bin_dir.join(format!(".{name}.tmp"));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(exe, &tmp).with_context(|| format!("creating symlink {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    }
    Ok(())
}

/// The conflist for `cfg`, validated by parsing its plugin entry the way the plugin will see it.
fn conflist(cfg: &NetworkConfig) -> Result<String> {
    let state_dir =
        cfg.state_dir.to_str().ok_or_else(|| anyhow!("state dir {} is not UTF-8", cfg.state_dir.display()))?;
    let plugin = serde_json::json!({
        "type": spec::TYPE_BRIDGE,
        "bridge": cfg.bridge,
        "subnet": cfg.subnet.net().to_string(),
        "clusterCIDR": cfg.cluster_cidr.net().to_string(),
        "mtu": cfg.mtu,
        "hairpinMode": cfg.hairpin,
        "ipMasq": cfg.ip_masq,
        "stateDir": state_dir,
        "capabilities": { "portMappings": true },
    });
    // libcni hands each plugin the list's name and cniVersion along with its own entry.
    let mut probe = plugin.clone();
    probe["name"] = cfg.name.clone().into();
    probe["cniVersion"] = spec::LATEST_VERSION.into();
    Conf::parse(probe.to_string().as_bytes()).map_err(|e| anyhow!("invalid CNI network config: {}", e.details))?;
    let list = serde_json::json!({ "cniVersion": spec::LATEST_VERSION, "name": cfg.name, "plugins": [plugin] });
    Ok(serde_json::to_string_pretty(&list).expect("JSON values serialize") + "\n")
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
