//! CNI protocol types: environment, network configuration, results and errors (spec 1.0.0, with the
//! 0.3.x/0.4.0 result shape where the config asks for it).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Versions we speak; results are written in the version the config asks for.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];
pub const LATEST_VERSION: &str = "1.0.0";

/// The plugin type of cairn's bridge network and of the loopback network containerd adds.
pub const TYPE_BRIDGE: &str = "cairn-cni";
pub const TYPE_LOOPBACK: &str = "loopback";

const DEFAULT_BRIDGE: &str = "cni0";
const DEFAULT_MTU: u32 = 1500;
const DEFAULT_STATE_DIR: &str = "/var/lib/cni/cairn";

/// Well-known CNI error codes (spec section "Error"); 100+ are ours.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN: u32 = 11;
    /// Setting up or tearing down the network failed (netlink, iptables, state files).
    pub const FAILED: u32 = 100;
    /// The node's pod subnet has no free address.
    pub const IPAM_EXHAUSTED: u32 = 101;
}

/// A CNI error as printed on stdout. Any layer may return one wrapped in `anyhow`; the outermost
/// `CniError` in the chain decides the code (see `From<anyhow::Error>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError { code, msg: msg.into(), details: details.into() }
    }

    pub fn to_json(&self, cni_version: &str) -> String {
        serde_json::json!({ "cniVersion": cni_version, "code": self.code, "msg": self.msg, "details": self.details })
            .to_string()
    }
}

impl From<anyhow::Error> for CniError {
    fn from(e: anyhow::Error) -> Self {
        let chain = format!("{e:#}");
        match e.chain().find_map(|c| c.downcast_ref::<CniError>()) {
            Some(inner) if inner.details.is_empty() => CniError { details: chain, ..inner.clone() },
            Some(inner) => CniError { details: format!("{chain}; {}", inner.details), ..inner.clone() },
            None => CniError::new(code::FAILED, e.to_string(), chain),
        }
    }
}

/// An IPv4 network or interface address in CIDR notation (`10.42.0.0/24`, `10.42.0.7/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Self, String> {
        if prefix > 32 {
            return Err(format!("prefix length {prefix} is over 32"));
        }
        Ok(Cidr { addr, prefix })
    }

    fn mask(self) -> u32 {
        if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix) }
    }

    /// The network address (host bits cleared).
    pub fn network(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & self.mask())
    }

    pub fn broadcast(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) | !self.mask())
    }

    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network())
    }

    /// The same network, host bits cleared.
    pub fn net(self) -> Cidr {
        Cidr { addr: self.network(), prefix: self.prefix }
    }

    /// `ip` with this prefix length, e.g. the pod's interface address.
    pub fn with_addr(self, ip: Ipv4Addr) -> Cidr {
        Cidr { addr: ip, prefix: self.prefix }
    }

    /// The first subnet of length `prefix` (the network itself when it is no larger).
    pub fn first_subnet(self, prefix: u8) -> Cidr {
        Cidr { addr: self.network(), prefix: prefix.max(self.prefix).min(32) }
    }

    /// The gateway: the first address of the network.
    pub fn gateway(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network()) + 1)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s.split_once('/').ok_or_else(|| format!("{s:?} is not in CIDR notation (a.b.c.d/n)"))?;
        let addr = a.parse().map_err(|_| format!("{a:?} in {s:?} is not an IPv4 address"))?;
        let prefix = p.parse().map_err(|_| format!("{p:?} in {s:?} is not a prefix length"))?;
        Cidr::new(addr, prefix)
    }
}

/// As text (`10.42.0.0/16`), as Kubernetes writes CIDRs.
impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e| serde::de::Error::custom(format!("invalid CIDR {text:?}: {e}")))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The CNI command from `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

/// The `CNI_*` environment of one invocation. Unset variables are empty strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
}

impl Env {
    pub fn from_process() -> Env {
        let var = |k| std::env::var(k).unwrap_or_default();
        Env {
            command: var("CNI_COMMAND"),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
        }
    }

    pub fn command(&self) -> Result<Command, CniError> {
        Ok(match self.command.as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "" => return Err(invalid_env("CNI_COMMAND is not set")),
            other => return Err(invalid_env(format!("unknown CNI_COMMAND {other:?}"))),
        })
    }

    /// Checks the variables `cmd` needs. The container ID and interface name end up in file contents
    /// and interface names, so they are held to the spec's character sets.
    pub fn validate(&self, cmd: Command) -> Result<(), CniError> {
        if self.container_id.is_empty() {
            return Err(invalid_env("CNI_CONTAINERID is not set"));
        }
        if !self.container_id.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            || !self.container_id.starts_with(|c: char| c.is_ascii_alphanumeric())
        {
            return Err(invalid_env(format!("CNI_CONTAINERID {:?} has invalid characters", self.container_id)));
        }
        if self.ifname.is_empty() {
            return Err(invalid_env("CNI_IFNAME is not set"));
        }
        if self.ifname.len() > 15 || self.ifname == "." || self.ifname == ".." {
            return Err(invalid_env(format!("CNI_IFNAME {:?} is not a valid interface name", self.ifname)));
        }
        if self.ifname.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control()) {
            return Err(invalid_env(format!("CNI_IFNAME {:?} is not a valid interface name", self.ifname)));
        }
        if cmd != Command::Del && self.netns.is_empty() {
            return Err(invalid_env("CNI_NETNS is not set"));
        }
        Ok(())
    }
}

fn invalid_env(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_ENV, msg, "")
}

fn invalid_config(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, "invalid network configuration", msg)
}

/// One `runtimeConfig.portMappings` entry (the `portMappings` capability). containerd's go-cni
/// marshals its struct without JSON tags (`HostPort`, ...), which Go plugins read case-insensitively;
/// both spellings are accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    #[serde(alias = "HostPort")]
    pub host_port: u16,
    #[serde(alias = "ContainerPort")]
    pub container_port: u16,
    #[serde(default = "default_protocol", alias = "Protocol")]
    pub protocol: String,
    #[serde(default, rename = "hostIP", alias = "HostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

fn default_protocol() -> String {
    "tcp".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuntimeConfig {
    port_mappings: Option<Vec<PortMapping>>,
}

/// The plugin configuration on stdin, as libcni passes it: one plugin of a conflist with the list's
/// `name` and `cniVersion` filled in. Fields of other plugin types are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    cni_version: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "type")]
    kind: String,
    bridge: Option<String>,
    subnet: Option<String>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    mtu: Option<u32>,
    #[serde(default)]
    hairpin_mode: bool,
    #[serde(default)]
    ip_masq: bool,
    state_dir: Option<PathBuf>,
    runtime_config: Option<RuntimeConfig>,
    prev_result: Option<serde_json::Value>,
}

/// A parsed, validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Conf {
    pub cni_version: String,
    pub name: String,
    pub plugin: Plugin,
    pub prev_result: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Plugin {
    Loopback,
    Bridge(BridgeConf),
}

/// The `cairn-cni` plugin's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeConf {
    pub bridge: String,
    /// This node's pod subnet (host bits cleared); the gateway is its first address.
    pub subnet: Cidr,
    /// The whole cluster's pod network (host bits cleared).
    pub cluster: Cidr,
    pub mtu: u32,
    pub hairpin: bool,
    pub ip_masq: bool,
    pub state_dir: PathBuf,
    /// Prefix of this network's iptables chains: the upper-cased network name (`CAIRN`).
    pub chain_prefix: String,
    pub port_mappings: Vec<PortMapping>,
}

impl Conf {
    /// Parses stdin: garbage is a decoding error (code 6), a well-formed but unusable config is
    /// code 7, an unsupported `cniVersion` code 1.
    pub fn parse(stdin: &[u8]) -> Result<Conf, CniError> {
        let value: serde_json::Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(code::DECODE, "failed to decode the network configuration on stdin", e.to_string())
        })?;
        if !value.is_object() {
            return Err(CniError::new(code::DECODE, "the network configuration on stdin is not a JSON object", ""));
        }
        let raw: RawConf = serde_json::from_value(value).map_err(|e| invalid_config(e.to_string()))?;
        if !SUPPORTED_VERSIONS.contains(&raw.cni_version.as_str()) {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                "incompatible CNI version",
                format!("config version {:?}, plugin supports {}", raw.cni_version, SUPPORTED_VERSIONS.join(", ")),
            ));
        }
        let plugin = match raw.kind.as_str() {
            TYPE_LOOPBACK => Plugin::Loopback,
            TYPE_BRIDGE => Plugin::Bridge(bridge_conf(&raw)?),
            other => return Err(invalid_config(format!("unsupported plugin type {other:?}"))),
        };
        Ok(Conf { cni_version: raw.cni_version, name: raw.name, plugin, prev_result: raw.prev_result })
    }
}

fn bridge_conf(raw: &RawConf) -> Result<BridgeConf, CniError> {
    // The name names the IPAM directory and (upper-cased) the iptables chains, whose names may
    // not exceed 28 characters: `<NAME>-HP-<16 hex>` leaves 8 for the name.
    let name = &raw.name;
    if name.is_empty() || name.len() > 8 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(invalid_config(format!("network name {name:?} must be 1-8 characters of [A-Za-z0-9_-]")));
    }
    let cidr = |field: &str, v: &Option<String>| -> Result<Option<Cidr>, CniError> {
        v.as_deref().map(|s| s.parse::<Cidr>().map_err(|e| invalid_config(format!("{field}: {e}")))).transpose()
    };
    let subnet = cidr("subnet", &raw.subnet)?.ok_or_else(|| invalid_config("subnet is required"))?.net();
    if subnet.prefix > 30 {
        return Err(invalid_config(format!("subnet {subnet} is too small: it needs a gateway and a pod address")));
    }
    let cluster = cidr("clusterCIDR", &raw.cluster_cidr)?.map_or(subnet, Cidr::net);
    if cluster.prefix > subnet.prefix || !cluster.contains(subnet.addr) {
        return Err(invalid_config(format!("clusterCIDR {cluster} does not contain subnet {subnet}")));
    }
    let bridge = raw.bridge.clone().unwrap_or_else(|| DEFAULT_BRIDGE.into());
    if bridge.is_empty() || bridge.len() > 15 || bridge.chars().any(|c| c == '/' || c.is_whitespace()) {
        return Err(invalid_config(format!("bridge name {bridge:?} is not a valid interface name")));
    }
    let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
    if !(68..=65535).contains(&mtu) {
        return Err(invalid_config(format!("mtu {mtu} is out of range")));
    }
    let mut port_mappings = Vec::new();
    for pm in raw.runtime_config.iter().flat_map(|r| r.port_mappings.iter().flatten()) {
        let protocol = pm.protocol.to_ascii_lowercase();
        if !["tcp", "udp", "sctp"].contains(&protocol.as_str()) {
            return Err(invalid_config(format!("port mapping protocol {:?} is not tcp, udp or sctp", pm.protocol)));
        }
        if pm.container_port == 0 {
            return Err(invalid_config(format!("port mapping {pm:?} has no containerPort")));
        }
        // hostIP "" or 0.0.0.0 means every local address; IPv6 host IPs belong to an IPv6
        // network, which this plugin does not provide, so those mappings are skipped.
        let host_ip = match pm.host_ip.parse::<IpAddr>() {
            _ if pm.host_ip.is_empty() => String::new(),
            Ok(IpAddr::V4(ip)) if ip.is_unspecified() => String::new(),
            Ok(IpAddr::V4(ip)) => ip.to_string(),
            Ok(IpAddr::V6(_)) => continue,
            Err(_) => return Err(invalid_config(format!("port mapping hostIP {:?} is not an IP address", pm.host_ip))),
        };
        if pm.host_port != 0 {
            port_mappings.push(PortMapping { protocol, host_ip, ..pm.clone() });
        }
    }
    Ok(BridgeConf {
        bridge,
        subnet,
        cluster,
        mtu,
        hairpin: raw.hairpin_mode,
        ip_masq: raw.ip_masq,
        state_dir: raw.state_dir.clone().unwrap_or_else(|| DEFAULT_STATE_DIR.into()),
        chain_prefix: name.to_ascii_uppercase(),
        port_mappings,
    })
}

/// The VERSION command's answer.
pub fn version_json() -> String {
    serde_json::json!({ "cniVersion": LATEST_VERSION, "supportedVersions": SUPPORTED_VERSIONS }).to_string()
}

/// An ADD result (spec "Success"), written in the config's version.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddResult {
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IpConfig {
    /// "4" or "6"; only in 0.3.x/0.4.0 results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<&'static str>,
    /// Index into `interfaces`.
    pub interface: usize,
    /// Address with prefix length, e.g. `10.42.0.7/24`.
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    pub dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// Always empty: cluster DNS is configured by the kubelet side, not the CNI plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dns {}

impl IpConfig {
    /// An address entry for a result in `cni_version`.
    pub fn new(cni_version: &str, interface: usize, address: String, is_v6: bool, gateway: Option<IpAddr>) -> Self {
        let version = (cni_version != "1.0.0").then_some(if is_v6 { "6" } else { "4" });
        IpConfig { version, interface, address, gateway }
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
