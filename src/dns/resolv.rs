//! The host's resolver configuration, read as kubelet reads it (`parseResolvConf` in
//! pkg/kubelet/network/dns) and as k3s picks the file: `/etc/resolv.conf`, or systemd-resolved's
//! `/run/systemd/resolve/resolv.conf` when the first lists only loopback stub resolvers.

use std::net::{IpAddr, SocketAddr};

/// The host's resolver file.
pub const ETC_RESOLV_CONF: &str = "/etc/resolv.conf";
/// systemd-resolved's list of the real upstream servers (its stub listens on 127.0.0.53).
pub const RESOLVED_RESOLV_CONF: &str = "/run/systemd/resolve/resolv.conf";

/// What a resolv.conf says, in kubelet's reading: every `nameserver`, the last `search` line (a
/// later one replaces an earlier one, as glibc does), every `options` word.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses resolv.conf text. Comments start with `#` or `;`; unknown lines are ignored; a search
    /// domain's trailing dot is dropped and `.` alone is skipped, as kubelet does.
    pub fn parse(text: &str) -> Self {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => conf.nameservers.extend(words.next().map(String::from)),
                Some("search") => {
                    conf.searches = words.filter(|s| *s != ".").map(|s| s.trim_end_matches('.').to_string()).collect();
                }
                Some("options") => conf.options.extend(words.map(String::from)),
                _ => {}
            }
        }
        conf
    }

    /// The nameservers that are IP addresses and not loopback.
    pub fn non_loopback_servers(&self) -> Vec<IpAddr> {
        self.nameservers.iter().filter_map(|s| s.parse::<IpAddr>().ok()).filter(|ip| !ip.is_loopback()).collect()
    }

    fn only_loopback(&self) -> bool {
        self.non_loopback_servers().is_empty()
            && self.nameservers.iter().any(|s| s.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
    }
}

/// Which file describes the host's real resolvers: `etc` (the text of /etc/resolv.conf) unless it
/// lists only loopback nameservers and systemd-resolved's file (`resolved`) exists.
pub fn choose<'a>(etc: &'a str, resolved: Option<&'a str>) -> &'a str {
    match resolved {
        Some(r) if ResolvConf::parse(etc).only_loopback() => r,
        _ => etc,
    }
}

/// The upstream servers the cluster DNS forwards to, from the two files' text (port 53). Loopback
/// servers are never returned: a stub on the host (127.0.0.53) or the cluster DNS itself would make
/// a forwarding loop.
pub fn upstreams_from(etc: &str, resolved: Option<&str>) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for ip in ResolvConf::parse(choose(etc, resolved)).non_loopback_servers() {
        let addr = SocketAddr::new(ip, 53);
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// The upstreams in a resolv.conf given with `--resolv-conf`: every nameserver but the cluster
/// DNS itself. Loopback ones are kept: the cluster DNS runs in the host's network namespace, where
/// a local resolver answers (pods with `dnsPolicy: Default` cannot use them, as with kubelet).
pub fn upstreams_in(conf: &ResolvConf, own: std::net::Ipv4Addr) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for ip in conf.nameservers.iter().filter_map(|s| s.parse::<IpAddr>().ok()).filter(|ip| *ip != IpAddr::V4(own)) {
        let addr = SocketAddr::new(ip, 53);
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// The resolver configuration pods with `dnsPolicy: Default` get: `--resolv-conf` when given
/// (an unreadable file reads as empty), else [`host_resolv_conf`].
pub fn pod_resolv_conf(path: Option<&std::path::Path>) -> ResolvConf {
    match path {
        Some(p) => ResolvConf::parse(&std::fs::read_to_string(p).unwrap_or_default()),
        None => host_resolv_conf(),
    }
}

/// The host's resolver configuration as pods with `dnsPolicy: Default` get it (kubelet's
/// `--resolv-conf`, chosen as k3s does). An unreadable file reads as empty.
pub fn host_resolv_conf() -> ResolvConf {
    let etc = std::fs::read_to_string(ETC_RESOLV_CONF).unwrap_or_default();
    let resolved = std::fs::read_to_string(RESOLVED_RESOLV_CONF).ok();
    ResolvConf::parse(choose(&etc, resolved.as_deref()))
}

/// The host's upstream resolvers for the cluster DNS (CoreDNS's `forward . /etc/resolv.conf`).
pub fn host_upstreams() -> Vec<SocketAddr> {
    let etc = std::fs::read_to_string(ETC_RESOLV_CONF).unwrap_or_default();
    let resolved = std::fs::read_to_string(RESOLVED_RESOLV_CONF).ok();
    upstreams_from(&etc, resolved.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_kubelet() {
        let conf = ResolvConf::parse(
            "# generated\nnameserver 10.0.0.2 # office\nnameserver  fd00::1\nsearch old.example\n\
             search corp.example. lab.example . ; trailing\noptions ndots:2 edns0\noptions rotate\ndomain x\n",
        );
        assert_eq!(conf.nameservers, ["10.0.0.2", "fd00::1"]);
        assert_eq!(conf.searches, ["corp.example", "lab.example"]);
        assert_eq!(conf.options, ["ndots:2", "edns0", "rotate"]);
    }

    #[test]
    fn upstreams_skip_loopback_and_follow_resolved() {
        let stub = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch home\n";
        let resolved = "nameserver 192.168.1.1\nnameserver 127.0.0.1\nnameserver 192.168.1.1\n";
        assert_eq!(upstreams_from(stub, Some(resolved)), ["192.168.1.1:53".parse::<SocketAddr>().unwrap()]);
        // No systemd-resolved file: nothing safe to forward to.
        assert!(upstreams_from(stub, None).is_empty());
        // A real server beside a loopback one: /etc/resolv.conf is used, without the loopback one.
        let mixed = "nameserver 127.0.0.1\nnameserver 8.8.8.8\n";
        assert_eq!(upstreams_from(mixed, Some(resolved)), ["8.8.8.8:53".parse::<SocketAddr>().unwrap()]);
        assert_eq!(choose(mixed, Some(resolved)), mixed);
        assert_eq!(choose(stub, Some(resolved)), resolved);
        let given = ResolvConf::parse("nameserver 127.0.0.77\nnameserver 10.43.0.10\nnameserver 127.0.0.77\n");
        assert_eq!(upstreams_in(&given, [10, 43, 0, 10].into()), ["127.0.0.77:53".parse::<SocketAddr>().unwrap()]);
        let v6 = "nameserver ::1\nnameserver 2001:db8::53\n";
        assert_eq!(upstreams_from(v6, None), ["[2001:db8::53]:53".parse::<SocketAddr>().unwrap()]);
    }
}
