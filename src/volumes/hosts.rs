//! The pod's managed `/etc/hosts` (kubelet's `makeHostsMount`), written to `<pod_dir>/etc-hosts`.

use std::path::Path;

use k8s_cri::v1::Mount;
use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};

use super::VolumeError;

/// The cluster DNS domain of pod FQDNs (`<hostname>.<subdomain>.<ns>.svc.<domain>`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";
const ETC_HOSTS: &str = "/etc/hosts";
const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const MANAGED_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
const HOSTNAME_MAX_LEN: usize = 63;

/// Writes `<pod_dir>/etc-hosts` (only when its content changed) and returns its mount at
/// `/etc/hosts`: the pod's IPs and hostname for pods on the pod network, the node's `/etc/hosts` for
/// hostNetwork pods, plus `hostAliases` in both cases. `None` while a pod-network pod has no IP yet.
/// Add the mount only to containers for which `wants_etc_hosts` holds.
pub fn etc_hosts(pod: &Pod, pod_ips: &[String], pod_dir: &Path) -> Result<Option<Mount>, VolumeError> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    if pod_ips.is_empty() && !host_network {
        return Ok(None);
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_deref()).unwrap_or_default();
    let content = if host_network {
        let node_hosts = std::fs::read(ETC_HOSTS)
            .map_err(|source| VolumeError::Io { context: format!("reading {ETC_HOSTS}"), source })?;
        let mut content = MANAGED_HEADER_HOST_NETWORK.as_bytes().to_vec();
        content.extend_from_slice(&node_hosts);
        content.extend_from_slice(alias_entries(aliases).as_bytes());
        content
    } else {
        let (hostname, domain) = hostname_and_domain(pod);
        managed_content(pod_ips, &hostname, domain.as_deref(), aliases).into_bytes()
    };
    let path = pod_dir.join("etc-hosts");
    write_if_changed(&path, &content)
        .map_err(|source| VolumeError::Io { context: format!("writing {}", path.display()), source })?;
    Ok(Some(Mount {
        container_path: ETC_HOSTS.to_string(),
        host_path: path.to_string_lossy().into_owned(),
        readonly: false,
        selinux_relabel: true,
        ..Default::default()
    }))
}

/// kubelet mounts the managed hosts file unless the container mounts a volume at `/etc/hosts`.
pub fn wants_etc_hosts(container: &Container) -> bool {
    !container.volume_mounts.iter().flatten().any(|m| m.mount_path == ETC_HOSTS)
}

fn write_if_changed(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::read(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    std::fs::write(path, content)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

/// kubelet's `GeneratePodHostNameAndDomain`: `spec.hostname` or the pod's name (at most 63
/// characters, no trailing `-` or `.`), and `<subdomain>.<ns>.svc.<cluster domain>` with a subdomain.
pub fn hostname_and_domain(pod: &Pod) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut hostname = spec.and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty()).unwrap_or(name);
    if hostname.len() > HOSTNAME_MAX_LEN {
        let end = (0..=HOSTNAME_MAX_LEN).rev().find(|i| hostname.is_char_boundary(*i)).unwrap_or(0);
        hostname = hostname[..end].trim_end_matches(['-', '.']);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| format!("{sub}.{namespace}.svc.{CLUSTER_DOMAIN}"));
    (hostname.to_string(), domain)
}

fn managed_content(pod_ips: &[String], hostname: &str, domain: Option<&str>, aliases: &[HostAlias]) -> String {
    let mut out = String::from(MANAGED_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        match domain {
            Some(domain) => out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n")),
            None => out.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    out.push_str(&alias_entries(aliases));
    out
}

fn alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        out.push_str(&format!("{}\t{}\n", alias.ip, alias.hostnames.as_deref().unwrap_or_default().join("\t")));
    }
    out
}
