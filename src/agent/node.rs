//! The Node object this agent reports: machine facts, capacity and allocatable, conditions,
//! addresses, nodeInfo and images, built the way kubelet's status setters build them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::eviction::thresholds::hard_reservation;
use super::eviction::{Condition, Threshold};
use crate::net::Cidr;
use crate::runtime::cri;

/// Pods per node (kubelet's `--max-pods`).
pub const MAX_PODS: u32 = 110;
/// How many images `status.images` lists (kubelet's `nodeStatusMaxImages`).
const MAX_IMAGES: usize = 50;

/// Resources held back from pods (`--system-reserved` plus `--kube-reserved`), in milli-units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved(pub BTreeMap<String, i128>);

impl Reserved {
    /// Parses `cpu=500m,memory=1Gi,ephemeral-storage=1Gi,pid=100` as kubelet does.
    pub fn parse(s: &str) -> Result<Reserved, String> {
        let mut out = BTreeMap::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                pair.split_once('=').ok_or_else(|| format!("{pair:?} is not name=quantity (e.g. cpu=500m)"))?;
            if !matches!(name, "cpu" | "memory" | "ephemeral-storage" | "pid") {
                return Err(format!("{name:?}: only cpu, memory, ephemeral-storage and pid can be reserved"));
            }
            let milli = crate::registry::kinds::pod_rules::parse_quantity(value)
                .filter(|m| *m >= 0)
                .ok_or_else(|| format!("{value:?} is not a quantity for {name}"))?;
            out.insert(name.to_string(), milli);
        }
        Ok(Reserved(out))
    }

    /// The sum of two reservations.
    pub fn plus(&self, other: &Reserved) -> Reserved {
        let mut sum = self.0.clone();
        for (k, v) in &other.0 {
            *sum.entry(k.clone()).or_default() += v;
        }
        Reserved(sum)
    }

    /// The reservation of `name`, in milli-units.
    pub fn get(&self, name: &str) -> i128 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// What the machine is, read once at start.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Size of the filesystem holding the data directory.
    pub ephemeral_bytes: u64,
    /// hugepages-<size> → bytes, e.g. ("hugepages-2Mi", 0).
    pub hugepages: Vec<(String, u64)>,
    pub kernel: String,
    pub os_image: String,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
}

impl Machine {
    /// Reads the facts from /proc, /sys and /etc; anything unreadable is left empty or zero.
    pub fn read(data_dir: &Path) -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
        let meminfo = read("/proc/meminfo");
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        Machine {
            cpus,
            memory_bytes: mem_total_bytes(&meminfo),
            ephemeral_bytes: filesystem_bytes(data_dir),
            hugepages: hugepages(),
            kernel: read("/proc/sys/kernel/osrelease"),
            os_image: os_image(&read("/etc/os-release")),
            machine_id: read("/etc/machine-id"),
            system_uuid: read("/sys/class/dmi/id/product_uuid"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
        }
    }
}

fn mem_total_bytes(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

fn filesystem_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return 0 };
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_blocks * st.f_frsize
    }
}

fn hugepages() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (dir, name, size) in
        [("hugepages-2048kB", "hugepages-2Mi", 2u64 << 20), ("hugepages-1048576kB", "hugepages-1Gi", 1 << 30)]
    {
        let count = std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{dir}/nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(count) = count {
            out.push((name.to_string(), count * size));
        }
    }
    out
}

/// Kubernetes' name for this CPU architecture.
pub fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

/// Everything the status is made from at one moment.
pub struct Inputs<'a> {
    pub name: &'a str,
    pub machine: &'a Machine,
    pub reserved: &'a Reserved,
    pub node_ip: Option<IpAddr>,
    pub pod_cidr: Cidr,
    /// The node endpoint's port (`status.daemonEndpoints.kubeletEndpoint.Port`).
    pub kubelet_port: u16,
    /// The runtime's version string (`containerd://1.6.20`), or empty when it did not answer.
    pub runtime_version: &'a str,
    /// Why the node is not ready, if it is not: kubelet's `KubeletNotReady` message.
    pub not_ready: Option<String>,
    pub images: &'a [cri::Image],
    /// The CSI volumes mounted for pods here (`status.volumesInUse`).
    pub volumes_in_use: Vec<String>,
    /// Device plugins' resources: (devices, healthy devices).
    pub devices: BTreeMap<String, (i64, i64)>,
    /// Labels of what the node found on itself (its GPUs), beside the well-known ones.
    pub labels: &'a BTreeMap<String, String>,
    /// Whether the node runs the control plane (`node-role.kubernetes.io/control-plane`).
    pub control_plane: bool,
    /// The eviction thresholds: allocatable holds back the hard memory and nodefs ones.
    pub eviction: &'a [Threshold],
    /// The pressure conditions the eviction manager sees now.
    pub pressure: BTreeSet<Condition>,
    pub now: Time,
}

/// The Node object to create: metadata, spec and status.
pub fn new_node(inputs: &Inputs) -> Node {
    Node {
        spec: Some(NodeSpec {
            pod_cidr: Some(inputs.pod_cidr.to_string()),
            pod_cidrs: Some(vec![inputs.pod_cidr.to_string()]),
            ..Default::default()
        }),
        status: Some(status(inputs, None)),
        ..registration(inputs.name, inputs.control_plane, inputs.labels)
    }
}

/// A Node with only its metadata (kubelet's well-known labels, and `labels`), as a joining node
/// registers before the server has given it a pod range.
pub fn registration(name: &str, control_plane: bool, labels: &BTreeMap<String, String>) -> Node {
    let arch = architecture();
    let mut well_known = vec![
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch),
    ];
    if control_plane {
        well_known.push(("node-role.kubernetes.io/control-plane", "true"));
    }
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(well_known.into_iter().map(|(k, v)| (k.into(), v.into())).chain(labels.clone()).collect()),
            annotations: Some([("node.alpha.kubernetes.io/ttl".into(), "0".into())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The node's own labels (`Inputs::labels`) that `node` lacks or has with another value.
pub fn missing_labels(node: &Node, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let have = node.metadata.labels.as_ref();
    let missing = labels.iter().filter(|(k, v)| have.and_then(|h| h.get(*k)) != Some(*v));
    missing.map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The node's status; condition transition times are kept from `previous` while a condition holds.
pub fn status(inputs: &Inputs, previous: Option<&NodeStatus>) -> NodeStatus {
    let m = inputs.machine;
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), m.cpus.to_string()),
        ("memory".to_string(), format!("{}Ki", m.memory_bytes / 1024)),
        ("pods".to_string(), MAX_PODS.to_string()),
        ("ephemeral-storage".to_string(), format!("{}Ki", m.ephemeral_bytes / 1024)),
    ]);
    for (name, bytes) in &m.hugepages {
        capacity.insert(name.clone(), bytes.to_string());
    }
    let r = inputs.reserved;
    let cpu_milli = (i128::from(m.cpus) * 1000 - r.get("cpu")).max(0);
    let disk = i128::from(m.ephemeral_bytes);
    let (evict_memory, evict_disk) = hard_reservation(inputs.eviction, i128::from(m.memory_bytes), disk);
    let memory = (i128::from(m.memory_bytes) - r.get("memory") / 1000 - evict_memory).max(0);
    let ephemeral = (disk - r.get("ephemeral-storage") / 1000 - evict_disk).max(0);
    let mut allocatable = capacity.clone();
    allocatable.insert(
        "cpu".into(),
        if cpu_milli % 1000 == 0 { (cpu_milli / 1000).to_string() } else { format!("{cpu_milli}m") },
    );
    allocatable.insert("memory".into(), format!("{}Ki", memory / 1024));
    allocatable.insert("ephemeral-storage".into(), ephemeral.to_string());
    for (resource, (devices, healthy)) in &inputs.devices {
        capacity.insert(resource.clone(), devices.to_string());
        allocatable.insert(resource.clone(), healthy.to_string());
    }
    let quantities = |m: BTreeMap<String, String>| m.into_iter().map(|(k, v)| (k, Quantity(v))).collect();

    let (ready, reason, message) = match &inputs.not_ready {
        None => ("True", "KubeletReady", "kubelet is posting ready status".to_string()),
        Some(why) => ("False", "KubeletNotReady", why.clone()),
    };
    let pressure = |c: Condition| {
        let (reason, message) = match (c, inputs.pressure.contains(&c)) {
            (Condition::Memory, true) => ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
            (Condition::Memory, false) => ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            (Condition::Disk, true) => ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            (Condition::Disk, false) => ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            (Condition::Pid, true) => ("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
            (Condition::Pid, false) => ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        };
        let status = if inputs.pressure.contains(&c) { "True" } else { "False" };
        (c.name(), status, reason, message.to_string())
    };
    let conditions = [
        pressure(Condition::Memory),
        pressure(Condition::Disk),
        pressure(Condition::Pid),
        ("Ready", ready, reason, message),
    ];
    let previous_transition = |kind: &str, status: &str| {
        previous?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == kind && c.status == status)?
            .last_transition_time
            .clone()
    };
    let conditions = conditions
        .into_iter()
        .map(|(kind, status, reason, message)| NodeCondition {
            type_: kind.into(),
            status: status.into(),
            last_heartbeat_time: Some(inputs.now.clone()),
            last_transition_time: previous_transition(kind, status).or_else(|| Some(inputs.now.clone())),
            reason: Some(reason.into()),
            message: Some(message),
        })
        .collect();

    let address = |type_: &str, address: String| NodeAddress { type_: type_.into(), address };
    let mut addresses = Vec::new();
    if let Some(ip) = inputs.node_ip {
        addresses.push(address("InternalIP", ip.to_string()));
    }
    addresses.push(address("Hostname", inputs.name.into()));

    let mut images: Vec<&cri::Image> =
        inputs.images.iter().filter(|i| !i.repo_tags.is_empty() || !i.repo_digests.is_empty()).collect();
    images.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    let images = images
        .into_iter()
        .take(MAX_IMAGES)
        .map(|i| ContainerImage {
            names: Some(i.repo_digests.iter().chain(&i.repo_tags).cloned().collect()),
            size_bytes: Some(i.size as i64),
        })
        .collect();

    NodeStatus {
        capacity: Some(quantities(capacity)),
        allocatable: Some(quantities(allocatable)),
        conditions: Some(conditions),
        addresses: Some(addresses),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(inputs.kubelet_port) }),
        }),
        node_info: Some(NodeSystemInfo {
            machine_id: m.machine_id.clone(),
            system_uuid: m.system_uuid.clone(),
            boot_id: m.boot_id.clone(),
            kernel_version: m.kernel.clone(),
            os_image: m.os_image.clone(),
            container_runtime_version: inputs.runtime_version.into(),
            kubelet_version: format!("{}+cairn-{}", crate::api::KUBERNETES_VERSION, env!("CARGO_PKG_VERSION")),
            kube_proxy_version: String::new(),
            operating_system: "linux".into(),
            architecture: architecture().into(),
            ..Default::default()
        }),
        images: Some(images),
        volumes_in_use: (!inputs.volumes_in_use.is_empty()).then(|| inputs.volumes_in_use.clone()),
        // The attach/detach controller's to write.
        volumes_attached: previous.and_then(|p| p.volumes_attached.clone()),
        ..Default::default()
    }
}

/// Whether two statuses differ in anything but heartbeat times (kubelet patches only then, or when
/// the periodic report is due).
pub fn changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn machine() -> Machine {
        Machine {
            cpus: 4,
            memory_bytes: 8 << 30,
            ephemeral_bytes: 100 << 30,
            hugepages: vec![("hugepages-2Mi".into(), 0)],
            kernel: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            ..Default::default()
        }
    }

    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    static DEFAULT_EVICTION: std::sync::LazyLock<Vec<Threshold>> = std::sync::LazyLock::new(|| {
        crate::agent::eviction::thresholds::parse(crate::agent::eviction::thresholds::DEFAULT_HARD, "", "", "").unwrap()
    });

    fn inputs<'a>(m: &'a Machine, r: &'a Reserved, not_ready: Option<String>, now: &str) -> Inputs<'a> {
        Inputs {
            name: "n1",
            machine: m,
            reserved: r,
            node_ip: Some("192.0.2.10".parse().unwrap()),
            pod_cidr: "10.42.0.0/24".parse().unwrap(),
            kubelet_port: 10250,
            runtime_version: "containerd://1.6.20",
            not_ready,
            images: &[],
            volumes_in_use: Vec::new(),
            devices: BTreeMap::new(),
            labels: &NO_LABELS,
            control_plane: true,
            eviction: &DEFAULT_EVICTION,
            pressure: BTreeSet::new(),
            now: Time(now.parse().unwrap()),
        }
    }

    fn value(s: &NodeStatus) -> Value {
        serde_json::to_value(s).unwrap()
    }

    #[test]
    fn found_labels_are_set_at_registration_and_patched_in_later() {
        let (m, r) = (machine(), Reserved::default());
        let gpu = BTreeMap::from([("nvidia.com/gpu.count".to_string(), "2".to_string())]);
        let mut i = inputs(&m, &r, None, "2026-01-01T00:00:00Z");
        i.labels = &gpu;
        let node = new_node(&i);
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!((labels["nvidia.com/gpu.count"].as_str(), labels["kubernetes.io/os"].as_str()), ("2", "linux"));
        assert!(missing_labels(&node, &gpu).is_empty());
        let more = BTreeMap::from([("nvidia.com/gpu.count".to_string(), "3".to_string())]);
        assert_eq!(missing_labels(&node, &more), more);
    }

    #[test]
    fn reservations_parse_and_add() {
        let sys = Reserved::parse("cpu=500m, memory=1Gi").unwrap();
        let kube = Reserved::parse("cpu=250m").unwrap();
        assert_eq!(sys.plus(&kube).get("cpu"), 750);
        assert_eq!(sys.get("memory"), (1i128 << 30) * 1000);
        assert!(Reserved::parse("gpu=1").unwrap_err().contains("only cpu"));
        assert!(Reserved::parse("cpu").is_err());
        assert!(Reserved::parse("memory=lots").is_err());
        assert_eq!(Reserved::parse("").unwrap(), Reserved::default());
    }

    #[test]
    fn allocatable_subtracts_reservations_and_eviction_thresholds() {
        let m = machine();
        let r = Reserved::parse("cpu=500m,memory=1Gi,ephemeral-storage=10Gi").unwrap();
        let s = value(&status(&inputs(&m, &r, None, "2026-11-30T00:00:00Z"), None));
        assert_eq!(s["capacity"]["cpu"], "4");
        assert_eq!(s["capacity"]["memory"], format!("{}Ki", 8 << 20));
        assert_eq!(s["capacity"]["pods"], "110");
        assert_eq!(s["allocatable"]["cpu"], "3500m");
        // 8 GiB - 1 GiB reserved - 100 MiB eviction threshold.
        assert_eq!(s["allocatable"]["memory"], format!("{}Ki", (7 << 20) - 100 * 1024));
        // 100 GiB - 10 GiB reserved - 10 % eviction threshold.
        assert_eq!(s["allocatable"]["ephemeral-storage"], (80i128 << 30).to_string());
        assert_eq!(s["allocatable"]["hugepages-2Mi"], "0");
        assert_eq!(s["nodeInfo"]["containerRuntimeVersion"], "containerd://1.6.20");
        assert_eq!(s["addresses"][0], json!({"type": "InternalIP", "address": "192.0.2.10"}));
        assert_eq!(s["daemonEndpoints"], json!({"kubeletEndpoint": {"Port": 10250}}));
    }

    #[test]
    fn device_plugin_resources_are_capacity_and_healthy_ones_allocatable() {
        let (m, r) = (machine(), Reserved::default());
        let mut i = inputs(&m, &r, None, "2026-11-30T00:00:00Z");
        i.devices = BTreeMap::from([("nvidia.com/gpu".to_string(), (2, 1)), ("example.com/dev".to_string(), (3, 0))]);
        let s = value(&status(&i, None));
        assert_eq!((&s["capacity"]["nvidia.com/gpu"], &s["allocatable"]["nvidia.com/gpu"]), (&json!("2"), &json!("1")));
        assert_eq!(
            (&s["capacity"]["example.com/dev"], &s["allocatable"]["example.com/dev"]),
            (&json!("3"), &json!("0"))
        );
    }

    #[test]
    fn conditions_carry_upstream_reasons_and_keep_transition_times() {
        let (m, r) = (machine(), Reserved::default());
        let first = status(&inputs(&m, &r, None, "2026-11-30T00:00:00Z"), None);
        let ready = |s: &NodeStatus| {
            value(s)["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone()
        };
        assert_eq!(ready(&first)["reason"], "KubeletReady");
        assert_eq!(value(&first)["conditions"][0]["reason"], "KubeletHasSufficientMemory");

        let later = status(&inputs(&m, &r, None, "2026-11-30T00:00:10Z"), Some(&first));
        assert_eq!(ready(&later)["lastTransitionTime"], "2026-11-30T00:00:00Z");
        assert_eq!(ready(&later)["lastHeartbeatTime"], "2026-11-30T00:00:10Z");
        assert!(!changed(&first, &later), "only heartbeats moved");

        let down =
            status(&inputs(&m, &r, Some("container runtime is down".into()), "2026-11-30T00:00:20Z"), Some(&later));
        assert_eq!(ready(&down)["status"], "False");
        assert_eq!(ready(&down)["reason"], "KubeletNotReady");
        assert_eq!(ready(&down)["lastTransitionTime"], "2026-11-30T00:00:20Z");
        assert!(changed(&later, &down));
    }

    #[test]
    fn machine_facts_parse() {
        assert_eq!(mem_total_bytes("MemTotal:       24588524 kB\nMemFree: 1 kB\n"), 24588524 * 1024);
        assert_eq!(
            os_image("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(os_image(""), "Linux");
        assert!(filesystem_bytes(Path::new("/")) > 0);
    }
}
