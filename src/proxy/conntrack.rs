//! Clearing conntrack entries of UDP and SCTP endpoints that went away (kube-proxy's
//! `conntrack.CleanStaleEntries`): with no connection state to end, the kernel would keep sending
//! a client's datagrams to the old endpoint for as long as the flow stays alive.
//!
//! Done with the `conntrack` program (Debian package `conntrack`). Without it the proxy still
//! works, and says once that stale flows last until they time out.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::model::{Protocol, ServicePort};
use super::nft::{Error, Host};

/// One set of flows to delete: those DNATed to `endpoint` that were addressed to `dst` (a
/// cluster or external IP, with the Service port) or to a node port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stale {
    Ip { protocol: Protocol, dst: Ipv4Addr, endpoint: Ipv4Addr },
    NodePort { protocol: Protocol, port: u16, endpoint: Ipv4Addr },
}

/// The flows to clear when the model goes from `old` to `new`: for each UDP or SCTP Service port,
/// the endpoints it used before and no longer does (a Service removed counts as all of them).
pub fn stale(old: &[ServicePort], new: &[ServicePort]) -> Vec<Stale> {
    let new: BTreeMap<String, &ServicePort> = new.iter().map(|p| (p.key(), p)).collect();
    let mut out = Vec::new();
    for o in old.iter().filter(|p| p.protocol != Protocol::Tcp) {
        let used = |p: &ServicePort| {
            let mut v: Vec<Ipv4Addr> = p.cluster_endpoints().iter().chain(&p.local_endpoints()).map(|e| e.ip).collect();
            v.sort();
            v.dedup();
            v
        };
        let now = new.get(&o.key()).map(|p| used(p)).unwrap_or_default();
        for ep in used(o).into_iter().filter(|ip| !now.contains(ip)) {
            let protocol = o.protocol;
            for dst in std::iter::once(o.cluster_ip).chain(o.external_ips.iter().copied()) {
                out.push(Stale::Ip { protocol, dst, endpoint: ep });
            }
            if let Some(port) = o.node_port {
                out.push(Stale::NodePort { protocol, port, endpoint: ep });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Runs `conntrack -D` for stale flows.
#[derive(Debug)]
pub struct Conntrack {
    host: Host,
    missing_reported: bool,
}

impl Conntrack {
    pub fn new(host: Host) -> Self {
        Conntrack { host, missing_reported: false }
    }

    pub async fn clear(&mut self, stale: &[Stale]) {
        for s in stale {
            let (proto, filter, value, endpoint) = match s {
                Stale::Ip { protocol, dst, endpoint } => (protocol, "--orig-dst", dst.to_string(), endpoint),
                Stale::NodePort { protocol, port, endpoint } => {
                    (protocol, "--orig-port-dst", port.to_string(), endpoint)
                }
            };
            let ep = endpoint.to_string();
            let args = ["-D", "-p", proto.nft(), filter, &value, "--dst-nat", &ep];
            match self.host.run("conntrack", &args, None).await {
                Ok(_) => tracing::debug!("cleared conntrack entries: {}", args.join(" ")),
                // conntrack exits 1 when nothing matched.
                Err(Error::Failed { stderr, .. }) if stderr.contains("0 flow entries") => {}
                Err(Error::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    if !self.missing_reported {
                        self.missing_reported = true;
                        tracing::warn!(
                            "the conntrack program is not installed (Debian: apt-get install conntrack): UDP and SCTP \
                             clients of removed endpoints keep their flows until these time out"
                        );
                    }
                    return;
                }
                Err(e) => tracing::warn!("could not clear conntrack entries ({}): {e}", args.join(" ")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::Endpoint;

    #[test]
    fn udp_endpoints_that_went_away() {
        let ep = |last: u8| Endpoint {
            ip: Ipv4Addr::new(10, 42, 0, last),
            port: 53,
            ready: true,
            serving: true,
            terminating: false,
            local: false,
        };
        let sp = |protocol, eps| ServicePort {
            namespace: "ns".into(),
            service: "dns".into(),
            port_name: String::new(),
            protocol,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 53,
            node_port: Some(30053),
            external_ips: vec![],
            affinity_timeout: None,
            external_local: false,
            internal_local: false,
            endpoints: eps,
        };
        let old = [sp(Protocol::Udp, vec![ep(1), ep(2)]), sp(Protocol::Tcp, vec![ep(1), ep(2)])];
        let new = [sp(Protocol::Udp, vec![ep(2)])];
        let gone = Ipv4Addr::new(10, 42, 0, 1);
        assert_eq!(
            stale(&old, &new),
            [
                Stale::Ip { protocol: Protocol::Udp, dst: Ipv4Addr::new(10, 96, 0, 10), endpoint: gone },
                Stale::NodePort { protocol: Protocol::Udp, port: 30053, endpoint: gone },
            ]
        );
        assert_eq!(stale(&old, &[]).len(), 4, "a removed Service: both endpoints");
        assert!(stale(&new, &new).is_empty());
    }
}
