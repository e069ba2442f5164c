//! A pod's resolver configuration as kubelet's `dns.Configurer.GetPodDNS` computes it
//! (pkg/kubelet/network/dns/dns.go): from `dnsPolicy`, the cluster DNS, the host's resolv.conf and
//! `dnsConfig`, within upstream's limits.

use k8s_openapi::api::core::v1::{Pod, PodDNSConfigOption};

use crate::dns::resolv::ResolvConf;
use crate::runtime::cri;

/// At most this many nameservers (upstream `validation.MaxDNSNameservers`).
pub const MAX_NAMESERVERS: usize = 3;
/// At most this many search paths (`MaxDNSSearchPaths`).
pub const MAX_SEARCH_PATHS: usize = 32;
/// The search line at most this long (`MaxDNSSearchListChars`).
pub const MAX_SEARCH_CHARS: usize = 2048;
/// A longer search path is dropped (glibc aborts on it; `DNS1123SubdomainMaxLength`).
const MAX_SEARCH_PATH_LEN: usize = 253;

/// The cluster DNS a node points pods at (kubelet's `--cluster-dns` and `--cluster-domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDns {
    /// Empty: `ClusterFirst` falls back to the host's resolvers, as kubelet without `--cluster-dns`.
    pub servers: Vec<String>,
    pub domain: String,
    /// kubelet's `--resolv-conf`: what `dnsPolicy: Default` pods get (`None`: the host's).
    pub resolv_conf: Option<std::path::PathBuf>,
}

impl Default for ClusterDns {
    /// k3s's defaults: the `kube-dns` Service at 10.43.0.10, `cluster.local`.
    fn default() -> Self {
        ClusterDns { servers: vec!["10.43.0.10".into()], domain: "cluster.local".into(), resolv_conf: None }
    }
}

/// kubelet's `podDNSType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodDnsType {
    Cluster,
    Host,
    None,
}

fn dns_type(pod: &Pod) -> PodDnsType {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec.and_then(|s| s.dns_policy.as_deref()) {
        Some("None") => PodDnsType::None,
        Some("ClusterFirstWithHostNet") => PodDnsType::Cluster,
        Some("Default") => PodDnsType::Host,
        // ClusterFirst (the default) on the host network falls back to Default.
        _ if host_network => PodDnsType::Host,
        _ => PodDnsType::Cluster,
    }
}

/// What the sandbox gets, and the warning kubelet records as a `DNSConfigForming` event when a
/// limit cut something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDns {
    pub config: cri::DnsConfig,
    pub warning: Option<String>,
}

fn push_unique(to: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for i in items {
        if !to.contains(&i) {
            to.push(i);
        }
    }
}

/// kubelet's `mergeDNSOptions`: a `dnsConfig` option replaces the same-named one (the order of
/// first appearance is kept, where upstream's map leaves it random).
fn merge_options(existing: &[String], extra: &[PodDNSConfigOption]) -> Vec<String> {
    let mut merged: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| match merged.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = value.to_string(),
        None => merged.push((name.to_string(), value.to_string())),
    };
    for o in existing {
        match o.split_once(':') {
            Some((n, v)) => set(n, v),
            None => set(o, ""),
        }
    }
    for o in extra {
        set(o.name.as_deref().unwrap_or_default(), o.value.as_deref().unwrap_or_default());
    }
    merged.into_iter().map(|(n, v)| if v.is_empty() { n } else { format!("{n}:{v}") }).collect()
}

/// kubelet's `formDNSSearchFitsLimits`.
fn fit_searches(mut searches: Vec<String>) -> (Vec<String>, bool) {
    let mut cut = false;
    if searches.len() > MAX_SEARCH_PATHS {
        searches.truncate(MAX_SEARCH_PATHS);
        cut = true;
    }
    let before = searches.len();
    searches.retain(|s| s.len() <= MAX_SEARCH_PATH_LEN);
    cut |= searches.len() != before;
    let mut line = searches.join(" ").len();
    while line > MAX_SEARCH_CHARS {
        let Some(last) = searches.pop() else { break };
        line = line.saturating_sub(last.len() + 1);
        cut = true;
    }
    (searches, cut)
}

/// The pod's DNS configuration (kubelet's `GetPodDNS`), given the node's cluster DNS and the
/// host's resolver configuration (`Default` policy's source).
pub fn pod_dns(pod: &Pod, cluster: &ClusterDns, host: &ResolvConf) -> PodDns {
    let mut config = cri::DnsConfig {
        servers: host.nameservers.clone(),
        searches: host.searches.clone(),
        options: host.options.clone(),
    };
    match dns_type(pod) {
        PodDnsType::None => config = cri::DnsConfig::default(),
        PodDnsType::Cluster if !cluster.servers.is_empty() => {
            config.servers = cluster.servers.clone();
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            if !cluster.domain.is_empty() {
                let d = &cluster.domain;
                let mut searches = Vec::new();
                push_unique(&mut searches, [format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()]);
                push_unique(&mut searches, host.searches.iter().cloned());
                config.searches = searches;
            }
            config.options = vec!["ndots:5".into()];
        }
        PodDnsType::Cluster | PodDnsType::Host => {}
    }
    if let Some(extra) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        let mut servers = Vec::new();
        push_unique(&mut servers, config.servers.drain(..).chain(extra.nameservers.iter().flatten().cloned()));
        config.servers = servers;
        let mut searches = Vec::new();
        push_unique(&mut searches, config.searches.drain(..).chain(extra.searches.iter().flatten().cloned()));
        config.searches = searches;
        config.options = merge_options(&config.options, extra.options.as_deref().unwrap_or_default());
    }
    let mut warnings = Vec::new();
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        warnings.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
            config.servers.join(" ")
        ));
    }
    let (searches, cut) = fit_searches(std::mem::take(&mut config.searches));
    config.searches = searches;
    if cut {
        warnings.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
            config.searches.join(" ")
        ));
    }
    PodDns { config, warning: (!warnings.is_empty()).then(|| warnings.join("; ")) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": spec})).expect("pod")
    }

    fn host() -> ResolvConf {
        ResolvConf::parse("nameserver 192.168.1.1\nsearch lan example.com\noptions edns0 ndots:2\n")
    }

    fn dns(spec: serde_json::Value) -> cri::DnsConfig {
        pod_dns(&pod(spec), &ClusterDns::default(), &host()).config
    }

    #[test]
    fn cluster_first_is_the_default() {
        let c = dns(json!({"containers": []}));
        assert_eq!(c.servers, ["10.43.0.10"]);
        assert_eq!(c.searches, ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "lan", "example.com"]);
        assert_eq!(c.options, ["ndots:5"]);
        assert_eq!(dns(json!({"dnsPolicy": "ClusterFirst", "containers": []})), c);
        // On the host network ClusterFirst is Default; ClusterFirstWithHostNet keeps the cluster DNS.
        let h = dns(json!({"hostNetwork": true, "containers": []}));
        assert_eq!(h.servers, ["192.168.1.1"]);
        assert_eq!(h.options, ["edns0", "ndots:2"]);
        assert_eq!(dns(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []})), c);
        // Without a cluster DNS, ClusterFirst is the host's configuration.
        let none = ClusterDns { servers: vec![], domain: "cluster.local".into(), resolv_conf: None };
        assert_eq!(pod_dns(&pod(json!({"containers": []})), &none, &host()).config, h);
    }

    #[test]
    fn default_is_the_host() {
        let c = dns(json!({"dnsPolicy": "Default", "containers": []}));
        assert_eq!(c.servers, ["192.168.1.1"]);
        assert_eq!(c.searches, ["lan", "example.com"]);
        assert_eq!(c.options, ["edns0", "ndots:2"]);
    }

    #[test]
    fn none_takes_dns_config_alone_and_others_merge_it() {
        let cfg = json!({"nameservers": ["1.1.1.1"], "searches": ["my.dns.search.suffix"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]});
        let c = dns(json!({"dnsPolicy": "None", "dnsConfig": cfg, "containers": []}));
        assert_eq!(c.servers, ["1.1.1.1"]);
        assert_eq!(c.searches, ["my.dns.search.suffix"]);
        assert_eq!(c.options, ["ndots:2", "edns0"]);
        let c = dns(json!({"dnsConfig": cfg, "containers": []}));
        assert_eq!(c.servers, ["10.43.0.10", "1.1.1.1"]);
        assert_eq!(c.searches.last().map(String::as_str), Some("my.dns.search.suffix"));
        assert_eq!(c.options, ["ndots:2", "edns0"]);
    }

    #[test]
    fn limits_as_upstream() {
        let cfg = json!({"nameservers": ["1.1.1.1", "8.8.8.8", "9.9.9.9"],
            "searches": (0..40).map(|i| format!("s{i}.example")).collect::<Vec<_>>()});
        let d = pod_dns(&pod(json!({"dnsConfig": cfg, "containers": []})), &ClusterDns::default(), &host());
        assert_eq!(d.config.servers, ["10.43.0.10", "1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.config.searches.len(), MAX_SEARCH_PATHS);
        let warning = d.warning.expect("a warning");
        assert!(warning.contains("Nameserver limits were exceeded"), "{warning}");
        assert!(warning.contains("Search Line limits were exceeded"), "{warning}");
        // Too many characters: paths are cut from the end until the line fits; overlong ones dropped.
        let long: Vec<String> = (0..10).map(|i| format!("{i}{}", "a".repeat(249))).collect();
        let mut searches = long.clone();
        searches.insert(0, "x".repeat(254));
        let (fit, cut) = fit_searches(searches);
        assert!(cut);
        assert_eq!(fit, long[..8]);
        assert!(fit.join(" ").len() <= MAX_SEARCH_CHARS);
        let (fit, cut) = fit_searches(vec!["a".into()]);
        assert_eq!((fit, cut), (vec!["a".to_string()], false));
    }
}
