//! The model → nftables translation: what the proxy's table should hold (kube-proxy's nftables
//! proxier `syncProxyRules`, pkg/proxy/nftables/proxier.go, with the same layout).
//!
//! One table, `ip cairn-proxy`:
//! - base chains `nat-prerouting` / `nat-output` (priority dstnat, the same as iptables' nat table, so
//!   DNAT is done before any filter FORWARD rule, the CNI's included) jump to `services`;
//!   `nat-postrouting` (srcnat) jumps to `masquerading`, which masquerades packets carrying
//!   [`MASQ_MARK`] (kube-proxy's bit 14; the CNI's `CAIRN-POSTRTG` uses 0x2000, so they do not mix);
//! - `filter-input`, `filter-forward`, `filter-output` (priority -110, before the nat chains and
//!   before iptables' filter table) send new connections to Services without endpoints to `reject`
//!   (through the verdict maps `no-endpoint-services` and `no-endpoint-nodeports`);
//! - `services` looks up `ip daddr . proto . port` in the verdict map `service-ips` (cluster IPs,
//!   external and LoadBalancer IPs) and `proto . port` in `service-nodeports` for the addresses of
//!   `nodeport-ips`; masquerades traffic to cluster IPs from outside the cluster CIDR;
//! - per Service port `svc-<key>` (all usable endpoints), `svl-<key>` (this node's only, for the
//!   Local policies) and `ext-<key>` (node port / external traffic: masquerade or keep the client's
//!   address); per endpoint `ep-<key>__<ip>/<port>` (hairpin masquerade, affinity, DNAT) and, with
//!   ClientIP affinity, the timeout set `aff<seconds>-<key>__<ip>/<port>` of recent clients.
//!
//! Endpoints are picked with `numgen random mod n`: the same uniform choice as iptables mode's
//! cascade of `statistic --probability 1/(n-i)` rules, in one rule.
//!
//! Rule and set text is written in the exact form `nft list table` prints it, so that the kernel's
//! state read back compares equal to what we wrote (see `nft.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use super::model::{Endpoint, ServicePort};
use crate::net::Cidr;

pub const TABLE: &str = "cairn-proxy";
pub const FAMILY: &str = "ip";
/// The mark bit asking `masquerading` to masquerade (kube-proxy's 0x4000).
pub const MASQ_MARK: &str = "0x00004000";

/// Node-wide settings of the translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub cluster_cidr: Cidr,
    /// Addresses node ports answer on (with 127.0.0.1 for localhost node ports).
    pub node_port_addresses: Vec<Ipv4Addr>,
}

impl Settings {
    /// Whether node ports answer on 127.0.0.1, which needs `route_localnet` and its guard rule.
    pub fn localhost_node_ports(&self) -> bool {
        self.node_port_addresses.iter().any(|a| a.is_loopback())
    }
}

/// A chain: its base-chain line (`type nat hook prerouting priority dstnat; policy accept;`) if it
/// is one, and its rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    pub base: Option<String>,
    pub rules: Vec<String>,
}

/// A set or map: its declaration lines and, unless the kernel fills it (affinity sets), its
/// elements, key → value (empty for a set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub map: bool,
    pub decl: Vec<String>,
    pub elements: Option<BTreeMap<String, String>>,
}

/// The content of the proxy's table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
}

impl Ruleset {
    fn chain(&mut self, name: &str, base: Option<&str>, rules: Vec<String>) {
        self.chains.insert(name.to_string(), Chain { base: base.map(str::to_string), rules });
    }

    fn set(&mut self, name: &str, map: bool, ty: &str) {
        self.sets
            .insert(name.to_string(), Set { map, decl: vec![format!("type {ty}")], elements: Some(BTreeMap::new()) });
    }

    fn element(&mut self, set: &str, key: String, value: &str) {
        if let Some(e) = self.sets.get_mut(set).and_then(|s| s.elements.as_mut()) {
            e.insert(key, value.to_string());
        }
    }
}

/// nftables' time format, as `nft list` prints a timeout (10800 → `3h`, 90 → `1m30s`).
pub fn nft_duration(secs: u32) -> String {
    let mut out = String::new();
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    for (v, unit) in [(d, "d"), (h, "h"), (m, "m"), (s, "s")] {
        if v > 0 {
            let _ = write!(out, "{v}{unit}");
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

fn ep_name(sp_key: &str, e: &Endpoint) -> String {
    format!("{sp_key}__{}/{}", e.ip, e.port)
}

const SERVICE_KEY: &str = "ipv4_addr . inet_proto . inet_service";
const NODEPORT_KEY: &str = "inet_proto . inet_service";

/// The table that `ports` (sorted by key, as `model::build` returns them) should produce.
pub fn desired(settings: &Settings, ports: &[ServicePort]) -> Ruleset {
    let mut rs = Ruleset::default();
    let cidr = settings.cluster_cidr.net();
    let base = |ty: &str, hook: &str, prio: &str| format!("type {ty} hook {hook} priority {prio}; policy accept;");
    let new = "ct state new";

    rs.chain("nat-prerouting", Some(&base("nat", "prerouting", "dstnat")), vec!["jump services".into()]);
    // nft 1.0.6 names priority -100 `dstnat` for prerouting only.
    rs.chain("nat-output", Some(&base("nat", "output", "-100")), vec!["jump services".into()]);
    rs.chain("nat-postrouting", Some(&base("nat", "postrouting", "srcnat")), vec!["jump masquerading".into()]);
    let mut input = vec![format!("{new} jump nodeport-endpoints-check"), format!("{new} jump service-endpoints-check")];
    if settings.localhost_node_ports() {
        // route_localnet lets 127.0.0.0/8 be routed off the loopback: drop what arrives for it from
        // elsewhere unless it is a reply or was DNATed (kube-proxy's KUBE-FIREWALL, CVE-2020-8558).
        input.push(
            "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status ! dnat drop"
                .into(),
        );
    }
    rs.chain("filter-input", Some(&base("filter", "input", "-110")), input);
    rs.chain(
        "filter-forward",
        Some(&base("filter", "forward", "-110")),
        vec![format!("{new} jump service-endpoints-check")],
    );
    rs.chain(
        "filter-output",
        Some(&base("filter", "output", "-110")),
        vec![format!("{new} jump service-endpoints-check"), format!("{new} jump nodeport-endpoints-check")],
    );
    rs.chain(
        "service-endpoints-check",
        None,
        vec!["ip daddr . meta l4proto . th dport vmap @no-endpoint-services".into()],
    );
    rs.chain(
        "nodeport-endpoints-check",
        None,
        vec!["ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports".into()],
    );
    rs.chain(
        "services",
        None,
        vec![
            format!("ip saddr != {cidr} ip daddr . meta l4proto . th dport @cluster-ip-ports jump mark-for-masquerade"),
            "ip daddr . meta l4proto . th dport vmap @service-ips".into(),
            "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports".into(),
        ],
    );
    rs.chain("mark-for-masquerade", None, vec![format!("meta mark set meta mark | {MASQ_MARK}")]);
    rs.chain(
        "masquerading",
        None,
        vec![
            format!("meta mark & {MASQ_MARK} == 0x00000000 return"),
            format!("meta mark set meta mark ^ {MASQ_MARK}"),
            "masquerade fully-random".into(),
        ],
    );
    // A TCP reset (nft implies `meta l4proto tcp`) refuses at once; an ICMP port-unreachable (kube-proxy's plain
    // `reject`) leaves some kernels' connect() waiting for its timeout. Others get the ICMP error.
    rs.chain("reject-chain", None, vec!["reject with tcp reset".into(), "reject".into()]);

    rs.set("service-ips", true, &format!("{SERVICE_KEY} : verdict"));
    rs.set("service-nodeports", true, &format!("{NODEPORT_KEY} : verdict"));
    rs.set("no-endpoint-services", true, &format!("{SERVICE_KEY} : verdict"));
    rs.set("no-endpoint-nodeports", true, &format!("{NODEPORT_KEY} : verdict"));
    rs.set("cluster-ip-ports", false, SERVICE_KEY);
    rs.set("nodeport-ips", false, "ipv4_addr");
    for a in &settings.node_port_addresses {
        rs.element("nodeport-ips", a.to_string(), "");
    }

    for sp in ports {
        service_port(&mut rs, cidr, sp);
    }
    rs
}

/// Chains, sets and elements of one Service port.
fn service_port(rs: &mut Ruleset, cidr: Cidr, sp: &ServicePort) {
    let key = sp.key();
    let proto = sp.protocol.nft();
    let (cluster, local) = (sp.cluster_endpoints(), sp.local_endpoints());
    let (internal, external) = (sp.internal_endpoints(), sp.external_endpoints());
    let svc = format!("svc-{key}");
    let svl = format!("svl-{key}");
    let ext = format!("ext-{key}");
    let ip_key = |ip: Ipv4Addr| format!("{ip} . {proto} . {}", sp.port);
    let np_key = |np: u16| format!("{proto} . {np}");

    let uses_cluster = (!internal.is_empty() && !sp.internal_local) || (sp.external() && !external.is_empty());
    let uses_local = (!internal.is_empty() && sp.internal_local) || (sp.external_local && !external.is_empty());
    let mut eps: Vec<&Endpoint> = Vec::new();
    if uses_cluster {
        endpoint_choice(rs, &svc, &key, &cluster, sp.affinity_timeout);
        eps.extend(&cluster);
    }
    if uses_local {
        endpoint_choice(rs, &svl, &key, &local, sp.affinity_timeout);
        eps.extend(local.iter().filter(|e| !eps.contains(e)).collect::<Vec<_>>());
    }
    for e in eps {
        let name = ep_name(&key, e);
        let mut rules = vec![format!("ip saddr {} jump mark-for-masquerade", e.ip)];
        if let Some(t) = sp.affinity_timeout {
            let set = format!("aff{t}-{name}");
            rs.sets.insert(
                set.clone(),
                Set {
                    map: false,
                    decl: vec![
                        "type ipv4_addr".into(),
                        "size 65535".into(),
                        "flags dynamic,timeout".into(),
                        format!("timeout {}", nft_duration(t)),
                    ],
                    elements: None,
                },
            );
            rules.push(format!("update @{set} {{ ip saddr }}"));
        }
        rules.push(format!("meta l4proto {proto} dnat to {}:{}", e.ip, e.port));
        rs.chain(&format!("ep-{name}"), None, rules);
    }

    if sp.external() && !external.is_empty() {
        let rules = if sp.external_local {
            vec![
                // Pods may use any endpoint; the node itself too, masqueraded (kube-proxy's short cuts).
                format!("ip saddr {cidr} goto {svc}"),
                "fib saddr type local jump mark-for-masquerade".into(),
                format!("fib saddr type local goto {svc}"),
                // Traffic from outside keeps its source address and stays on this node.
                format!("goto {svl}"),
            ]
        } else {
            vec!["jump mark-for-masquerade".into(), format!("goto {svc}")]
        };
        rs.chain(&ext, None, rules);
    }

    // Dispatch, or the verdict for connections that have nowhere to go.
    let (internal_target, no_internal) = if cluster.is_empty() {
        (None, "goto reject-chain")
    } else if internal.is_empty() {
        (None, "drop")
    } else {
        (Some(if sp.internal_local { &svl } else { &svc }), "")
    };
    match internal_target {
        Some(t) => {
            rs.element("service-ips", ip_key(sp.cluster_ip), &format!("goto {t}"));
            rs.element("cluster-ip-ports", ip_key(sp.cluster_ip), "");
        }
        None => rs.element("no-endpoint-services", ip_key(sp.cluster_ip), no_internal),
    }
    let no_external = if cluster.is_empty() { "goto reject-chain" } else { "drop" };
    for ip in &sp.external_ips {
        if external.is_empty() {
            rs.element("no-endpoint-services", ip_key(*ip), no_external);
        } else {
            rs.element("service-ips", ip_key(*ip), &format!("goto {ext}"));
        }
    }
    if let Some(np) = sp.node_port {
        if external.is_empty() {
            rs.element("no-endpoint-nodeports", np_key(np), no_external);
        } else {
            rs.element("service-nodeports", np_key(np), &format!("goto {ext}"));
        }
    }
}

/// The chain choosing among `eps` (not empty): clients with affinity first, then a random pick.
fn endpoint_choice(rs: &mut Ruleset, chain: &str, key: &str, eps: &[&Endpoint], affinity: Option<u32>) {
    let mut rules = Vec::new();
    if let Some(t) = affinity {
        for e in eps {
            let name = ep_name(key, e);
            rules.push(format!("ip saddr @aff{t}-{name} goto ep-{name}"));
        }
    }
    if let [e] = eps {
        rules.push(format!("goto ep-{}", ep_name(key, e)));
    } else {
        let arms: Vec<String> =
            eps.iter().enumerate().map(|(i, e)| format!("{i} : goto ep-{}", ep_name(key, e))).collect();
        rules.push(format!("numgen random mod {} vmap {{ {} }}", eps.len(), arms.join(", ")));
    }
    rs.chain(chain, None, rules);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::Protocol;

    fn settings() -> Settings {
        Settings {
            cluster_cidr: "10.42.0.0/16".parse().unwrap(),
            node_port_addresses: vec![Ipv4Addr::new(192, 168, 1, 10), Ipv4Addr::LOCALHOST],
        }
    }

    fn ep(last: u8, local: bool) -> Endpoint {
        Endpoint {
            ip: Ipv4Addr::new(10, 42, 0, last),
            port: 8080,
            ready: true,
            serving: true,
            terminating: false,
            local,
        }
    }

    fn port(eps: Vec<Endpoint>) -> ServicePort {
        ServicePort {
            namespace: "ns".into(),
            service: "web".into(),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 80,
            node_port: None,
            external_ips: vec![],
            affinity_timeout: None,
            external_local: false,
            internal_local: false,
            endpoints: eps,
        }
    }

    fn elements<'a>(rs: &'a Ruleset, set: &str) -> &'a BTreeMap<String, String> {
        rs.sets[set].elements.as_ref().unwrap()
    }

    fn rules<'a>(rs: &'a Ruleset, chain: &str) -> &'a [String] {
        &rs.chains.get(chain).unwrap_or_else(|| panic!("no chain {chain}")).rules
    }

    #[test]
    fn cluster_ip_spreads_and_hairpins() {
        let rs = desired(&settings(), &[port(vec![ep(1, true), ep(2, false)])]);
        assert_eq!(elements(&rs, "service-ips")["10.96.0.10 . tcp . 80"], "goto svc-ns/web/tcp/http");
        assert!(elements(&rs, "cluster-ip-ports").contains_key("10.96.0.10 . tcp . 80"));
        assert_eq!(
            rules(&rs, "svc-ns/web/tcp/http"),
            [
                "numgen random mod 2 vmap { 0 : goto ep-ns/web/tcp/http__10.42.0.1/8080, 1 : goto ep-ns/web/tcp/http__10.42.0.2/8080 }"
            ]
        );
        assert_eq!(
            rules(&rs, "ep-ns/web/tcp/http__10.42.0.2/8080"),
            ["ip saddr 10.42.0.2 jump mark-for-masquerade", "meta l4proto tcp dnat to 10.42.0.2:8080"]
        );
        assert!(
            rules(&rs, "services")[0].starts_with("ip saddr != 10.42.0.0/16 "),
            "outside the cluster CIDR: masquerade"
        );
        assert!(elements(&rs, "no-endpoint-services").is_empty());
        assert!(!rs.chains.contains_key("svl-ns/web/tcp/http") && !rs.chains.contains_key("ext-ns/web/tcp/http"));
    }

    #[test]
    fn affinity_sets_and_checks() {
        let mut sp = port(vec![ep(1, true), ep(2, false)]);
        sp.affinity_timeout = Some(10_800);
        let rs = desired(&settings(), &[sp]);
        let set = "aff10800-ns/web/tcp/http__10.42.0.1/8080";
        assert_eq!(rs.sets[set].decl, ["type ipv4_addr", "size 65535", "flags dynamic,timeout", "timeout 3h"]);
        assert_eq!(rs.sets[set].elements, None);
        let svc = rules(&rs, "svc-ns/web/tcp/http");
        assert_eq!(svc[0], format!("ip saddr @{set} goto ep-ns/web/tcp/http__10.42.0.1/8080"));
        assert!(svc[2].starts_with("numgen random mod 2 "));
        assert_eq!(rules(&rs, "ep-ns/web/tcp/http__10.42.0.1/8080")[1], format!("update @{set} {{ ip saddr }}"));
        assert_eq!(nft_duration(90), "1m30s");
        assert_eq!(nft_duration(86_400), "1d");
    }

    #[test]
    fn no_endpoints_reject_everywhere() {
        let mut sp = port(vec![]);
        sp.node_port = Some(30080);
        sp.external_ips = vec![Ipv4Addr::new(192, 168, 1, 10)];
        let rs = desired(&settings(), &[sp]);
        let none = elements(&rs, "no-endpoint-services");
        assert_eq!(none["10.96.0.10 . tcp . 80"], "goto reject-chain");
        assert_eq!(none["192.168.1.10 . tcp . 80"], "goto reject-chain");
        assert_eq!(elements(&rs, "no-endpoint-nodeports")["tcp . 30080"], "goto reject-chain");
        assert!(elements(&rs, "service-ips").is_empty() && elements(&rs, "service-nodeports").is_empty());
        assert!(!rs.chains.keys().any(|c| c.contains("ns/web")), "no service chains");
    }

    #[test]
    fn external_local_policy_and_lb_ingress() {
        let mut sp = port(vec![ep(1, true), ep(2, false)]);
        sp.node_port = Some(30080);
        sp.external_ips = vec![Ipv4Addr::new(192, 168, 1, 10)];
        sp.external_local = true;
        let rs = desired(&settings(), &[sp.clone()]);
        assert_eq!(elements(&rs, "service-nodeports")["tcp . 30080"], "goto ext-ns/web/tcp/http");
        assert_eq!(elements(&rs, "service-ips")["192.168.1.10 . tcp . 80"], "goto ext-ns/web/tcp/http");
        assert_eq!(elements(&rs, "service-ips")["10.96.0.10 . tcp . 80"], "goto svc-ns/web/tcp/http");
        let ext = rules(&rs, "ext-ns/web/tcp/http");
        assert_eq!(ext.last().unwrap(), "goto svl-ns/web/tcp/http");
        assert!(!ext.iter().any(|r| r == "jump mark-for-masquerade"), "outside clients keep their address");
        assert_eq!(rules(&rs, "svl-ns/web/tcp/http"), ["goto ep-ns/web/tcp/http__10.42.0.1/8080"]);
        // Node ports answer on 127.0.0.1, guarded.
        assert!(elements(&rs, "nodeport-ips").contains_key("127.0.0.1"));
        assert!(rules(&rs, "filter-input").iter().any(|r| r.starts_with("ip daddr 127.0.0.0/8 ")));

        // No local endpoint: external traffic is dropped, the cluster IP still works.
        sp.endpoints = vec![ep(2, false)];
        let rs = desired(&settings(), &[sp.clone()]);
        assert_eq!(elements(&rs, "no-endpoint-nodeports")["tcp . 30080"], "drop");
        assert_eq!(elements(&rs, "no-endpoint-services")["192.168.1.10 . tcp . 80"], "drop");
        assert!(elements(&rs, "service-ips").contains_key("10.96.0.10 . tcp . 80"));

        // Cluster policy: masquerade, all endpoints.
        sp.external_local = false;
        let rs = desired(&settings(), &[sp]);
        assert_eq!(rules(&rs, "ext-ns/web/tcp/http"), ["jump mark-for-masquerade", "goto svc-ns/web/tcp/http"]);
    }

    #[test]
    fn internal_local_policy() {
        let mut sp = port(vec![ep(1, true), ep(2, false)]);
        sp.internal_local = true;
        let rs = desired(&settings(), &[sp.clone()]);
        assert_eq!(elements(&rs, "service-ips")["10.96.0.10 . tcp . 80"], "goto svl-ns/web/tcp/http");
        assert!(!rs.chains.contains_key("svc-ns/web/tcp/http"));
        assert!(!rs.chains.contains_key("ep-ns/web/tcp/http__10.42.0.2/8080"));
        sp.endpoints = vec![ep(2, false)];
        let rs = desired(&settings(), &[sp]);
        assert_eq!(elements(&rs, "no-endpoint-services")["10.96.0.10 . tcp . 80"], "drop");
    }

    #[test]
    fn terminating_endpoints_when_none_ready() {
        let mut e = ep(3, false);
        (e.ready, e.terminating) = (false, true);
        let mut gone = ep(4, false);
        (gone.ready, gone.serving, gone.terminating) = (false, false, true);
        let rs = desired(&settings(), &[port(vec![e, gone])]);
        assert_eq!(rules(&rs, "svc-ns/web/tcp/http"), ["goto ep-ns/web/tcp/http__10.42.0.3/8080"]);
    }

    #[test]
    fn removing_a_service_leaves_only_the_base() {
        let base = desired(&settings(), &[]);
        let mut sp = port(vec![ep(1, true)]);
        sp.node_port = Some(30080);
        sp.affinity_timeout = Some(60);
        let with = desired(&settings(), &[sp]);
        assert!(with.chains.len() > base.chains.len() && with.sets.len() > base.sets.len());
        assert_eq!(desired(&settings(), &[]), base);
        assert!(base.sets.values().all(|s| s.elements.as_ref().is_none_or(|e| e.len() <= 2)));
        // Without localhost node ports there is no guard rule.
        let s = Settings { node_port_addresses: vec![Ipv4Addr::new(192, 168, 1, 10)], ..settings() };
        assert_eq!(desired(&s, &[]).chains["filter-input"].rules.len(), 2);
    }
}
