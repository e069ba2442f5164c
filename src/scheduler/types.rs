//! What the scheduler knows about pods and nodes: the facts it places by, parsed once from the
//! stored objects, plus the per-node aggregate (`NodeInfo`) that plugins read.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::registry::kinds::pod_rules::parse_quantity;

pub use crate::labels::Labels;

/// The pod condition a preemption puts on its victims, with its reason (upstream's
/// `DisruptionTarget` and `PodReasonPreemptionByScheduler`).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const PREEMPTED_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// The CPU request assumed, for scoring only, for a container that requests none (100m).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// The memory request assumed, for scoring only, for a container that requests none (200 MiB).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// Resource amounts in the units the scheduler compares: milli-CPU, bytes, counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// Allowed pod count (allocatable only).
    pub pods: i64,
    /// Extended resources (`nvidia.com/gpu`), hugepages and anything else countable.
    pub scalar: BTreeMap<String, i64>,
}

impl Resources {
    /// Parses a resource list (`{"cpu": "500m", "memory": "1Gi", ...}`). Unparseable values count as 0
    /// (the API server rejects them before they are stored).
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut r = Resources::default();
        for (name, q) in list.into_iter().flatten() {
            let milli = parse_quantity(&q.0).unwrap_or(0).clamp(0, i128::from(i64::MAX)) as i64;
            let value = milli.saturating_add(999) / 1000;
            match name.as_str() {
                "cpu" => r.milli_cpu = milli,
                "memory" => r.memory = value,
                "ephemeral-storage" => r.ephemeral_storage = value,
                "pods" => r.pods = value,
                _ => {
                    r.scalar.insert(name.clone(), value);
                }
            }
        }
        r
    }

    /// The amount of resource `name` (CPU in milli-units).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            "cpu" => self.milli_cpu,
            "memory" => self.memory,
            "ephemeral-storage" => self.ephemeral_storage,
            "pods" => self.pods,
            _ => self.scalar.get(name).copied().unwrap_or(0),
        }
    }

    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
        for (k, v) in &other.scalar {
            *self.scalar.entry(k.clone()).or_insert(0) += v;
        }
    }

    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.pods -= other.pods;
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e -= v;
            if *e == 0 {
                self.scalar.remove(k);
            }
        }
    }

    /// Raises every amount to at least `other`'s.
    pub fn max_with(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }

    /// Whether nothing at all is requested.
    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0 && self.memory == 0 && self.ephemeral_storage == 0 && self.scalar.values().all(|v| *v == 0)
    }
}

/// A host port a pod asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host IP; empty means every address (0.0.0.0).
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    /// Whether two host ports collide (same protocol and port, overlapping addresses).
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let wildcard = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (wildcard(&self.ip) || wildcard(&other.ip) || self.ip == other.ip)
    }
}

/// The facts about a pod that scheduling depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub priority: i32,
    pub scheduler_name: String,
    pub node_name: String,
    pub scheduling_gates: Vec<String>,
    pub node_selector: Labels,
    pub affinity: Option<Affinity>,
    pub tolerations: Vec<Toleration>,
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    pub host_ports: Vec<HostPort>,
    /// Effective requests: max(Σ containers + sidecars, each init container + sidecars before it) + overhead.
    pub requests: Resources,
    /// CPU and memory requests with containers that request none counted as 100m / 200 MiB (scoring only).
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
    /// Images of all containers and init containers, normalized (`:latest` added when untagged).
    pub images: Vec<String>,
    /// Number of containers and init containers (ImageLocality's cap).
    pub container_count: usize,
    pub deleting: bool,
    /// Succeeded or Failed: holds no resources.
    pub finished: bool,
    /// `preemptionPolicy: Never`: waits for room instead of preempting.
    pub never_preempts: bool,
    /// `status.nominatedNodeName`: the node a preemption freed for it.
    pub nominated_node: String,
    /// `status.startTime`, for ranking victims (upstream's `GetPodStartTime`).
    pub start_time: Option<k8s_openapi::jiff::Timestamp>,
    /// Being deleted by a preemption (the `DisruptionTarget` condition with reason
    /// `PreemptionByScheduler`, and a deletion timestamp).
    pub preempted: bool,
    /// The claims its volumes name (VolumeBinding): `persistentVolumeClaim` and generic ephemeral.
    pub claims: Vec<PodClaim>,
    /// Its in-tree network disks (VolumeRestrictions' disk conflicts).
    pub disks: Vec<Disk>,
}

/// An in-tree disk volume that two pods on one node may not both mount (upstream's
/// `isVolumeConflict`): the same GCE PD, iSCSI target or RBD image unless every mount is read-only,
/// the same EBS volume ever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disk {
    Gce { pd: String, read_only: bool },
    Ebs { id: String },
    Iscsi { iqn: String, read_only: bool },
    Rbd { monitors: Vec<String>, pool: String, image: String, read_only: bool },
}

impl Disk {
    fn of(v: &k8s_openapi::api::core::v1::Volume) -> Option<Disk> {
        if let Some(d) = &v.gce_persistent_disk {
            return Some(Disk::Gce { pd: d.pd_name.clone(), read_only: d.read_only.unwrap_or(false) });
        }
        if let Some(d) = &v.aws_elastic_block_store {
            return Some(Disk::Ebs { id: d.volume_id.clone() });
        }
        if let Some(d) = &v.iscsi {
            return Some(Disk::Iscsi { iqn: d.iqn.clone(), read_only: d.read_only.unwrap_or(false) });
        }
        v.rbd.as_ref().map(|d| Disk::Rbd {
            monitors: d.monitors.clone(),
            pool: d.pool.clone().unwrap_or_else(|| "rbd".into()),
            image: d.image.clone(),
            read_only: d.read_only.unwrap_or(false),
        })
    }

    /// Whether the two may not be mounted on one node at once.
    pub fn conflicts(&self, other: &Disk) -> bool {
        match (self, other) {
            (Disk::Gce { pd: a, read_only: ra }, Disk::Gce { pd: b, read_only: rb }) => a == b && !(*ra && *rb),
            (Disk::Ebs { id: a }, Disk::Ebs { id: b }) => a == b,
            (Disk::Iscsi { iqn: a, read_only: ra }, Disk::Iscsi { iqn: b, read_only: rb }) => a == b && !(*ra && *rb),
            (
                Disk::Rbd { monitors: ma, pool: pa, image: ia, read_only: ra },
                Disk::Rbd { monitors: mb, pool: pb, image: ib, read_only: rb },
            ) => ma.iter().any(|m| mb.contains(m)) && pa == pb && ia == ib && !(*ra && *rb),
            _ => false,
        }
    }
}

/// One claim a pod's volume names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodClaim {
    pub name: String,
    /// The claim of a generic ephemeral volume (`<pod>-<volume>`), which must be the pod's own.
    pub ephemeral: bool,
}

impl PodInfo {
    /// Extracts the scheduling facts from a pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let none = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&none);
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
        let (requests, non_zero_milli_cpu, non_zero_memory) = pod_requests(spec);
        let host_ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten().filter(|c| is_sidecar(c)))
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = p.host_port.filter(|p| *p > 0)?;
                Some(HostPort {
                    ip: p.host_ip.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port,
                })
            })
            .collect();
        let images: Vec<String> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.image.as_deref())
            .map(normalize_image)
            .collect();
        let pod_name = meta.name.clone().unwrap_or_default();
        let claims = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => Some(PodClaim { name: c.claim_name.clone(), ephemeral: false }),
                (None, Some(_)) => Some(PodClaim { name: format!("{pod_name}-{}", v.name), ephemeral: true }),
                _ => None,
            })
            .collect();
        let disks = spec.volumes.iter().flatten().filter_map(Disk::of).collect();
        PodInfo {
            claims,
            disks,
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            priority: spec.priority.unwrap_or(0),
            scheduler_name: spec.scheduler_name.clone().unwrap_or_else(|| "default-scheduler".into()),
            node_name: spec.node_name.clone().unwrap_or_default(),
            scheduling_gates: spec.scheduling_gates.iter().flatten().map(|g| g.name.clone()).collect(),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            topology_spread_constraints: spec.topology_spread_constraints.clone().unwrap_or_default(),
            host_ports,
            requests,
            non_zero_milli_cpu,
            non_zero_memory,
            container_count: images.len(),
            images,
            deleting: meta.deletion_timestamp.is_some(),
            finished: matches!(phase, "Succeeded" | "Failed"),
            never_preempts: spec.preemption_policy.as_deref() == Some("Never"),
            nominated_node: status.and_then(|s| s.nominated_node_name.clone()).unwrap_or_default(),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            preempted: meta.deletion_timestamp.is_some()
                && status.and_then(|s| s.conditions.as_ref()).into_iter().flatten().any(|c| {
                    c.type_ == DISRUPTION_TARGET
                        && c.status == "True"
                        && c.reason.as_deref() == Some(PREEMPTED_BY_SCHEDULER)
                }),
        }
    }

    /// `namespace/name`, as events and logs name the pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod has pod affinity or anti-affinity terms of any kind.
    pub fn has_pod_affinity(&self) -> bool {
        self.affinity.as_ref().is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
    }

    /// Whether the pod has required anti-affinity terms.
    pub fn has_required_anti_affinity(&self) -> bool {
        self.affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .is_some_and(|t| !t.is_empty())
    }

    /// The same pod, placed on `node`.
    pub fn on_node(&self, node: &str) -> Self {
        PodInfo { node_name: node.to_string(), ..self.clone() }
    }
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// upstream's `resourcehelper.PodRequests`, plus the non-zero CPU/memory sums used for scoring.
fn pod_requests(spec: &k8s_openapi::api::core::v1::PodSpec) -> (Resources, i64, i64) {
    let requests_of = |c: &Container| Resources::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let non_zero = |c: &Container| {
        let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |name: &str, default: i64, cpu: bool| match req.and_then(|r| r.get(name)) {
            Some(q) => {
                let milli = parse_quantity(&q.0).unwrap_or(0).clamp(0, i128::from(i64::MAX)) as i64;
                if cpu { milli } else { milli.saturating_add(999) / 1000 }
            }
            None => default,
        };
        (get("cpu", DEFAULT_MILLI_CPU_REQUEST, true), get("memory", DEFAULT_MEMORY_REQUEST, false))
    };

    let mut total = Resources::default();
    let (mut nz_cpu, mut nz_mem) = (0, 0);
    for c in &spec.containers {
        total.add(&requests_of(c));
        let (cpu, mem) = non_zero(c);
        nz_cpu += cpu;
        nz_mem += mem;
    }
    // Sidecars run beside everything started after them; a regular init container runs alone
    // beside the sidecars started before it.
    let mut sidecars = Resources::default();
    let (mut sidecar_cpu, mut sidecar_mem) = (0, 0);
    let mut init_peak = Resources::default();
    let (mut init_cpu, mut init_mem) = (0, 0);
    for c in spec.init_containers.iter().flatten() {
        let r = requests_of(c);
        let (cpu, mem) = non_zero(c);
        if is_sidecar(c) {
            total.add(&r);
            sidecars.add(&r);
            nz_cpu += cpu;
            nz_mem += mem;
            sidecar_cpu += cpu;
            sidecar_mem += mem;
        } else {
            let mut with_sidecars = r;
            with_sidecars.add(&sidecars);
            init_peak.max_with(&with_sidecars);
            init_cpu = init_cpu.max(cpu + sidecar_cpu);
            init_mem = init_mem.max(mem + sidecar_mem);
        }
    }
    total.max_with(&init_peak);
    nz_cpu = nz_cpu.max(init_cpu);
    nz_mem = nz_mem.max(init_mem);
    // Pod-level requests, where set, replace the container sums for the resources they name.
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        let p = Resources::from_list(Some(pod_level));
        if pod_level.contains_key("cpu") {
            total.milli_cpu = p.milli_cpu;
            nz_cpu = p.milli_cpu;
        }
        if pod_level.contains_key("memory") {
            total.memory = p.memory;
            nz_mem = p.memory;
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        let o = Resources::from_list(Some(overhead));
        total.add(&o);
        nz_cpu += o.milli_cpu;
        nz_mem += o.memory;
    }
    (total, nz_cpu, nz_mem)
}

/// Appends `:latest` to an image reference without a tag or digest, as upstream's ImageLocality does.
pub fn normalize_image(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') { image.to_string() } else { format!("{image}:latest") }
}

/// The facts about a node that scheduling depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Resources,
    /// Normalized image name → size in bytes.
    pub images: HashMap<String, i64>,
}

impl NodeFacts {
    pub fn from_node(node: &Node) -> Self {
        let spec = node.spec.clone().unwrap_or_default();
        let status = node.status.as_ref();
        let mut images = HashMap::new();
        for img in status.and_then(|s| s.images.as_ref()).into_iter().flatten() {
            for name in img.names.iter().flatten() {
                images.insert(normalize_image(name), img.size_bytes.unwrap_or(0));
            }
        }
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable: Resources::from_list(status.and_then(|s| s.allocatable.as_ref())),
            images,
        }
    }
}

/// A node with the pods on it (bound or assumed) and what they use.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    pub node: NodeFacts,
    pub pods: Vec<Arc<PodInfo>>,
    /// Number of pods in `pods` with pod affinity or anti-affinity terms.
    pub pods_with_affinity: usize,
    /// Number of pods in `pods` with required anti-affinity terms.
    pub pods_with_required_anti_affinity: usize,
    /// Sum of the pods' actual requests.
    pub requested: Resources,
    /// Sum of the pods' CPU/memory requests, counting 100m / 200 MiB for containers that request none.
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
    pub used_ports: Vec<HostPort>,
}

impl NodeInfo {
    pub fn new(node: NodeFacts) -> Self {
        NodeInfo { node, ..Default::default() }
    }

    pub fn name(&self) -> &str {
        &self.node.name
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.non_zero_milli_cpu += pod.non_zero_milli_cpu;
        self.non_zero_memory += pod.non_zero_memory;
        self.used_ports.extend(pod.host_ports.iter().cloned());
        self.pods_with_affinity += usize::from(pod.has_pod_affinity());
        self.pods_with_required_anti_affinity += usize::from(pod.has_required_anti_affinity());
        self.pods.push(pod);
    }

    /// Removes the pod with `uid`; false if it is not here.
    pub fn remove_pod(&mut self, uid: &str) -> bool {
        let Some(i) = self.pods.iter().position(|p| p.uid == uid) else { return false };
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.non_zero_milli_cpu -= pod.non_zero_milli_cpu;
        self.non_zero_memory -= pod.non_zero_memory;
        for hp in &pod.host_ports {
            if let Some(j) = self.used_ports.iter().position(|u| u == hp) {
                self.used_ports.swap_remove(j);
            }
        }
        self.pods_with_affinity -= usize::from(pod.has_pod_affinity());
        self.pods_with_required_anti_affinity -= usize::from(pod.has_required_anti_affinity());
        true
    }
}

#[cfg(test)]
impl PodInfo {
    /// A pod's facts from its JSON (tests).
    pub fn from_json(v: serde_json::Value) -> Self {
        PodInfo::from_pod(&serde_json::from_value(v).expect("a valid pod"))
    }
}

#[cfg(test)]
impl NodeInfo {
    /// An empty node from its JSON (tests).
    pub fn from_json(v: serde_json::Value) -> Self {
        NodeInfo::new(NodeFacts::from_node(&serde_json::from_value(v).expect("a valid node")))
    }
}

pub use crate::labels::selector_matches as label_selector_matches;

/// [`crate::scheduling::node_term_matches`] for a node's facts.
pub fn node_term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    crate::scheduling::node_term_matches(term, &node.labels, &node.name)
}

pub use crate::scheduling::{tolerates, toleration_matches};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodInfo {
        PodInfo::from_json(v)
    }

    #[test]
    fn requests_follow_init_and_sidecar_rules() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m", "nvidia.com/gpu": "1"}}}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "10Mi"}}}],
            "overhead": {"cpu": "10m"}}}));
        // containers 300m + sidecar 50m = 350m; init 2000m + sidecar 50m = 2050m wins; + 10m overhead.
        assert_eq!(p.requests.milli_cpu, 2060);
        assert_eq!(p.requests.memory, 1 << 30);
        assert_eq!(p.requests.scalar["nvidia.com/gpu"], 1);
        // b and side have no memory request: 200 MiB each for scoring.
        assert_eq!(p.non_zero_memory, (1 << 30) + 2 * DEFAULT_MEMORY_REQUEST);
        assert_eq!(p.non_zero_milli_cpu, 2060);
    }

    #[test]
    fn best_effort_pod_counts_defaults_for_scoring_only() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "busybox"}]}}));
        assert!(p.requests.is_zero());
        assert_eq!((p.non_zero_milli_cpu, p.non_zero_memory), (100, DEFAULT_MEMORY_REQUEST));
        assert_eq!(p.images, vec!["busybox:latest"]);
    }

    #[test]
    fn image_normalization() {
        assert_eq!(normalize_image("busybox"), "busybox:latest");
        assert_eq!(normalize_image("localhost:5000/busybox"), "localhost:5000/busybox:latest");
        assert_eq!(normalize_image("busybox:1.36"), "busybox:1.36");
        assert_eq!(normalize_image("busybox@sha256:abc"), "busybox@sha256:abc");
    }
}
