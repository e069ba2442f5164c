//! The cluster's DNS records, as CoreDNS's kubernetes plugin serves them (plugin/kubernetes:
//! `parseRequest`, `findServices`, `findPods` in `pods insecure` mode, `serviceRecordForIP`), built
//! once per change of the watched objects into an immutable [`RecordSet`] that queries read without
//! locking.
//!
//! Names, below the cluster domain:
//! - `svc.ns.svc`: A/AAAA of the ClusterIPs; of every ready endpoint for a headless Service; a CNAME
//!   to `externalName` for an ExternalName Service.
//! - `endpoint.svc.ns.svc`: one endpoint, named by its `hostname` or its address with dashes.
//! - `_port._proto.svc.ns.svc`: SRV per matching named port (the plain service name answers SRV for
//!   every port), targets the service name or, headless, each endpoint's name, with the addresses as
//!   additional records.
//! - `a-b-c-d.ns.pod`: the address spelled in the name, for any existing namespace.
//! - PTR under in-addr.arpa / ip6.arpa for ClusterIPs and endpoint addresses.
//!
//! A name inside the domain that does not exist is NXDOMAIN, an existing one without records of the
//! type asked is NODATA; both carry the zone's SOA in the authority section. Every record has
//! CoreDNS's default TTL of 5 s.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// CoreDNS's kubernetes plugin default `ttl`.
pub const TTL: u32 = 5;
/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A record set could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster domain {domain:?} is not a valid DNS name: {source}")]
    Domain {
        domain: String,
        #[source]
        source: hickory_server::proto::ProtoError,
    },
}

/// One port of a Service or of an endpoint (EndpointSlice ports).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Port {
    /// Lowercase; empty when unnamed.
    name: String,
    /// Lowercase `tcp`, `udp` or `sctp`.
    protocol: String,
    port: u16,
}

impl Port {
    /// CoreDNS's `matchPortAndProtocol`: an empty wanted port or protocol matches any.
    fn matches(&self, port: &str, protocol: &str) -> bool {
        (port.is_empty() || port == self.name) && (protocol.is_empty() || protocol == self.protocol)
    }
}

#[derive(Debug)]
struct Endpoint {
    /// `hostname`, else the address with dashes (CoreDNS's `endpointHostname`), lowercase.
    label: String,
    /// `label.svc.ns.svc.<domain>.`
    name: Name,
    ip: IpAddr,
    /// Empty when the slices list none: the endpoint still answers A/AAAA (CoreDNS's placeholder
    /// port), never SRV.
    ports: Vec<Port>,
}

#[derive(Debug)]
enum Kind {
    ClusterIp(Vec<IpAddr>),
    Headless,
    External(Name),
}

#[derive(Debug)]
struct Entry {
    /// `svc.ns.svc.<domain>.`
    name: Name,
    kind: Kind,
    ports: Vec<Port>,
    endpoints: Vec<Endpoint>,
}

/// What a query gets from the record set.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// Not the cluster's name: ask the upstream resolvers.
    Forward,
    /// The cluster's answer, authoritative.
    Answer(Answer),
    /// An ExternalName Service asked for an address: `cname`, followed by `target`'s records of the
    /// same type, resolved as any other name (CoreDNS's upstream lookup of the CNAME target).
    Alias { cname: Box<Record>, target: Name },
}

/// An authoritative answer's sections.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    /// The zone's SOA for NXDOMAIN and NODATA.
    pub authority: Vec<Record>,
    pub additionals: Vec<Record>,
}

/// One snapshot of the cluster's names. Immutable: a change builds a new one.
#[derive(Debug)]
pub struct RecordSet {
    domain: Name,
    serial: u32,
    namespaces: HashSet<String>,
    /// namespace → service name → entry.
    services: HashMap<String, HashMap<String, Entry>>,
    reverse: HashMap<IpAddr, Name>,
}

/// What a name below `svc`/`pod` asked for, as CoreDNS's `recordRequest`.
struct Request<'a> {
    port: &'a str,
    protocol: &'a str,
    endpoint: Option<&'a str>,
}

/// A service or endpoint record before it is shaped for the query type (CoreDNS's `msg.Service`).
struct Hit<'a> {
    host: Host<'a>,
    port: Option<u16>,
    /// The SRV target and the owner of the additional address record.
    key: &'a Name,
}

enum Host<'a> {
    Ip(IpAddr),
    Name(&'a Name),
}

fn lower(s: &str) -> String {
    s.to_ascii_lowercase()
}

fn dashed(ip: &IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

impl RecordSet {
    /// An empty set for `domain` (no namespaces: every cluster name is NXDOMAIN).
    pub fn empty(domain: &str) -> Result<Self, Error> {
        Self::build(domain, 0, [], [], [])
    }

    /// Builds the set from the watched objects. `serial` is the SOA serial (CoreDNS: the time of
    /// the last change, in seconds). Namespaces holding a Service count as existing even when the
    /// Namespace list lacks them.
    pub fn build<'a>(
        domain: &str,
        serial: u32,
        namespaces: impl IntoIterator<Item = &'a Namespace>,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Result<Self, Error> {
        let domain_name = Name::from_ascii(format!("{}.", lower(domain).trim_end_matches('.')))
            .map_err(|source| Error::Domain { domain: domain.to_string(), source })?;
        let domain_text = domain_name.to_ascii();
        let mut set = RecordSet {
            domain: domain_name,
            serial,
            namespaces: namespaces.into_iter().filter_map(|n| n.metadata.name.as_deref().map(lower)).collect(),
            services: HashMap::new(),
            reverse: HashMap::new(),
        };
        let mut publish_not_ready = HashSet::new();
        for svc in services {
            let (Some(ns), Some(name)) = (svc.metadata.namespace.as_deref(), svc.metadata.name.as_deref()) else {
                continue;
            };
            let (ns, name) = (lower(ns), lower(name));
            let Ok(fqdn) = Name::from_ascii(format!("{name}.{ns}.svc.{domain_text}")) else {
                tracing::debug!("service {ns}/{name} has no valid DNS name; it gets no records");
                continue;
            };
            let spec = svc.spec.clone().unwrap_or_default();
            let kind = if spec.type_.as_deref() == Some("ExternalName") {
                let target = spec.external_name.as_deref().unwrap_or_default();
                // CoreDNS answers only a name here; an address in externalName gets nothing.
                match Name::from_ascii(format!("{}.", target.trim_end_matches('.'))) {
                    Ok(t) if target.parse::<IpAddr>().is_err() && !target.is_empty() => Kind::External(t),
                    _ => continue,
                }
            } else {
                let ips = spec
                    .cluster_ips
                    .clone()
                    .filter(|v| !v.is_empty())
                    .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]));
                let ips = ips.unwrap_or_default();
                if ips.iter().any(|ip| ip == "None") {
                    Kind::Headless
                } else {
                    Kind::ClusterIp(ips.iter().filter_map(|ip| ip.parse().ok()).collect())
                }
            };
            let ports = spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    Some(Port {
                        name: lower(p.name.as_deref().unwrap_or_default()),
                        protocol: lower(p.protocol.as_deref().unwrap_or("TCP")),
                        port: u16::try_from(p.port).ok()?,
                    })
                })
                .collect();
            if let Kind::ClusterIp(ips) = &kind {
                for ip in ips {
                    set.reverse.entry(*ip).or_insert_with(|| fqdn.clone());
                }
            }
            if spec.publish_not_ready_addresses == Some(true) {
                publish_not_ready.insert((ns.clone(), name.clone()));
            }
            set.namespaces.insert(ns.clone());
            set.services.entry(ns).or_default().insert(name, Entry { name: fqdn, kind, ports, endpoints: Vec::new() });
        }
        for slice in slices {
            set.add_slice(slice, &publish_not_ready, &domain_text);
        }
        Ok(set)
    }

    fn add_slice(&mut self, slice: &EndpointSlice, publish_not_ready: &HashSet<(String, String)>, domain: &str) {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            return;
        }
        let Some(ns) = slice.metadata.namespace.as_deref().map(lower) else { return };
        let Some(svc) = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).map(|s| lower(s)) else {
            return;
        };
        let Some(entry) = self.services.get_mut(&ns).and_then(|m| m.get_mut(&svc)) else { return };
        if matches!(entry.kind, Kind::External(_)) {
            return;
        }
        let all = publish_not_ready.contains(&(ns.clone(), svc.clone()));
        let ports: Vec<Port> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(Port {
                    name: lower(p.name.as_deref().unwrap_or_default()),
                    protocol: lower(p.protocol.as_deref().unwrap_or("TCP")),
                    port: u16::try_from(p.port?).ok()?,
                })
            })
            .collect();
        for ep in slice.endpoints.iter().flatten() {
            // A missing condition reads as ready (EndpointSlice API); publishNotReadyAddresses
            // publishes every endpoint.
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready && !all {
                continue;
            }
            for ip in ep.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                let label = ep.hostname.as_deref().map(lower).unwrap_or_else(|| dashed(&ip));
                let Ok(name) = Name::from_ascii(format!("{label}.{svc}.{ns}.svc.{domain}")) else { continue };
                self.reverse.entry(ip).or_insert_with(|| name.clone());
                entry.endpoints.push(Endpoint { label, name, ip, ports: ports.clone() });
            }
        }
    }

    /// How many Services the set holds.
    pub fn service_count(&self) -> usize {
        self.services.values().map(HashMap::len).sum()
    }

    /// The zone's SOA, as CoreDNS writes it for the kubernetes zone.
    pub fn soa(&self) -> Record {
        let mname = Name::from_ascii("ns.dns").and_then(|n| n.append_domain(&self.domain));
        let rname = Name::from_ascii("hostmaster").and_then(|n| n.append_domain(&self.domain));
        let soa = SOA::new(
            mname.unwrap_or_else(|_| self.domain.clone()),
            rname.unwrap_or_else(|_| self.domain.clone()),
            self.serial,
            7200,
            1800,
            86400,
            TTL,
        );
        Record::from_rdata(self.domain.clone(), TTL, RData::SOA(soa))
    }

    fn answer(&self, rcode: ResponseCode, answers: Vec<Record>, additionals: Vec<Record>) -> Lookup {
        let authority = if answers.is_empty() { vec![self.soa()] } else { Vec::new() };
        Lookup::Answer(Answer { rcode, answers, authority, additionals })
    }

    fn nxdomain(&self) -> Lookup {
        self.answer(ResponseCode::NXDomain, Vec::new(), Vec::new())
    }

    fn nodata(&self) -> Lookup {
        self.answer(ResponseCode::NoError, Vec::new(), Vec::new())
    }

    /// Answers `qname` of type `qtype`. Never fails: malformed names inside the domain are NXDOMAIN.
    pub fn lookup(&self, qname: &Name, qtype: RecordType) -> Lookup {
        if let Some(ptr) = self.reverse_lookup(qname, qtype) {
            return ptr;
        }
        if !self.domain.zone_of(qname) {
            return Lookup::Forward;
        }
        let below = usize::from(qname.num_labels().saturating_sub(self.domain.num_labels()));
        let labels: Vec<String> =
            qname.iter().take(below).map(|l| String::from_utf8_lossy(l).to_ascii_lowercase()).collect();
        let Some((kind, rest)) = labels.split_last() else {
            return self.apex(qname, qtype);
        };
        let Some((ns, rest)) = rest.split_last() else {
            // `svc.<domain>` and `pod.<domain>` exist, without records.
            return if kind == "svc" || kind == "pod" { self.nodata() } else { self.nxdomain() };
        };
        if (kind != "svc" && kind != "pod") || !self.namespaces.contains(ns) {
            return self.nxdomain();
        }
        let Some((service, rest)) = rest.split_last() else { return self.nodata() };
        if kind == "pod" {
            return if rest.is_empty() { self.pod(qname, qtype, service) } else { self.nxdomain() };
        }
        let strip = |s: &'_ str| s.strip_prefix('_').unwrap_or(s).to_string();
        let (port, protocol, endpoint) = match rest {
            [] => (String::new(), String::new(), None),
            [endpoint] => (String::new(), String::new(), Some(endpoint.as_str())),
            [port, protocol] => (strip(port), strip(protocol), None),
            _ => return self.nxdomain(),
        };
        let Some(entry) = self.services.get(ns).and_then(|m| m.get(service)) else { return self.nxdomain() };
        let req = Request { port: &port, protocol: &protocol, endpoint };
        let Some(hits) = hits(entry, &req) else { return self.nxdomain() };
        self.shape(qname, qtype, &hits)
    }

    fn apex(&self, qname: &Name, qtype: RecordType) -> Lookup {
        match qtype {
            RecordType::SOA => self.answer(ResponseCode::NoError, vec![self.soa()], Vec::new()),
            RecordType::NS => {
                let ns = Name::from_ascii("ns.dns").and_then(|n| n.append_domain(&self.domain));
                match ns {
                    Ok(ns) => self.answer(
                        ResponseCode::NoError,
                        vec![Record::from_rdata(qname.clone(), TTL, RData::NS(NS(ns)))],
                        Vec::new(),
                    ),
                    Err(_) => self.nodata(),
                }
            }
            _ => self.nodata(),
        }
    }

    /// `a-b-c-d.ns.pod.<domain>` (CoreDNS `pods insecure`): the address the name spells.
    fn pod(&self, qname: &Name, qtype: RecordType, label: &str) -> Lookup {
        let ip: Option<IpAddr> = if label.matches('-').count() == 3 && !label.contains("--") {
            label.replace('-', ".").parse::<Ipv4Addr>().ok().map(IpAddr::V4)
        } else {
            label.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
        };
        let Some(ip) = ip else { return self.nxdomain() };
        let answers = address_record(qname, qtype, ip).into_iter().collect();
        self.answer(ResponseCode::NoError, answers, Vec::new())
    }

    /// PTR for a ClusterIP or an endpoint address; `None` (not ours: forwarded, as k3s's Corefile
    /// falls through for in-addr.arpa and ip6.arpa) otherwise.
    fn reverse_lookup(&self, qname: &Name, qtype: RecordType) -> Option<Lookup> {
        if qtype != RecordType::PTR {
            return None;
        }
        let net = qname.parse_arpa_name().ok()?;
        if net.prefix_len() != net.max_prefix_len() {
            return None;
        }
        let target = self.reverse.get(&net.addr())?;
        let record = Record::from_rdata(qname.clone(), TTL, RData::PTR(PTR(target.clone())));
        Some(self.answer(ResponseCode::NoError, vec![record], Vec::new()))
    }

    /// Turns the matching records into the answer for `qtype` (CoreDNS's `backend_lookup.go`).
    fn shape(&self, qname: &Name, qtype: RecordType, hits: &[Hit<'_>]) -> Lookup {
        let mut answers: Vec<Record> = Vec::new();
        let mut additionals: Vec<Record> = Vec::new();
        match qtype {
            RecordType::A | RecordType::AAAA | RecordType::ANY => {
                for hit in hits {
                    match hit.host {
                        Host::Name(target) => {
                            let cname = Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME(target.clone())));
                            if qtype == RecordType::ANY {
                                return self.answer(ResponseCode::NoError, vec![cname], Vec::new());
                            }
                            return Lookup::Alias { cname: Box::new(cname), target: target.clone() };
                        }
                        Host::Ip(ip) => {
                            let record = if qtype == RecordType::ANY {
                                address_record(qname, RecordType::A, ip)
                                    .or_else(|| address_record(qname, RecordType::AAAA, ip))
                            } else {
                                address_record(qname, qtype, ip)
                            };
                            if let Some(r) = record
                                && !answers.contains(&r)
                            {
                                answers.push(r);
                            }
                        }
                    }
                }
            }
            RecordType::CNAME => {
                if let Some(Host::Name(target)) = hits.first().map(|h| &h.host) {
                    answers.push(Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME((*target).clone()))));
                }
            }
            RecordType::SRV => {
                let mut srvs: Vec<(u16, &Name, Option<IpAddr>)> = Vec::new();
                for hit in hits {
                    let (port, target, ip) = match hit.host {
                        Host::Name(target) => (0, target, None),
                        Host::Ip(ip) => match hit.port {
                            Some(p) => (p, hit.key, Some(ip)),
                            None => continue,
                        },
                    };
                    if !srvs.iter().any(|(p, t, i)| *p == port && *t == target && *i == ip) {
                        srvs.push((port, target, ip));
                    }
                }
                let weight = u16::try_from(100 / srvs.len().max(1)).unwrap_or(100).max(1);
                for (port, target, ip) in srvs {
                    let srv =
                        Record::from_rdata(qname.clone(), TTL, RData::SRV(SRV::new(0, weight, port, target.clone())));
                    if !answers.contains(&srv) {
                        answers.push(srv);
                    }
                    if let Some(ip) = ip {
                        let rtype = if ip.is_ipv4() { RecordType::A } else { RecordType::AAAA };
                        if let Some(a) = address_record(target, rtype, ip)
                            && !additionals.contains(&a)
                        {
                            additionals.push(a);
                        }
                    }
                }
            }
            _ => {}
        }
        self.answer(ResponseCode::NoError, answers, additionals)
    }
}

/// An A or AAAA record for `ip` when its family is the one asked for.
fn address_record(owner: &Name, qtype: RecordType, ip: IpAddr) -> Option<Record> {
    let data = match (qtype, ip) {
        (RecordType::A | RecordType::ANY, IpAddr::V4(v4)) => RData::A(A(v4)),
        (RecordType::AAAA | RecordType::ANY, IpAddr::V6(v6)) => RData::AAAA(AAAA(v6)),
        _ => return None,
    };
    Some(Record::from_rdata(owner.clone(), TTL, data))
}

/// The records of `entry` matching `req` (CoreDNS's `findServices` for one Service); `None` when
/// nothing matches, which is NXDOMAIN.
fn hits<'a>(entry: &'a Entry, req: &Request<'_>) -> Option<Vec<Hit<'a>>> {
    let mut out = Vec::new();
    let mut found = false;
    match &entry.kind {
        // An ExternalName Service has no endpoints; its ports are not matched.
        Kind::External(target) => {
            if req.endpoint.is_some() {
                return None;
            }
            return Some(vec![Hit { host: Host::Name(target), port: None, key: &entry.name }]);
        }
        kind if matches!(kind, Kind::Headless) || req.endpoint.is_some() => {
            for ep in &entry.endpoints {
                if req.endpoint.is_some_and(|e| e != ep.label) {
                    continue;
                }
                if ep.ports.is_empty() {
                    // The placeholder port: unnamed, no protocol, never an SRV.
                    if req.port.is_empty() && req.protocol.is_empty() {
                        found = true;
                        out.push(Hit { host: Host::Ip(ep.ip), port: None, key: &ep.name });
                    }
                    continue;
                }
                for p in ep.ports.iter().filter(|p| p.matches(req.port, req.protocol)) {
                    found = true;
                    out.push(Hit { host: Host::Ip(ep.ip), port: Some(p.port), key: &ep.name });
                }
            }
        }
        Kind::ClusterIp(ips) => {
            for p in entry.ports.iter().filter(|p| p.matches(req.port, req.protocol)) {
                found = true;
                for ip in ips {
                    out.push(Hit { host: Host::Ip(*ip), port: Some(p.port), key: &entry.name });
                }
            }
        }
        Kind::Headless => {}
    }
    found.then_some(out)
}

#[cfg(test)]
#[path = "records_tests.rs"]
pub(crate) mod tests;
