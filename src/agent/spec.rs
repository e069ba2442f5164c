//! The CRI configurations kubelet derives from a pod: the sandbox (`generatePodSandboxConfig`) and each
//! container (`generateContainerConfig`), with kubelet's labels and annotations, so that what the
//! runtime holds can be matched back to the pod after a restart.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};
use sha2::{Digest, Sha256};

use super::status::keys;
use crate::dns::resolv::pod_resolv_conf;
use crate::registry::kinds::pod_rules::ephemeral_as_container;
use crate::runtime::cri;

/// Paths hidden from unprivileged containers (upstream `securitycontext.DefaultMaskedPaths`).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Paths read-only in unprivileged containers (upstream `securitycontext.DefaultReadonlyPaths`).
const READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}
/// `name_namespace(uid)`, as kubelet names a pod in messages.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}
pub fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
}

/// The pod's log directory: `<logs root>/<namespace>_<name>_<uid>`, as kubelet's `/var/log/pods`.
pub fn log_dir(logs_root: &Path, pod: &Pod) -> std::path::PathBuf {
    logs_root.join(format!("{}_{}_{}", namespace(pod), name(pod), uid(pod)))
}

/// A container's log file relative to the pod's log directory.
pub fn log_path(container: &str, restart_count: i32) -> String {
    format!("{container}/{restart_count}.log")
}

/// One past the highest `<N>.log` (or rotated `<N>.log.*`) in a container's log directory; 0 when
/// there is none.
pub fn restart_count_by_log_dir(dir: &Path) -> i32 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (n, rest) = name.split_once(".log")?;
            (rest.is_empty() || rest.starts_with('.')).then_some(())?;
            n.parse::<i32>().ok().filter(|_| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|n| n.saturating_add(1))
        .max()
        .unwrap_or(0)
}

/// The hash kubelet keeps on a container to notice that it must be replaced: of its name and
/// image only (upstream's `pickFieldsToHash`), so an upgrade of cairn or an in-place resize never
/// restarts a healthy container.
pub fn container_hash(c: &Container) -> String {
    let json = serde_json::json!({"name": c.name, "image": c.image});
    let digest = Sha256::digest(json.to_string());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    [(keys::POD_NAME, name(pod)), (keys::POD_NAMESPACE, namespace(pod)), (keys::POD_UID, uid(pod))]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every container name of the pod: init, regular and ephemeral containers.
pub fn container_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let spec = pod.spec.as_ref();
    let inits = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let apps = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let ephemeral = spec.and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default();
    inits.iter().chain(apps).map(|c| c.name.as_str()).chain(ephemeral.iter().map(|c| c.name.as_str()))
}

/// The pod's ephemeral containers as the containers they run as, each with the name of the
/// container whose process namespace it joins (`targetContainerName`).
pub fn ephemeral_containers(pod: &Pod) -> Vec<(Container, Option<String>)> {
    let ephemeral = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default();
    ephemeral
        .iter()
        .map(|ec| (ephemeral_as_container(ec), ec.target_container_name.clone().filter(|t| !t.is_empty())))
        .collect()
}

/// Makes a container join the PID namespace of the running container `target_id` (an ephemeral
/// container's `targetContainerName`; CRI's `NamespaceMode::Target`).
pub fn join_pid_namespace(config: &mut cri::ContainerConfig, target_id: &str) {
    let options = config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default);
    options.pid = cri::NamespaceMode::Target as i32;
    options.target_id = target_id.to_string();
}

/// CRI label selector for everything of this pod.
pub fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(keys::POD_UID.to_string(), uid.to_string())])
}

fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let mode = |node: bool, pod_mode: cri::NamespaceMode| {
        if node { cri::NamespaceMode::Node as i32 } else { pod_mode as i32 }
    };
    let pid = if spec.share_process_namespace.unwrap_or(false) {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: mode(spec.host_network.unwrap_or(false), cri::NamespaceMode::Pod),
        pid: mode(spec.host_pid.unwrap_or(false), pid),
        ipc: mode(spec.host_ipc.unwrap_or(false), cri::NamespaceMode::Pod),
        ..Default::default()
    }
}

fn protocol(p: Option<&str>) -> i32 {
    match p {
        Some("UDP") => cri::Protocol::Udp as i32,
        Some("SCTP") => cri::Protocol::Sctp as i32,
        _ => cri::Protocol::Tcp as i32,
    }
}

/// The sandbox configuration of `pod`; its resolver settings from `cluster_dns` and the host's
/// resolv.conf (`agent::dns::pod_dns`).
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    log_dir: &Path,
    cgroup_parent: String,
    cluster_dns: &super::dns::ClusterDns,
) -> cri::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut labels = pod.metadata.labels.clone().unwrap_or_default().into_iter().collect::<HashMap<_, _>>();
    labels.extend(pod_labels(pod));
    let port_mappings = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten().filter(|c| super::status::is_sidecar(c)))
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| cri::PortMapping {
            protocol: protocol(p.protocol.as_deref()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let hostname = if spec.host_network.unwrap_or(false) {
        String::new()
    } else {
        let h = spec.hostname.clone().unwrap_or_else(|| name(pod).to_string());
        h.chars().take(63).collect::<String>().trim_end_matches(['-', '.']).to_string()
    };
    let psc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false));
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name(pod).into(),
            uid: uid(pod).into(),
            namespace: namespace(pod).into(),
            attempt,
        }),
        hostname,
        log_directory: log_dir.display().to_string(),
        dns_config: pod.spec.as_ref().map(|_| {
            super::dns::pod_dns(pod, cluster_dns, &pod_resolv_conf(cluster_dns.resolv_conf.as_deref())).config
        }),
        port_mappings,
        labels,
        annotations: pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                run_as_user: psc.run_as_user.map(|value| cri::Int64Value { value }),
                run_as_group: psc.run_as_group.map(|value| cri::Int64Value { value }),
                supplemental_groups: psc.supplemental_groups.clone().unwrap_or_default(),
                privileged,
                ..Default::default()
            }),
            sysctls: psc.sysctls.unwrap_or_default().into_iter().map(|s| (s.name, s.value)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container's effective security context: the container's own fields over the pod's.
fn security_context(pod: &Pod, c: &Container) -> cri::LinuxContainerSecurityContext {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.clone()).unwrap_or_default();
    let sc: SecurityContext = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let strip = |v: Option<Vec<String>>| -> Vec<String> {
        v.unwrap_or_default().into_iter().map(|c| c.trim_start_matches("CAP_").to_string()).collect()
    };
    let run_as_user = sc.run_as_user.or(psc.run_as_user);
    let run_as_group = sc.run_as_group.or(psc.run_as_group);
    let mut groups = psc.supplemental_groups.clone().unwrap_or_default();
    groups.extend(psc.fs_group.filter(|g| !groups.contains(g)));
    let seccomp = sc.seccomp_profile.clone().or(psc.seccomp_profile.clone()).map(|p| {
        use cri::security_profile::ProfileType;
        let (kind, path) = match p.type_.as_str() {
            "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
            "Localhost" => (ProfileType::Localhost, p.localhost_profile.unwrap_or_default()),
            _ => (ProfileType::Unconfined, String::new()),
        };
        cri::SecurityProfile { profile_type: kind as i32, localhost_ref: path }
    });
    cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: strip(caps.add),
            drop_capabilities: strip(caps.drop),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespace_options(pod)),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: groups,
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        seccomp,
        masked_paths: if privileged { vec![] } else { MASKED_PATHS.iter().map(|p| p.to_string()).collect() },
        readonly_paths: if privileged { vec![] } else { READONLY_PATHS.iter().map(|p| p.to_string()).collect() },
        ..Default::default()
    }
}

/// upstream `verifyRunAsNonRoot`: with `runAsNonRoot`, the user the container runs as (its own
/// or the image's, `image_user` as uid or name) must be known not to be root.
pub fn verify_run_as_non_root(pod: &Pod, c: &Container, image_user: (Option<i64>, &str)) -> Result<(), String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.clone()).unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    if !sc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false) {
        return Ok(());
    }
    let who = format!("(pod: {:?}, container: {})", full_name(pod), c.name);
    match (sc.run_as_user.or(psc.run_as_user), image_user) {
        (Some(0), _) => Err(format!("container's runAsUser breaks non-root policy {who}")),
        (Some(_), _) => Ok(()),
        (None, (Some(0), _)) => Err(format!("container has runAsNonRoot and image will run as root {who}")),
        (None, (Some(_), _)) => Ok(()),
        (None, (None, name)) if !name.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root {who}"
        )),
        (None, (None, _)) => Err(format!("container has runAsNonRoot and image will run as root {who}")),
    }
}

/// Everything a container's configuration needs besides the pod and its spec.
pub struct ContainerInputs {
    pub restart_count: i32,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<cri::Mount>,
    pub resources: cri::LinuxContainerResources,
    /// What device plugins give the container: device nodes, runtime annotations, CDI devices.
    pub devices: Vec<cri::Device>,
    pub annotations: Vec<(String, String)>,
    pub cdi_devices: Vec<cri::CdiDevice>,
}

/// The container configuration of `c` in `pod`.
pub fn container_config(pod: &Pod, c: &Container, inputs: ContainerInputs) -> cri::ContainerConfig {
    let expand = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|s| super::env::expand(s, &inputs.env)).collect()
    };
    let mut labels = pod_labels(pod);
    labels.insert(keys::CONTAINER_NAME.into(), c.name.clone());
    let grace = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    let mut annotations = HashMap::from([
        (keys::CONTAINER_HASH.to_string(), container_hash(c)),
        (keys::RESTART_COUNT.to_string(), inputs.restart_count.to_string()),
        (
            "io.kubernetes.container.terminationMessagePath".to_string(),
            c.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy".to_string(),
            c.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
        (keys::TERMINATION_GRACE.to_string(), grace.to_string()),
    ]);
    annotations.extend(inputs.annotations.iter().cloned());
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        annotations.insert(keys::PRE_STOP.to_string(), json);
    }
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: c.name.clone(), attempt: inputs.restart_count as u32 }),
        image: Some(cri::ImageSpec { image: c.image.clone().unwrap_or_default(), ..Default::default() }),
        command: expand(&c.command),
        args: expand(&c.args),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: inputs.env.iter().map(|(key, value)| cri::KeyValue { key: key.clone(), value: value.clone() }).collect(),
        mounts: inputs.mounts,
        devices: inputs.devices,
        cdi_devices: inputs.cdi_devices,
        labels,
        annotations,
        log_path: log_path(&c.name, inputs.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(inputs.resources),
            security_context: Some(security_context(pod, c)),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn restart_count_continues_past_the_log_files_there_are() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(restart_count_by_log_dir(&dir.path().join("missing")), 0);
        assert_eq!(restart_count_by_log_dir(dir.path()), 0);
        for f in ["0.log", "2.log.20261205-010203", "x.log", "1.logs"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("7.log")).unwrap();
        assert_eq!(restart_count_by_log_dir(dir.path()), 3);
    }

    #[test]
    fn sandbox_carries_identity_ports_and_namespaces() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"hostPID": true, "containers": [{"name": "c", "image": "busybox",
                "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "protocol": "UDP"}]}]}
        }));
        let cfg = sandbox_config(
            &p,
            2,
            Path::new("/logs/ns_web_u1"),
            "/kubepods/besteffort/podu1".into(),
            &crate::agent::dns::ClusterDns::default(),
        );
        let meta = cfg.metadata.unwrap();
        assert_eq!(
            (meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str(), meta.attempt),
            ("web", "ns", "u1", 2)
        );
        assert_eq!(cfg.hostname, "web");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.labels[keys::POD_UID], "u1");
        assert_eq!(cfg.port_mappings.len(), 1, "only ports with a hostPort are mapped");
        assert_eq!(cfg.port_mappings[0].host_port, 8080);
        let ns = cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.pid, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn container_config_expands_and_annotates() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["echo", "$(GREETING)", "$$(x)"],
                "securityContext": {"capabilities": {"add": ["CAP_NET_ADMIN"]}, "runAsUser": 1000,
                    "allowPrivilegeEscalation": false}}]}
        }));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let inputs = ContainerInputs {
            restart_count: 3,
            env: vec![("GREETING".into(), "hi".into())],
            mounts: vec![],
            resources: Default::default(),
            devices: Vec::new(),
            annotations: Vec::new(),
            cdi_devices: Vec::new(),
        };
        let cfg = container_config(&p, c, inputs);
        assert_eq!(cfg.command, ["echo", "hi", "$(x)"]);
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.annotations[keys::RESTART_COUNT], "3");
        assert_eq!(cfg.annotations[keys::CONTAINER_HASH], container_hash(c));
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.capabilities.unwrap().add_capabilities, ["NET_ADMIN"]);
        assert_eq!(sc.run_as_user.unwrap().value, 1000);
        assert!(sc.no_new_privs);
        assert!(!sc.masked_paths.is_empty());
    }
}
