//! What the proxy knows of the cluster: each Service port with its endpoints, read from Service
//! and `discovery.k8s.io/v1` EndpointSlice objects as kube-proxy's `ServicePortInfo` and
//! `endpointsInfo` are (pkg/proxy/servicechangetracker.go, endpointslicecache.go).
//!
//! Only IPv4 is modelled: cairn's pod network and its proxy table are IPv4.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The label of Services that another proxy implementation handles.
pub const OTHER_PROXY_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when it is not set (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The name nftables gives it (`inet_proto`).
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One endpoint of one Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node (`nodeName` is ours).
    pub local: bool,
}

/// One port of a Service that gets rules (kube-proxy's `ServicePort`), with its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub namespace: String,
    pub service: String,
    /// The port's name; empty for a Service's only, unnamed port.
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub node_port: Option<u16>,
    /// `spec.externalIPs` and `status.loadBalancer.ingress[].ip` (but not those with `ipMode: Proxy`).
    pub external_ips: Vec<Ipv4Addr>,
    /// ClientIP affinity timeout in seconds; `None` when `sessionAffinity` is `None`.
    pub affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local` on a Service reachable from outside (node port or external IPs).
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// A name unique among the ports of all Services: `<namespace>/<service>/<proto>/<port name or number>`.
    pub fn key(&self) -> String {
        let port = if self.port_name.is_empty() { format!("p{}", self.port) } else { self.port_name.clone() };
        format!("{}/{}/{}/{}", self.namespace, self.service, self.protocol.nft(), port)
    }

    /// Whether it is reachable from outside the cluster network (kube-proxy's `ExternallyAccessible`).
    pub fn external(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty()
    }

    /// Endpoints traffic may go to from anywhere (pkg/proxy/topology.go `CategorizeEndpoints`,
    /// without topology hints): the ready ones, or when none is ready, those serving while terminating.
    pub fn cluster_endpoints(&self) -> Vec<&Endpoint> {
        usable(self.endpoints.iter())
    }

    /// The same choice among this node's endpoints.
    pub fn local_endpoints(&self) -> Vec<&Endpoint> {
        usable(self.endpoints.iter().filter(|e| e.local))
    }

    /// Endpoints of traffic to the cluster IP (`internalTrafficPolicy`).
    pub fn internal_endpoints(&self) -> Vec<&Endpoint> {
        if self.internal_local { self.local_endpoints() } else { self.cluster_endpoints() }
    }

    /// Endpoints of traffic to a node port or external IP (`externalTrafficPolicy`).
    pub fn external_endpoints(&self) -> Vec<&Endpoint> {
        if self.external_local { self.local_endpoints() } else { self.cluster_endpoints() }
    }
}

fn usable<'a>(eps: impl Iterator<Item = &'a Endpoint> + Clone) -> Vec<&'a Endpoint> {
    let ready: Vec<&Endpoint> = eps.clone().filter(|e| e.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    eps.filter(|e| e.serving && e.terminating).collect()
}

/// The Service ports that get rules, with their endpoints, sorted by key. ExternalName and
/// headless Services (and those without an IPv4 cluster IP) have none.
pub fn build(services: &[&Service], slices: &[&EndpointSlice], node_name: &str) -> Vec<ServicePort> {
    // Slices by (namespace, service name).
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        let (Some(ns), Some(name)) =
            (s.metadata.namespace.as_deref(), s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)))
        else {
            continue;
        };
        if s.address_type == "IPv4" {
            by_service.entry((ns, name.as_str())).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for svc in services {
        let (Some(ns), Some(name), Some(spec)) =
            (svc.metadata.namespace.as_deref(), svc.metadata.name.as_deref(), svc.spec.as_ref())
        else {
            continue;
        };
        // Services another proxy implementation handles are not ours (kube-proxy skips them too).
        let other_proxy = svc.metadata.labels.as_ref().is_some_and(|l| l.contains_key(OTHER_PROXY_LABEL));
        if spec.type_.as_deref() == Some("ExternalName") || other_proxy {
            continue;
        }
        let Some(cluster_ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse::<Ipv4Addr>().ok()) else {
            continue; // headless ("None"), not yet allocated, or IPv6
        };
        let mut external_ips: Vec<Ipv4Addr> =
            spec.external_ips.iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
        if spec.type_.as_deref() == Some("LoadBalancer") {
            let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
            external_ips.extend(
                ingress
                    .into_iter()
                    .flatten()
                    .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                    .filter_map(|i| i.ip.as_deref()?.parse::<Ipv4Addr>().ok()),
            );
        }
        external_ips.sort();
        external_ips.dedup();
        let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
        });
        let node_ports_allowed = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
        let slices = by_service.get(&(ns, name)).map(Vec::as_slice).unwrap_or_default();
        for p in spec.ports.iter().flatten() {
            let (Some(protocol), Ok(port)) = (Protocol::parse(p.protocol.as_deref()), u16::try_from(p.port)) else {
                continue;
            };
            let node_port = p.node_port.filter(|_| node_ports_allowed).and_then(|n| u16::try_from(n).ok());
            let mut sp = ServicePort {
                namespace: ns.to_string(),
                service: name.to_string(),
                port_name: p.name.clone().unwrap_or_default(),
                protocol,
                cluster_ip,
                port,
                node_port,
                external_ips: external_ips.clone(),
                affinity_timeout,
                external_local: false,
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                endpoints: Vec::new(),
            };
            sp.external_local = sp.external() && spec.external_traffic_policy.as_deref() == Some("Local");
            sp.endpoints = endpoints(&sp, slices, node_name);
            out.push(sp);
        }
    }
    out.sort_by_key(ServicePort::key);
    out
}

/// The endpoints of `sp` in its Service's slices: a slice port matches by name and protocol, and
/// gives the target port (named target ports are resolved per pod by the EndpointSlice controller).
fn endpoints(sp: &ServicePort, slices: &[&EndpointSlice], node_name: &str) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = Vec::new();
    for s in slices {
        let port = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == sp.port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(sp.protocol)
        });
        let Some(port) = port.and_then(|p| p.port).and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            // kube-proxy uses the first address only.
            let Some(ip) = e.addresses.first().and_then(|a| a.parse::<Ipv4Addr>().ok()) else {
                continue;
            };
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let ep = Endpoint {
                ip,
                port,
                ready,
                serving: c.and_then(|c| c.serving).unwrap_or(ready),
                terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                local: e.node_name.as_deref() == Some(node_name),
            };
            // The same endpoint in two slices (while the controller moves it): keep the first.
            if !out.iter().any(|o| o.ip == ep.ip && o.port == ep.port) {
                out.push(ep);
            }
        }
    }
    out.sort_by_key(|e| (e.ip, e.port));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn named_ports_conditions_and_skipped_kinds() {
        let web = svc(json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "type": "LoadBalancer", "sessionAffinity": "ClientIP",
                     "externalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80, "targetPort": "web", "nodePort": 30080},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.168.1.5"}, {"ip": "192.168.1.6", "ipMode": "Proxy"}]}}
        }));
        let headless = svc(json!({"metadata": {"namespace": "ns", "name": "h"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
        let ext = svc(json!({"metadata": {"namespace": "ns", "name": "x"},
            "spec": {"type": "ExternalName", "externalName": "example.org", "ports": [{"port": 80}]}}));
        let s1 = slice(json!({
            "metadata": {"namespace": "ns", "name": "web-a", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": [
                {"addresses": ["10.42.0.5"], "nodeName": "n1", "conditions": {"ready": true}},
                {"addresses": ["10.42.1.5"], "nodeName": "n2", "conditions": {"ready": false, "serving": true, "terminating": true}},
            ]
        }));
        // Another slice whose pods name the target port differently.
        let s2 = slice(json!({
            "metadata": {"namespace": "ns", "name": "web-b", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 9090, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.42.0.6"], "nodeName": "n1"}]
        }));
        let ports = build(&[&web, &headless, &ext], &[&s1, &s2], "n1");
        assert_eq!(ports.len(), 2);
        let (http, dns) = (&ports[0], &ports[1]);
        assert_eq!(http.key(), "ns/web/tcp/http");
        assert_eq!(http.node_port, Some(30080));
        assert_eq!(http.external_ips, vec![Ipv4Addr::new(192, 168, 1, 5)]);
        assert_eq!(http.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert!(http.external_local && !http.internal_local);
        let eps: Vec<(String, u16, bool)> =
            http.endpoints.iter().map(|e| (e.ip.to_string(), e.port, e.local)).collect();
        assert_eq!(
            eps,
            [("10.42.0.5".into(), 8080, true), ("10.42.0.6".into(), 9090, true), ("10.42.1.5".into(), 8080, false)]
        );
        assert_eq!(http.cluster_endpoints().len(), 2, "the terminating endpoint is left out while others are ready");
        assert_eq!(dns.key(), "ns/web/udp/dns");
        assert_eq!(dns.endpoints.iter().map(|e| e.port).collect::<Vec<_>>(), [5353, 5353]);
    }

    #[test]
    fn terminating_fallback() {
        let ep = |ip: u8, ready, serving, terminating, local| Endpoint {
            ip: Ipv4Addr::new(10, 42, 0, ip),
            port: 80,
            ready,
            serving,
            terminating,
            local,
        };
        let mut sp = ServicePort {
            namespace: "ns".into(),
            service: "s".into(),
            port_name: String::new(),
            protocol: Protocol::Tcp,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            port: 80,
            node_port: None,
            external_ips: vec![],
            affinity_timeout: None,
            external_local: false,
            internal_local: false,
            endpoints: vec![
                ep(1, false, true, true, false),
                ep(2, false, false, true, true),
                ep(3, false, true, false, true),
            ],
        };
        assert_eq!(sp.key(), "ns/s/tcp/p80");
        let ips = |v: Vec<&Endpoint>| v.iter().map(|e| e.ip.octets()[3]).collect::<Vec<_>>();
        // None ready: the serving terminating ones (not the serving non-terminating one: it is not ready).
        assert_eq!(ips(sp.cluster_endpoints()), [1]);
        assert_eq!(ips(sp.local_endpoints()), Vec::<u8>::new());
        sp.endpoints.push(ep(4, true, true, false, false));
        assert_eq!(ips(sp.cluster_endpoints()), [4]);
    }
}
